"""`harness bisect`: its options; the work is harness.bisect.command's."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--matrix", metavar="NAME_OR_PATH", help="matrix of the cell shape (default: this machine's)")
    parser.add_argument("--cell", action="append", metavar="GLOB", help="the cell shape to run on; repeatable")
    parser.add_argument("--package", metavar="NAME", help="torch or transformers (any package with --repo)")
    parser.add_argument("--good", required=True, metavar="V",
                        help="version (or ref with --repo) where the tests pass; torch=V,transformers=V for both")
    parser.add_argument("--bad", required=True, metavar="V", help="version (or ref) where they fail")
    parser.add_argument("--runs", type=int, default=1, metavar="N",
                        help="run each probe N times; differing outcomes make the version flaky")
    parser.add_argument("--pre", action="store_true", help="include pre-releases between good and bad")
    parser.add_argument("--repo", metavar="PATH", help="a local git checkout of the package: search its commits")
    parser.add_argument("--json", metavar="FILE", help="also write the probes and the answer as JSON")
    parser.add_argument("--results", default="results/bisect", metavar="DIR", help="where probe folders go")
    parser.add_argument("--env-dir", metavar="DIR",
                        help="cache of per-cell environments (default $HARNESS_ENV_DIR or ~/.cache/harness/envs)")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, metavar="-- PYTEST_ARGS",
                        help="which tests, after --: -k EXPR or test ids")


def command(args: argparse.Namespace) -> int:
    from harness.bisect import command as bisect

    return bisect.command(args)
