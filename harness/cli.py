"""The `harness` command line: one subparser per row of the command table (harness.commands), dispatch by lookup.

Only the chosen command's module is imported: a command's parser gets its arguments (the module's
`add_arguments`) when argparse first parses with it, and `harness --help` needs the table's summaries alone."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from typing import Any

from harness import __version__
from harness.commands import COMMANDS
from harness.commands.parsers import Subcommands
from harness.errors import FatalError


class _CommandParser(argparse.ArgumentParser):
    """A command's parser that imports its module and adds the module's arguments when first used."""

    def __init__(self, *args: Any, module: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.module = module  # None once its arguments are added (or for a nested subcommand's parser)

    def add_command_arguments(self) -> None:
        module, self.module = self.module, None
        if module is not None:
            importlib.import_module(module).add_arguments(self)

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
        self.add_command_arguments()
        return super().parse_known_args(*args, **kwargs)

    def format_usage(self) -> str:
        self.add_command_arguments()
        return super().format_usage()

    def format_help(self) -> str:
        self.add_command_arguments()
        return super().format_help()


def build_parser(lazy: bool = False) -> argparse.ArgumentParser:
    """harness's parser. Every command's arguments are added now (docs/gen_reference.py reads them), or with
    `lazy` each command's when it is chosen (main), so that only its module is imported."""
    parser = argparse.ArgumentParser(
        prog="harness",
        description="Multi-GPU regression harness: EP and FSDP2 load and gradient tests per matrix cell.",
    )
    parser.add_argument("--version", action="version", version=f"harness {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for fatal errors")
    # --debug is accepted after any subcommand too (Subcommands gives each one a suppressed copy).
    commands = Subcommands(parser, dest="command", metavar="COMMAND", parser_class=_CommandParser)
    for name, (module, summary) in COMMANDS.items():
        command_parser = commands.add_parser(name, help=summary, module=module)
        if not lazy:
            assert isinstance(command_parser, _CommandParser)
            command_parser.add_command_arguments()
    return parser


def dispatch(args: argparse.Namespace) -> int:
    """The chosen command's `command(args)`; its module was imported when its arguments were parsed."""
    return importlib.import_module(COMMANDS[args.command].module).command(args)


def report_fatal(error: FatalError) -> None:
    message = str(error).replace("\n", " ")
    if os.environ.get("GITHUB_ACTIONS") == "true":
        print(f"::error::{message}", file=sys.stderr)
    else:
        print(f"harness: error: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser(lazy=True).parse_args(argv)
    try:
        return dispatch(args)
    except FatalError as error:
        if args.debug:
            traceback.print_exc()
        report_fatal(error)
        return error.return_code
    except KeyboardInterrupt:
        print("harness: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`harness matrix ... | head`): nothing more to say to it. Point stdout at
        # /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
