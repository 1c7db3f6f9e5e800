"""`harness run`: its options and exit statuses; the work is harness.run.command's."""

from __future__ import annotations

import argparse

from harness.commands.parsers import exit_statuses_epilog
from harness.errors import run_exit_statuses
from harness.project import DEFAULT_RESULTS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = exit_statuses_epilog(run_exit_statuses())
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--matrix", metavar="NAME_OR_PATH",
                        help="matrix to run (default: the embedded default for this machine)")
    parser.add_argument("--cell", action="append", metavar="GLOB", help="keep only matching cells; repeatable")
    parser.add_argument("--job", metavar="ID",
                        help="only the cells of this job of `harness matrix --format github` (a pack's id, or a "
                             "cell's)")
    parser.add_argument("--in-pack", action="store_true",
                        help="(what harness run starts for each cell of a pack) one of several cells running at "
                             "once: the results folder's other cells are its neighbours', left alone")
    parser.add_argument("--results", default=DEFAULT_RESULTS, metavar="DIR",
                        help=f"where cell folders go; relative to the project root (default {DEFAULT_RESULTS})")
    parser.add_argument("--env-dir", metavar="DIR",
                        help="cache of per-cell environments (default $HARNESS_ENV_DIR or ~/.cache/harness/envs)")
    parser.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    parser.add_argument("--reruns", type=int, metavar="N",
                        help="rerun failed tests N times (pytest-rerunfailures), instead of the matrix's reruns")
    parser.add_argument("--force", action="store_true",
                        help="run cells this machine does not match (wrong GPU type or too few GPUs)")
    parser.add_argument("--serial-tests", action="store_true",
                        help="run a cell's tests one after another (by default a cell on one host runs several at "
                             "once on disjoint GPUs or cores where more than one fits)")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, metavar="-- PYTEST_ARGS",
                        help="extra arguments for pytest, after --")


def command(args: argparse.Namespace) -> int:
    from harness.run import command as run

    if args.pytest_args and args.pytest_args[0] == "--":
        args.pytest_args = args.pytest_args[1:]
    return run.command(args)
