"""What the commands' parsers share: `--debug` after any (sub)command, nested subcommands, an exit-status epilog."""

from __future__ import annotations

import argparse
import textwrap
from typing import Any


def debug_option() -> argparse.ArgumentParser:
    """A parent that accepts --debug after a (sub)command; SUPPRESS keeps a subcommand from resetting it."""
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return debug


class Subcommands:
    """A parser's subcommands, each added with --debug (debug_option), so options work after the subcommand."""

    def __init__(self, parser: argparse.ArgumentParser, dest: str, metavar: str, **kwargs: Any) -> None:
        self.action = parser.add_subparsers(dest=dest, required=True, metavar=metavar, **kwargs)

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs["parents"] = [*kwargs.get("parents", ()), debug_option()]
        return self.action.add_parser(name, **kwargs)


def exit_statuses_epilog(statuses: list[tuple[str, str]]) -> str:
    """A command's exit statuses as its --help ends with them, each meaning wrapped beside its status."""
    width = max(len(status) for status, _ in statuses) + 2
    lines = ["exit status:"]
    for status, meaning in statuses:
        lines += textwrap.wrap(meaning, width=78, initial_indent=f"  {status:<{width}}",
                               subsequent_indent=" " * (2 + width), break_on_hyphens=False)
    return "\n".join(lines)
