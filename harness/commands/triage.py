"""`harness triage`: its options; the work is harness.report.triage_view's."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", required=True, metavar="DIR", help="tonight's cell folders")
    parser.add_argument("--baseline", metavar="DIR", help="the previous night's cell folders, if any")
    parser.add_argument("--bisects", metavar="DIR", help="bisect jobs' --json files, to add their answers")
    parser.add_argument("-o", "--output", metavar="FILE", help="write every red and the bisect plan as JSON")
    parser.add_argument("--github-matrix", metavar="FILE",
                        help="write the bisect plan as the {'include': [...]} object strategy.matrix takes")


def command(args: argparse.Namespace) -> int:
    from harness.report import triage_view

    return triage_view.command(args)
