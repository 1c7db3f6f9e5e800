"""Who may start GPU jobs, and on which commit: the trust rules of `/ok to test <sha>`.

Only a user the API says has write, maintain or admin access (never `author_association`), only on an
open pull request, only for its head; a short sha only where no twin can have been pushed unseen."""

from __future__ import annotations

import datetime
import re
import urllib.parse
from dataclasses import dataclass

from harness.errors import ConfigError, GitHubError, NotAuthorizedError
from harness.github.actions_io import dig, read_json
from harness.github.api import ApiError, GitHub
from harness.results import utc_moment

TRUSTED_PERMISSIONS = frozenset({"admin", "maintain", "write"})
OK_TO_TEST = re.compile(r"/ok to test +([0-9a-f]{7,40})", re.IGNORECASE)  # 7-11: refused, saying why


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
    created_at: str  # the server's timestamp of the comment, ISO 8601 ("" where the event lacks it)

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
            created_at=str((event.get("comment") or {}).get("created_at") or ""),
        )


def requested_sha(body: str) -> str:
    """The sha of `/ok to test <sha>`, which must stand alone on the comment's first line."""
    first_line = body.splitlines()[0].strip() if body.strip() else ""
    match = OK_TO_TEST.fullmatch(first_line)
    if not match:
        # Never echo the comment: it is the commenter's text, not ours.
        raise NotAuthorizedError(
            f"the first line must be `/ok to test <sha>` alone, with the full or a {MIN_SHORT_SHA}+ character "
            "short sha of the pull request's head commit")
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
    if len(prefix) < MIN_SHORT_SHA:
        raise NotAuthorizedError(
            f"`{prefix}` is {len(prefix)} characters, and a commit sharing that many can be made in hours: a short "
            f"sha needs {MIN_SHORT_SHA} or more. If you reviewed the head, comment `/ok to test {head}`")
    if len(prefix) < 40:
        unproven = short_sha_doubt(gh, event, prefix, head)
        if unproven:
            raise NotAuthorizedError(
                f"`{prefix}` may not name the commit you reviewed: {unproven}. A full sha is always enough: "
                f"if you reviewed the head, comment `/ok to test {head}`")
    return Approval(sha=head, pr=event.number, matrix=matrix)


# Timeline events that move the head without adding a commit the PR's commit list would show twice.
HEAD_MOVES = frozenset({"head_ref_force_pushed", "head_ref_restored", "head_ref_deleted"})
MAX_PR_COMMITS = 250  # GitHub lists at most this many commits of a pull request
# A twin of a 7-character prefix takes about 2**28 SHA-1 tries (minutes); of 12 characters, 2**48.
MIN_SHORT_SHA = 12
# A head moved this shortly before the comment may be a twin the reviewer never saw: a short sha then
# does not count (the full sha always does).
QUIET_BEFORE_COMMENT = datetime.timedelta(hours=1)


def short_sha_doubt(gh: GitHub, event: CommentEvent, prefix: str, head: str) -> str | None:
    """Why a short sha cannot be shown to name only the commit the reviewer saw, or None when it can.

    A contributor can make a commit sharing a short prefix, and push it between the review and this job.
    So a prefix of MIN_SHORT_SHA or more characters counts only where it matches exactly one commit of
    the pull request, that commit is the head, and the timeline shows no force-push from
    QUIET_BEFORE_COMMENT before the comment on (by the server's timestamps; commit dates are the
    contributor's to choose). A plain push of a twin leaves both commits in the list, which the first
    rule catches."""
    try:
        commits = list(gh.paginate(gh.repo_path(f"pulls/{event.number}/commits")))
        events = list(gh.paginate(gh.repo_path(f"issues/{event.number}/timeline")))
    except GitHubError as error:
        return f"GitHub did not give the pull request's commits and timeline ({_first_line(str(error))})"
    if len(commits) >= MAX_PR_COMMITS:
        return f"the pull request has {MAX_PR_COMMITS} commits or more, more than GitHub lists"
    matching = [str(commit.get("sha") or "") for commit in commits if str(commit.get("sha") or "").startswith(prefix)]
    if len(matching) != 1:
        return f"it matches {len(matching)} commits of the pull request"
    if matching[0] != head:
        return "the commit it matches is not the head"
    commented = utc_moment(event.created_at)
    if commented is None:
        return "the event gives no time for the comment"
    for entry in events:
        if not isinstance(entry, dict) or entry.get("event") not in HEAD_MOVES:
            continue
        moved = utc_moment(entry.get("created_at"))
        if moved is None:
            return f"a {entry.get('event')} event has no time"
        if moved >= commented:
            return f"the branch was force-pushed at {moved.isoformat()}, after the comment"
        if moved >= commented - QUIET_BEFORE_COMMENT:
            return (f"the branch was force-pushed at {moved.isoformat()}, less than "
                    f"{QUIET_BEFORE_COMMENT.total_seconds() / 3600:.0f} hour before the comment")
    return None


def _first_line(text: str) -> str:
    return text.splitlines()[0][:200] if text else ""
