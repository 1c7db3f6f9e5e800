"""`harness report`: its options; the work is harness.report.render's."""

from __future__ import annotations

import argparse

from harness.project import DEFAULT_RESULTS

FORMATS = ("pr-comment", "summary", "terminal", "html")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="*", metavar="RESULTS",
                        help="cell folders, or folders holding them; relative to the project root, as run's "
                             "--results, unless a folder of that name is in the working directory "
                             f"(default {DEFAULT_RESULTS}, where harness run writes them)")
    parser.add_argument("--baseline", metavar="RESULTS_OR_DIGEST",
                        help="previous results folder, or a file holding a previous comment's digest")
    parser.add_argument("--format", choices=FORMATS,
                        help="default: from -o's extension (.html, .txt), else terminal")
    parser.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    parser.add_argument("--sha", help="commit the results belong to (shown in the verdict line)")
    parser.add_argument("--matrix", dest="matrix_name", help="matrix name shown in the verdict line")
    parser.add_argument("--classify-against", metavar="RESULTS",
                        help="main's last nightly results: each red is new, already red there, flaky, a known "
                             "upstream bug or infrastructure (nightly triage's rules)")
    parser.add_argument("--links", metavar="FILE",
                        help="`harness gh run-links` output: each cell's job, artifact and wait (the run's own "
                             "link comes from GITHUB_SERVER_URL, GITHUB_REPOSITORY and GITHUB_RUN_ID)")


def command(args: argparse.Namespace) -> int:
    from harness.report import render

    return render.command(args)
