"""`harness gh`: the commands a workflow step runs against GitHub. The API client is github_api, the trust
rules of `/ok to test` approval, the comments github_comments, the nightly issue nightly_issue; this module
parses nothing but the command's arguments and calls them. Standard library only at import, so a bare
runner can use it from a checkout (`python3 -m harness gh ...`) without installing anything; the commands
that handle the report or read results import those modules when they run, on a runner that installed harness.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from harness.contract import COMMENT_MARKER
from harness.errors import ConfigError, NotAuthorizedError
from harness.github import links as run_links_api
from harness.github import nightly_issue
from harness.github.actions_io import read_text, write_outputs
from harness.github.api import GitHub
from harness.github.approval import CommentEvent, authorize
from harness.github.comments import find_comment, upsert_comment

DEFAULT_AUTHOR = "github-actions[bot]"  # who GITHUB_TOKEN posts as
REACTIONS = frozenset({"+1", "-1", "laugh", "confused", "heart", "hooray", "rocket", "eyes"})
LOGIN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})(?:\[bot\])?")


def authorize_command(gh: GitHub, args: Any) -> int:
    if not re.fullmatch(r"[A-Za-z0-9._-]+", args.matrix):
        raise ConfigError(f"--matrix {args.matrix!r}: expected a matrix name")
    event = CommentEvent.load(args.event)
    try:
        approval = authorize(gh, event, args.matrix)
    except NotAuthorizedError as refusal:
        write_outputs({"refused": "true"})
        if args.reason_file:
            Path(args.reason_file).write_text(str(refusal) + "\n", encoding="utf-8")
        raise
    write_outputs({"sha": approval.sha, "pr": str(approval.pr), "matrix": approval.matrix})
    print(f"accepted: {event.login} asked to test {approval.sha} of #{approval.pr}, {approval.matrix} matrix")
    return 0


def comment_command(gh: GitHub, args: Any) -> int:
    body = read_text(args.body, "comment body")
    action, comment = upsert_comment(gh, args.pr, body, COMMENT_MARKER, args.author)
    print(f"{action} {comment.get('html_url') or comment.get('id')}")
    return 0


def previous_comment_command(gh: GitHub, args: Any) -> int:
    """Save the body of the PR's harness comment, whose digest lets the next report show deltas."""
    existing = find_comment(gh, args.pr, COMMENT_MARKER, args.author)
    if existing is None:
        print(f"no harness comment on #{args.pr} yet")
        return 0
    Path(args.output).write_text(str(existing.get("body") or ""), encoding="utf-8")
    print(f"saved comment {existing.get('id')} to {args.output}")
    return 0


def reply_command(gh: GitHub, args: Any) -> int:
    event = CommentEvent.load(args.event)
    reason = read_text(args.body, "reply body").strip()
    # One reply per triggering comment, even when the workflow is re-run.
    marker = f"<!-- harness-reply:{event.comment_id} -->"
    greeting = f"@{event.login}, the" if LOGIN.fullmatch(event.login) else "The"
    body = f"{marker}\n{greeting} GPU tests were not started: {reason}\n"
    action, comment = upsert_comment(gh, event.number, body, marker, args.author)
    print(f"{action} {comment.get('html_url') or comment.get('id')}")
    return 0


def react_command(gh: GitHub, args: Any) -> int:
    if args.content not in REACTIONS:
        raise ConfigError(f"--content {args.content!r}: expected one of {', '.join(sorted(REACTIONS))}")
    event = CommentEvent.load(args.event)
    # GitHub answers 200 for a reaction that already exists, so repeating is harmless.
    gh.request("POST", gh.repo_path(f"issues/comments/{event.comment_id}/reactions"),
               body={"content": args.content}, idempotent=True)
    print(f"reacted {args.content} to comment {event.comment_id}")
    return 0


# --------------------------------------------------------------------------- dispatch

COMMANDS = {
    "authorize": authorize_command,
    "comment": comment_command,
    "previous-comment": previous_comment_command,
    "reply": reply_command,
    "react": react_command,
    "previous-run": nightly_issue.previous_run_command,
    "nightly-issue": nightly_issue.nightly_issue_command,
    "run-links": run_links_api.run_links_command,
}


def command(args: Any) -> int:
    handler = COMMANDS[args.gh_command]
    return handler(GitHub.from_env(args.repo), args)
