"""The command table: each `harness` command's name, the module that owns it, and its one-line summary.

A command's module (harness/commands/<name>.py) owns its options, `add_arguments(parser)`, and
`command(args) -> int`, which imports the stage that does the work and hands it the parsed arguments (so
parsing, and a command's --help, import no stage). harness.cli makes one subparser per row, in this order
(`harness --help` lists them so), and imports only the chosen command's module. A new command is a module
here and a row below; command modules import neither harness.cli nor one another (import-linter contracts
in pyproject.toml). Imported by the `harness` process only."""

from __future__ import annotations

from typing import NamedTuple


class Command(NamedTuple):
    module: str  # imported only when the command runs (or docs/gen_reference.py renders every command)
    summary: str  # the command's line in `harness --help`


COMMANDS: dict[str, Command] = {
    "matrix": Command("harness.commands.matrix", "expand a matrix into cells and print them"),
    "run": Command("harness.commands.run", "run the suite for each selected cell that fits this machine"),
    "host": Command("harness.commands.host", "(started by an engine on every host of a cell) run host 0's "
                    "pytest, or this host's agent"),
    "report": Command("harness.commands.report",
                      "render results folders as a PR comment, summary, table or HTML"),
    "init": Command("harness.commands.init",
                    "write a starter matrices/ and the workflow callers into this repository"),
    "bisect": Command("harness.commands.bisect", "find the release (or commit) of torch or transformers that "
                      "broke (or fixed) a selection of tests"),
    "env": Command("harness.commands.env", "list or clean the cached per-cell environments"),
    "triage": Command("harness.commands.triage", "classify tonight's new reds and plan bisects of the real ones"),
    "known-bugs": Command("harness.commands.known_bugs", "the suite's known upstream bugs: keep each entry's "
                          "newest release seen up to date from results"),
    "repro": Command("harness.commands.repro", "write a standalone script (torch and transformers only) that "
                     "reproduces one suite case's failure, for an upstream issue"),
    "history": Command("harness.commands.history", "the nightly's history database (SQLite): append a night"),
    "trend": Command("harness.commands.trend", "render the history's trends as HTML (a plot per test, "
                     "regressions first) and the regressions as JSON"),
    "gh": Command("harness.commands.gh", "GitHub glue: authorize '/ok to test', post the comment and issue"),
}
