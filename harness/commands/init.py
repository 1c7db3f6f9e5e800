"""`harness init`: its options; the work is harness.github.adopt's."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--uses", required=True, metavar="OWNER/NAME@SHA",
                        help="the harness repository whose reusable gpu-tests.yml the callers use, at a full "
                             "40-character commit sha (a tag or branch can be moved to other code: refused)")
    parser.add_argument("--harness", metavar="REQUIREMENT",
                        help="what the workflows pip-install as harness (default "
                             "git+https://github.com/OWNER/NAME@SHA)")
    parser.add_argument("--force", action="store_true", help="overwrite files that exist")


def command(args: argparse.Namespace) -> int:
    from harness.github import adopt

    return adopt.command(args)
