"""Who may start GPU jobs, and on which commit: the trust rules of `/ok to test <sha>`.

Only a user the API says has write, maintain or admin access (never `author_association`), only on an
open pull request, only for its head, named by its full 40-character sha: the pull request's author writes
every commit of it, so two sharing a short prefix are a birthday search away (12 characters in ~2**24 SHA-1
tries, about a minute), and whichever the branch points at when the job runs would carry the approval."""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

from harness.errors import ConfigError, GitHubError, NotAuthorizedError
from harness.github.actions_io import dig, read_json
from harness.github.api import ApiError, GitHub

TRUSTED_PERMISSIONS = frozenset({"admin", "maintain", "write"})
FULL_SHA = 40
# A short sha is taken apart from other text only to be refused with the head's full sha to copy.
OK_TO_TEST = re.compile(r"/ok to test +([0-9a-f]{7,40})", re.IGNORECASE)


def quoted(login: str) -> str:
    """A login in backticks; GitHub allows no backtick in one, but the event file is still input."""
    return "`" + login.replace("`", "'") + "`"


@dataclass(frozen=True)
class Approval:
    sha: str
    pr: int
    matrix: str


@dataclass(frozen=True)
class CommentEvent:
    """What `harness gh` reads from an issue_comment webhook event."""

    action: str
    number: int
    is_pull_request: bool
    comment_id: int
    body: str
    login: str

    @classmethod
    def load(cls, path: str) -> CommentEvent:
        event = read_json(path, "event file")
        source = f"event file {path}"
        if not isinstance(event, dict):
            raise ConfigError(f"{source}: not a JSON object")
        return cls(
            action=str(event.get("action", "")),
            number=dig(event, "issue.number", int, source),
            is_pull_request=bool((event.get("issue") or {}).get("pull_request")),
            comment_id=dig(event, "comment.id", int, source),
            body=dig(event, "comment.body", str, source),
            login=dig(event, "comment.user.login", str, source),
        )


def requested_sha(body: str) -> str:
    """The sha of `/ok to test <sha>`, which must stand alone on the comment's first line."""
    first_line = body.splitlines()[0].strip() if body.strip() else ""
    match = OK_TO_TEST.fullmatch(first_line)
    if not match:
        # Never echo the comment: it is the commenter's text, not ours.
        raise NotAuthorizedError(
            f"the first line must be `/ok to test <sha>` alone, with the full {FULL_SHA}-character sha of the pull "
            "request's head commit")
    return match.group(1).lower()


def permission_of(gh: GitHub, login: str) -> str:
    """The user's permission on the repository, read from the API (author_association is not trusted)."""
    try:
        answer = gh.get(gh.repo_path(f"collaborators/{urllib.parse.quote(login)}/permission"))
    except ApiError as error:
        if error.status == 404:
            return "none"
        raise
    if not isinstance(answer, dict):
        raise GitHubError(f"GitHub API: permission of {login}: unexpected answer {answer!r:.100}")
    # `permission` folds maintain into write; `role_name` tells maintain apart (and custom roles).
    permission, role = answer.get("permission"), answer.get("role_name")
    trusted = [p for p in (role, permission) if p in TRUSTED_PERMISSIONS]
    return trusted[0] if trusted else str(permission or role or "none")


def authorize(gh: GitHub, event: CommentEvent, matrix: str) -> Approval:
    if event.action != "created":
        raise NotAuthorizedError(f"only a new comment counts, not one that was {event.action or 'changed'}")
    if not event.is_pull_request:
        raise NotAuthorizedError(f"#{event.number} is an issue, not a pull request")
    prefix = requested_sha(event.body)
    permission = permission_of(gh, event.login)
    if permission not in TRUSTED_PERMISSIONS:
        raise NotAuthorizedError(
            f"{quoted(event.login)} has {permission} access to {gh.repo}; "
            "`/ok to test` needs write, maintain or admin")
    pull = gh.get(gh.repo_path(f"pulls/{event.number}"))
    if not isinstance(pull, dict):
        raise GitHubError(f"GitHub API: pull request #{event.number}: unexpected answer {pull!r:.100}")
    state = "merged" if pull.get("merged") else str(pull.get("state"))
    if state != "open":
        raise NotAuthorizedError(f"pull request #{event.number} is {state}")
    head = str((pull.get("head") or {}).get("sha") or "")
    if not re.fullmatch(r"[0-9a-f]{40}", head):
        raise GitHubError(f"GitHub API: pull request #{event.number} has no head sha")
    if not head.startswith(prefix):
        raise NotAuthorizedError(
            f"`{prefix}` is not the head of #{event.number}, which is now `{head}`: "
            f"review the new commits, then comment `/ok to test {head}`")
    if len(prefix) < FULL_SHA:
        # Both twins would be the author's own: a birthday search, 2**(2 * characters) tries, not a preimage.
        raise NotAuthorizedError(
            f"`{prefix}` is a short sha: its {len(prefix)} characters can be shared by a second commit the pull "
            f"request's author made (about 2**{2 * len(prefix)} SHA-1 tries), so only the full sha names one commit. "
            f"If `{head}` is the commit you reviewed, comment `/ok to test {head}`")
    return Approval(sha=head, pr=event.number, matrix=matrix)
