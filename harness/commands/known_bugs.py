"""`harness known-bugs verify`: its options; the work is harness.upstream.verify's."""

from __future__ import annotations

import argparse

from harness.commands.parsers import Subcommands


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = Subcommands(parser, dest="known_bugs_command", metavar="KNOWN_BUGS_COMMAND")
    verify_parser = commands.add_parser("verify", help="rewrite the table's verified releases from the cases that "
                                                       "matched an entry in these results; list the fixed ones")
    verify_parser.add_argument("--table", metavar="FILE",
                               help="the verified-releases file (default "
                                    "tests/gpu/upstream/known_bugs_verified.json of the project)")
    verify_parser.add_argument("--dry-run", action="store_true", help="say what would change, write nothing")
    verify_parser.add_argument("results", nargs="+", metavar="RESULTS_DIR",
                               help="cell folders, or folders holding them")


def command(args: argparse.Namespace) -> int:
    from harness.upstream import verify

    return verify.command(args)
