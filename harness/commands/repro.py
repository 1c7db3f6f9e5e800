"""`harness repro`: its options; the work is harness.upstream.repro's."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("test_id", metavar="TEST_ID",
                        help="the case's pytest id, e.g. 'tests/gpu/test_training.py::test_training_steps[...]'")
    parser.add_argument("-o", "--output", metavar="FILE", help="where the script goes (default: stdout)")


def command(args: argparse.Namespace) -> int:
    from harness.upstream import repro

    return repro.command(args)
