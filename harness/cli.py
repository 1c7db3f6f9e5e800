"""Argument parsing and dispatch only; each subcommand's work lives in its stage module."""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import traceback

from harness import __version__
from harness.errors import FatalError, run_exit_statuses
from harness.project import DEFAULT_RESULTS

FORMATS_MATRIX = ("ids", "json", "github")
FORMATS_REPORT = ("pr-comment", "summary", "terminal", "html")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="harness",
        description="Multi-GPU regression harness: EP and FSDP2 load and gradient tests per matrix cell.",
    )
    parser.add_argument("--version", action="version", version=f"harness {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for fatal errors")
    # --debug is accepted after any subcommand too; SUPPRESS keeps a subcommand from resetting it.
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    commands = _Subcommands(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"), debug)

    matrix = commands.add_parser("matrix", help="expand a matrix into cells and print them")
    matrix.add_argument("--matrix", metavar="NAME_OR_PATH",
                        help="a name under matrices/ (the repository's own, else shipped) or a path to a YAML file")
    matrix.add_argument("--list", action="store_true",
                        help="list the named matrices, where each comes from and which it overrides")
    matrix.add_argument("--format", choices=FORMATS_MATRIX, default="ids",
                        help="ids: one cell id a line; json: the cells; github: {'include': [...]}")
    matrix.add_argument("--cell", action="append", metavar="GLOB",
                        help="keep only cells whose id matches (fnmatch, braces); repeatable")
    matrix.add_argument("--pull-request", action="store_true",
                        help="the plan runs a pull request's code: refuse cells on runners not declared ephemeral")
    matrix.add_argument("--check", action="store_true",
                        help="also check that every pinned torch and transformers version is on the package index")

    run = commands.add_parser("run", help="run the suite for each selected cell that fits this machine",
                              epilog=exit_statuses_epilog(run_exit_statuses()),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--matrix", metavar="NAME_OR_PATH",
                     help="matrix to run (default: the embedded default for this machine)")
    run.add_argument("--cell", action="append", metavar="GLOB", help="keep only matching cells; repeatable")
    run.add_argument("--job", metavar="ID",
                     help="only the cells of this job of `harness matrix --format github` (a pack's id, or a cell's)")
    run.add_argument("--in-pack", action="store_true",
                     help="(what harness run starts for each cell of a pack) one of several cells running at once: "
                          "the results folder's other cells are its neighbours', left alone")
    run.add_argument("--results", default=DEFAULT_RESULTS, metavar="DIR",
                     help=f"where cell folders go; relative to the project root (default {DEFAULT_RESULTS})")
    run.add_argument("--env-dir", metavar="DIR",
                     help="cache of per-cell environments (default $HARNESS_ENV_DIR or ~/.cache/harness/envs)")
    run.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    run.add_argument("--reruns", type=int, metavar="N",
                     help="rerun failed tests N times (pytest-rerunfailures), instead of the matrix's reruns")
    run.add_argument("--force", action="store_true",
                     help="run cells this machine does not match (wrong GPU type or too few GPUs)")
    run.add_argument("pytest_args", nargs=argparse.REMAINDER, metavar="-- PYTEST_ARGS",
                     help="extra arguments for pytest, after --")

    host = commands.add_parser("host", help="(started by an engine on every host of a cell) run host 0's pytest, "
                               "or this host's agent")
    host.add_argument("--index", type=int, metavar="I", help="this host's index (default $SLURM_NODEID)")
    host.add_argument("--count", type=int, metavar="H", help="hosts of the cell (default $SLURM_NNODES)")
    host.add_argument("--host0", metavar="NAME", help="host 0's name (default: the first of the Slurm job's nodes)")
    host.add_argument("--hub-port", type=int, required=True, metavar="PORT", help="host 0's hub listens here")
    host.add_argument("--credentials", metavar="FILE",
                      help="the cell's TLS key and certificate (PEM), written by the engine for this cell alone")
    host.add_argument("--ranks-per-host", type=int, required=True, metavar="G")
    host.add_argument("--cpu-ranks", action="store_true", help="CPU ranks (gloo): host 0 sets HARNESS_CPU_RANKS")
    host.add_argument("--cause-file", metavar="FILE", help="host 0 writes the first lost host here")
    host.add_argument("--pytest-log", metavar="FILE", help="host 0 copies pytest's output here")
    host.add_argument("--cwd", metavar="DIR", help="host 0 runs pytest here")
    host.add_argument("--memory-file", metavar="FILE",
                      help="sample this host's GPUs (NVML) into this memory.json ({index}: the host's index)")
    host.add_argument("host_command", nargs=argparse.REMAINDER, metavar="-- PYTEST_COMMAND")

    report = commands.add_parser("report", help="render results folders as a PR comment, summary, table or HTML")
    report.add_argument("results", nargs="*", metavar="RESULTS",
                        help="cell folders, or folders holding them; relative to the project root, as run's "
                             "--results, unless a folder of that name is in the working directory "
                             f"(default {DEFAULT_RESULTS}, where harness run writes them)")
    report.add_argument("--baseline", metavar="RESULTS_OR_DIGEST",
                        help="previous results folder, or a file holding a previous comment's digest")
    report.add_argument("--format", choices=FORMATS_REPORT,
                        help="default: from -o's extension (.html, .txt), else terminal")
    report.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    report.add_argument("--sha", help="commit the results belong to (shown in the verdict line)")
    report.add_argument("--matrix", dest="matrix_name", help="matrix name shown in the verdict line")
    report.add_argument("--classify-against", metavar="RESULTS",
                        help="main's last nightly results: each red is new, already red there, flaky, a known "
                             "upstream bug or infrastructure (nightly triage's rules)")
    report.add_argument("--links", metavar="FILE",
                        help="`harness gh run-links` output: each cell's job, artifact and wait (the run's own "
                             "link comes from GITHUB_SERVER_URL, GITHUB_REPOSITORY and GITHUB_RUN_ID)")

    init = commands.add_parser("init", help="write a starter matrices/ and the workflow callers into this repository")
    init.add_argument("--uses", required=True, metavar="OWNER/NAME@SHA",
                      help="the harness repository whose reusable gpu-tests.yml the callers use, at a full "
                           "40-character commit sha (a tag or branch can be moved to other code: refused)")
    init.add_argument("--harness", metavar="REQUIREMENT",
                      help="what the workflows pip-install as harness (default git+https://github.com/OWNER/NAME@SHA)")
    init.add_argument("--force", action="store_true", help="overwrite files that exist")

    bisect = commands.add_parser("bisect", help="find the release (or commit) of torch or transformers that "
                                 "broke (or fixed) a selection of tests")
    bisect.add_argument("--matrix", metavar="NAME_OR_PATH", help="matrix of the cell shape (default: this machine's)")
    bisect.add_argument("--cell", action="append", metavar="GLOB", help="the cell shape to run on; repeatable")
    bisect.add_argument("--package", metavar="NAME", help="torch or transformers (any package with --repo)")
    bisect.add_argument("--good", required=True, metavar="V",
                        help="version (or ref with --repo) where the tests pass; torch=V,transformers=V for both")
    bisect.add_argument("--bad", required=True, metavar="V", help="version (or ref) where they fail")
    bisect.add_argument("--runs", type=int, default=1, metavar="N",
                        help="run each probe N times; differing outcomes make the version flaky")
    bisect.add_argument("--pre", action="store_true", help="include pre-releases between good and bad")
    bisect.add_argument("--repo", metavar="PATH", help="a local git checkout of the package: search its commits")
    bisect.add_argument("--json", metavar="FILE", help="also write the probes and the answer as JSON")
    bisect.add_argument("--results", default="results/bisect", metavar="DIR", help="where probe folders go")
    bisect.add_argument("--env-dir", metavar="DIR",
                        help="cache of per-cell environments (default $HARNESS_ENV_DIR or ~/.cache/harness/envs)")
    bisect.add_argument("pytest_args", nargs=argparse.REMAINDER, metavar="-- PYTEST_ARGS",
                        help="which tests, after --: -k EXPR or test ids")

    env = commands.add_parser("env", help="list or clean the cached per-cell environments")
    env_commands = _Subcommands(env.add_subparsers(dest="env_command", required=True, metavar="ENV_COMMAND"), debug)
    in_cache = argparse.ArgumentParser(add_help=False)
    in_cache.add_argument("--env-dir", metavar="DIR",
                          help="the cache (default $HARNESS_ENV_DIR or ~/.cache/harness/envs)")
    env_commands.add_parser("list", parents=[in_cache], help="each environment: kind, size, versions, last use")
    clean = env_commands.add_parser("clean", parents=[in_cache],
                                    help="remove interrupted builds, and environments unused for --unused-days "
                                         "(only folders harness marked; refuses a folder holding anything else)")
    clean.add_argument("--unused-days", type=float, default=30.0, metavar="N",
                       help="also remove environments no cell used for N days (default 30)")
    clean.add_argument("--all", action="store_true", help="remove every environment (bisect's: with --include-bisect)")
    clean.add_argument("--include-bisect", action="store_true",
                       help="also clean `bisect --repo` commit environments (kept otherwise)")
    clean.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")

    triage = commands.add_parser("triage", help="classify tonight's new reds and plan bisects of the real ones")
    triage.add_argument("--results", required=True, metavar="DIR", help="tonight's cell folders")
    triage.add_argument("--baseline", metavar="DIR", help="the previous night's cell folders, if any")
    triage.add_argument("--bisects", metavar="DIR", help="bisect jobs' --json files, to add their answers")
    triage.add_argument("-o", "--output", metavar="FILE", help="write every red and the bisect plan as JSON")
    triage.add_argument("--github-matrix", metavar="FILE",
                        help="write the bisect plan as the {'include': [...]} object strategy.matrix takes")

    known = commands.add_parser("known-bugs", help="the suite's known upstream bugs: keep each entry's newest "
                                "release seen up to date from results")
    known_commands = _Subcommands(known.add_subparsers(dest="known_bugs_command", required=True,
                                                       metavar="KNOWN_BUGS_COMMAND"), debug)
    verify = known_commands.add_parser("verify", help="rewrite the table's verified releases from the cases that "
                                                      "matched an entry in these results; list the fixed ones")
    verify.add_argument("--table", metavar="FILE",
                        help="the verified-releases file (default tests/gpu/known_bugs_verified.json of the project)")
    verify.add_argument("--dry-run", action="store_true", help="say what would change, write nothing")
    verify.add_argument("results", nargs="+", metavar="RESULTS_DIR", help="cell folders, or folders holding them")

    repro = commands.add_parser("repro", help="write a standalone script (torch and transformers only) that "
                                "reproduces one suite case's failure, for an upstream issue")
    repro.add_argument("test_id", metavar="TEST_ID",
                       help="the case's pytest id, e.g. 'tests/gpu/test_training.py::test_training_steps[...]'")
    repro.add_argument("-o", "--output", metavar="FILE", help="where the script goes (default: stdout)")

    history = commands.add_parser("history", help="the nightly's history database (SQLite): append a night")
    history_commands = _Subcommands(history.add_subparsers(dest="history_command", required=True,
                                                           metavar="HISTORY_COMMAND"), debug)
    append = history_commands.add_parser("append", help="append results folders to the history as one night "
                                                        "(again for the same night: its rows are replaced)")
    append.add_argument("--db", required=True, metavar="FILE", help="the history database (created if missing)")
    append.add_argument("--night", required=True, metavar="ID", help="the night's id, e.g. the workflow run id")
    append.add_argument("--date", metavar="ISO", help="when the night ran, ISO 8601 (default now, UTC)")
    append.add_argument("results", nargs="+", metavar="RESULTS_DIR", help="cell folders, or folders holding them")

    trend = commands.add_parser("trend", help="render the history's trends as HTML (a plot per test, regressions "
                                "first) and the regressions as JSON")
    trend.add_argument("--db", required=True, metavar="FILE", help="the history database")
    trend.add_argument("--html", required=True, metavar="OUT.html")
    trend.add_argument("--nights", type=int, default=30, metavar="N", help="nights to plot (default 30)")
    trend.add_argument("--json", metavar="OUT.json", help="also write the regressions as JSON (for the nightly issue)")

    gh = commands.add_parser("gh", help="GitHub glue: authorize '/ok to test', post the comment and issue")
    gh_commands = _Subcommands(gh.add_subparsers(dest="gh_command", required=True, metavar="GH_COMMAND"), debug)
    # Every gh command talks to one repository: GITHUB_REPOSITORY unless --repo says otherwise.
    on_repo = argparse.ArgumentParser(add_help=False)
    on_repo.add_argument("--repo", metavar="OWNER/NAME", help="repository (default $GITHUB_REPOSITORY)")
    on_repo.add_argument("--author", default="github-actions[bot]", metavar="LOGIN",
                         help="who the token posts as; only comments and issues by LOGIN are edited")

    authorize = gh_commands.add_parser("authorize", parents=[on_repo],
                                       help="decide whether an issue_comment may start GPU jobs")
    authorize.add_argument("--event", required=True, metavar="PATH", help="the webhook event file")
    authorize.add_argument("--matrix", default="pr", help="matrix an accepted request runs")
    authorize.add_argument("--reason-file", metavar="FILE", help="a refusal's reason goes here")

    comment = gh_commands.add_parser("comment", parents=[on_repo],
                                     help="create or edit the one harness comment on a PR")
    comment.add_argument("--pr", required=True, type=int)
    comment.add_argument("--body", required=True, metavar="FILE")

    previous = gh_commands.add_parser("previous-comment", parents=[on_repo],
                                      help="save the PR's harness comment (its digest is the next baseline)")
    previous.add_argument("--pr", required=True, type=int)
    previous.add_argument("-o", "--output", required=True, metavar="FILE", help="written only if one exists")

    reply = gh_commands.add_parser("reply", parents=[on_repo],
                                   help="answer an '/ok to test' comment that was refused, once")
    reply.add_argument("--event", required=True, metavar="PATH", help="the webhook event file")
    reply.add_argument("--body", required=True, metavar="FILE", help="the reason, as authorize wrote it")

    react = gh_commands.add_parser("react", parents=[on_repo], help="react to the event's comment")
    react.add_argument("--event", required=True, metavar="PATH", help="the webhook event file")
    react.add_argument("--content", default="rocket", help="reaction (default rocket)")

    previous_run = gh_commands.add_parser("previous-run", parents=[on_repo],
                                          help="find the last finished run of a workflow that kept results")
    previous_run.add_argument("--workflow", required=True, metavar="FILE", help="e.g. nightly.yml")
    previous_run.add_argument("--branch", help="default: the repository's default branch")
    previous_run.add_argument("--artifact-prefix", default="results-", metavar="PREFIX")

    run_links = gh_commands.add_parser("run-links", parents=[on_repo],
                                       help="write this run's cell jobs, their times and artifacts for "
                                            "`report --links`")
    run_links.add_argument("-o", "--output", required=True, metavar="FILE")
    run_links.add_argument("--matrix", metavar="NAME_OR_PATH",
                           help="the run's matrix: a packed cell's job and artifact are its pack's (runners.yaml pack)")
    run_links.add_argument("--artifact-prefix", default="results-", metavar="PREFIX")

    nightly = gh_commands.add_parser("nightly-issue", parents=[on_repo],
                                     help="open, update or close the nightly regression issue")
    nightly.add_argument("--results", required=True, metavar="DIR", help="tonight's cell folders")
    nightly.add_argument("--baseline", metavar="DIR", help="the previous night's cell folders, if any")
    nightly.add_argument("--report", metavar="FILE", help="rendered report for the issue body")
    nightly.add_argument("--matrix", default="nightly", help="matrix name shown in the issue")
    nightly.add_argument("--links", metavar="FILE",
                         help="`harness gh run-links` output: the night's waits for the issue's head line")
    nightly.add_argument("--sha", help="commit tested (default $GITHUB_SHA)")
    nightly.add_argument("--label", default="nightly-regression", help="label of the one regression issue")
    nightly.add_argument("--triage", metavar="FILE",
                         help="`harness triage` output: each new red's class and bisect line, added to the issue")
    nightly.add_argument("--trend-json", metavar="FILE",
                         help="`harness trend --json` output: its regressions (still passing, memory or time over "
                              "their baseline) listed under Creeping")
    nightly.add_argument("--triage-json", metavar="FILE",
                         help="`harness triage -o` output: the issue lists its new reds instead of comparing again")
    nightly.add_argument("--memory-percent", type=float, default=10.0, metavar="PCT",
                         help="memory growth counts when above PCT percent ...")
    nightly.add_argument("--memory-mib", type=float, default=64.0, metavar="MIB",
                         help="... and above MIB MiB")
    return parser


def exit_statuses_epilog(statuses: list[tuple[str, str]]) -> str:
    """A command's exit statuses as its --help ends with them, each meaning wrapped beside its status."""
    width = max(len(status) for status, _ in statuses) + 2
    lines = ["exit status:"]
    for status, meaning in statuses:
        lines += textwrap.wrap(meaning, width=78, initial_indent=f"  {status:<{width}}",
                               subsequent_indent=" " * (2 + width), break_on_hyphens=False)
    return "\n".join(lines)


def dispatch(args: argparse.Namespace) -> int:
    # Stage modules are imported lazily so `harness matrix` pays only for the engines' settings checks.
    if args.command == "matrix":
        from harness.engines import check_settings
        from harness.plan import command as matrix_command

        return matrix_command.command(args, check_settings)
    if args.command == "run":
        from harness.run import command as run

        if args.pytest_args and args.pytest_args[0] == "--":
            args.pytest_args = args.pytest_args[1:]
        return run.command(args)
    if args.command == "host":
        from harness.engines import host

        return host.command(args)
    if args.command == "report":
        from harness.report import render as report

        return report.command(args)
    if args.command == "init":
        from harness.github import adopt

        return adopt.command(args)
    if args.command == "bisect":
        from harness.bisect import command as bisect_command

        return bisect_command.command(args)
    if args.command == "env":
        from harness.envs import cache as env_cache

        return env_cache.command(args)
    if args.command == "triage":
        from harness.report import triage_view

        return triage_view.command(args)
    if args.command == "known-bugs":
        from harness.upstream import verify

        return verify.command(args)
    if args.command == "repro":
        from harness.upstream import repro

        return repro.command(args)
    if args.command == "history":
        from harness.history import command as history_command

        return history_command.command(args)
    if args.command == "trend":
        from harness.report import trend_page

        return trend_page.command(args)
    if args.command == "gh":
        from harness.github import command as github

        return github.command(args)
    raise AssertionError(f"unhandled command {args.command}")


def report_fatal(error: FatalError) -> None:
    message = str(error).replace("\n", " ")
    if os.environ.get("GITHUB_ACTIONS") == "true":
        print(f"::error::{message}", file=sys.stderr)
    else:
        print(f"harness: error: {message}", file=sys.stderr)


class _Subcommands:
    """Adds every subcommand with the shared parents (``--debug``), so options work after the subcommand."""

    def __init__(self, action, *parents: argparse.ArgumentParser) -> None:
        self.action, self.parents = action, parents

    def add_parser(self, name: str, **kwargs) -> argparse.ArgumentParser:
        kwargs["parents"] = [*kwargs.get("parents", ()), *self.parents]
        return self.action.add_parser(name, **kwargs)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
