"""`harness trend`: its options; the work is harness.report.trend_page's."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", required=True, metavar="FILE", help="the history database")
    parser.add_argument("--html", required=True, metavar="OUT.html")
    parser.add_argument("--nights", type=int, default=30, metavar="N", help="nights to plot (default 30)")
    parser.add_argument("--json", metavar="OUT.json",
                        help="also write the regressions as JSON (for the nightly issue)")


def command(args: argparse.Namespace) -> int:
    from harness.report import trend_page

    return trend_page.command(args)
