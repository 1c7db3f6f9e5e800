"""`harness gh ...`, the workflows' GitHub glue: each subcommand's options; the work is harness.github.command's."""

from __future__ import annotations

import argparse

from harness.commands.parsers import Subcommands


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = Subcommands(parser, dest="gh_command", metavar="GH_COMMAND")
    # Every gh command talks to one repository: GITHUB_REPOSITORY unless --repo says otherwise.
    on_repo = argparse.ArgumentParser(add_help=False)
    on_repo.add_argument("--repo", metavar="OWNER/NAME", help="repository (default $GITHUB_REPOSITORY)")
    on_repo.add_argument("--author", default="github-actions[bot]", metavar="LOGIN",
                         help="who the token posts as; only comments and issues by LOGIN are edited")

    authorize = commands.add_parser("authorize", parents=[on_repo],
                                    help="decide whether an issue_comment may start GPU jobs")
    authorize.add_argument("--event", required=True, metavar="PATH", help="the webhook event file")
    authorize.add_argument("--matrix", default="pr", help="matrix an accepted request runs")
    authorize.add_argument("--reason-file", metavar="FILE", help="a refusal's reason goes here")

    comment = commands.add_parser("comment", parents=[on_repo], help="create or edit the one harness comment on a PR")
    comment.add_argument("--pr", required=True, type=int)
    comment.add_argument("--body", required=True, metavar="FILE")

    previous = commands.add_parser("previous-comment", parents=[on_repo],
                                   help="save the PR's harness comment (its digest is the next baseline)")
    previous.add_argument("--pr", required=True, type=int)
    previous.add_argument("-o", "--output", required=True, metavar="FILE", help="written only if one exists")

    reply = commands.add_parser("reply", parents=[on_repo],
                                help="answer an '/ok to test' comment that was refused, once")
    reply.add_argument("--event", required=True, metavar="PATH", help="the webhook event file")
    reply.add_argument("--body", required=True, metavar="FILE", help="the reason, as authorize wrote it")

    react = commands.add_parser("react", parents=[on_repo], help="react to the event's comment")
    react.add_argument("--event", required=True, metavar="PATH", help="the webhook event file")
    react.add_argument("--content", default="rocket", help="reaction (default rocket)")

    previous_run = commands.add_parser("previous-run", parents=[on_repo],
                                       help="find the last finished run of a workflow that kept results")
    previous_run.add_argument("--workflow", required=True, metavar="FILE", help="e.g. nightly.yml")
    previous_run.add_argument("--branch", help="default: the repository's default branch")
    previous_run.add_argument("--artifact-prefix", default="results-", metavar="PREFIX")

    run_links = commands.add_parser("run-links", parents=[on_repo],
                                    help="write this run's cell jobs, their times and artifacts for `report --links`")
    run_links.add_argument("-o", "--output", required=True, metavar="FILE")
    run_links.add_argument("--matrix", metavar="NAME_OR_PATH",
                           help="the run's matrix: a packed cell's job and artifact are its pack's (runners.yaml pack)")
    run_links.add_argument("--artifact-prefix", default="results-", metavar="PREFIX")

    nightly = commands.add_parser("nightly-issue", parents=[on_repo],
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


def command(args: argparse.Namespace) -> int:
    from harness.github import command as github

    return github.command(args)
