"""`harness matrix`: its options; the work is harness.plan.command's, with the engines' settings checks."""

from __future__ import annotations

import argparse

FORMATS = ("ids", "json", "github")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--matrix", metavar="NAME_OR_PATH",
                        help="a name under matrices/ (the repository's own, else shipped) or a path to a YAML file")
    parser.add_argument("--list", action="store_true",
                        help="list the named matrices, where each comes from and which it overrides")
    parser.add_argument("--format", choices=FORMATS, default="ids",
                        help="ids: one cell id a line; json: the cells; github: {'include': [...]}")
    parser.add_argument("--cell", action="append", metavar="GLOB",
                        help="keep only cells whose id matches (fnmatch, braces); repeatable")
    parser.add_argument("--pull-request", action="store_true",
                        help="the plan runs a pull request's code: refuse cells on runners not declared ephemeral")
    parser.add_argument("--check", action="store_true",
                        help="refuse (exit 2) when the package index cannot be asked; every pinned torch and "
                             "transformers version is checked there with or without it, and without it an index out "
                             "of reach is one warning line on stderr")


def command(args: argparse.Namespace) -> int:
    from harness.engines import check_settings
    from harness.plan import command as matrix

    # The plan knows no engine: the command line hands it the engines' reading of each cell's `submit:`.
    return matrix.command(args, check_settings)
