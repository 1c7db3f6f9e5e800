"""`harness history append`: its options; the work is harness.history.command's."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.commands.parsers import Subcommands


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = Subcommands(parser, dest="history_command", metavar="HISTORY_COMMAND")
    append = commands.add_parser("append", help="append results folders to the history as one night "
                                                "(again for the same night: its rows are replaced)")
    append.add_argument("--db", required=True, metavar="FILE", help="the history database (created if missing)")
    append.add_argument("--night", required=True, metavar="ID", help="the night's id, e.g. the workflow run id")
    append.add_argument("--date", metavar="ISO", help="when the night ran, ISO 8601 (default now, UTC)")
    append.add_argument("--renamed", type=Path, metavar="FILE",
                        help="a YAML mapping of renamed test files, old path to new: earlier nights' tests "
                             "follow their new names (their trends go on)")
    append.add_argument("results", nargs="+", metavar="RESULTS_DIR", help="cell folders, or folders holding them")


def command(args: argparse.Namespace) -> int:
    from harness.history import command as history

    return history.command(args)
