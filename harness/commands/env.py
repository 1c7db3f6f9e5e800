"""`harness env list|clean`: their options; the work is harness.envs.cache's."""

from __future__ import annotations

import argparse

from harness.commands.parsers import Subcommands


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = Subcommands(parser, dest="env_command", metavar="ENV_COMMAND")
    in_cache = argparse.ArgumentParser(add_help=False)
    in_cache.add_argument("--env-dir", metavar="DIR",
                          help="the cache (default $HARNESS_ENV_DIR or ~/.cache/harness/envs)")
    commands.add_parser("list", parents=[in_cache], help="each environment: kind, size, versions, last use")
    clean = commands.add_parser("clean", parents=[in_cache],
                                help="remove interrupted builds, and environments unused for --unused-days "
                                     "(only folders harness marked; refuses a folder holding anything else)")
    clean.add_argument("--unused-days", type=float, default=30.0, metavar="N",
                       help="also remove environments no cell used for N days (default 30)")
    clean.add_argument("--all", action="store_true", help="remove every environment (bisect's: with --include-bisect)")
    clean.add_argument("--include-bisect", action="store_true",
                       help="also clean `bisect --repo` commit environments (kept otherwise)")
    clean.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")


def command(args: argparse.Namespace) -> int:
    from harness.envs import cache

    return cache.command(args)
