"""`harness gh`: the one module that talks to GitHub's REST API.

It decides whether an ``/ok to test <sha>`` comment may start GPU jobs, keeps one
harness comment per pull request, and opens, updates or closes the nightly
regression issue. It imports only the standard library, so a bare runner can use it from a
checkout (``python3 -m harness gh ...``) without installing anything; the commands that handle
the report or read results (comment, previous-comment, nightly-issue) import those modules when
they run, on a runner that installed harness.
"""

from __future__ import annotations

import datetime
import email.utils
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import __version__
from harness.contract import COMMENT_MARKER
from harness.errors import ConfigError, GitHubError, NotAuthorizedError

NIGHTLY_MARKER = "<!-- harness-nightly -->"
BODY_LIMIT = 65_536  # characters GitHub accepts in an issue or comment body
DEFAULT_AUTHOR = "github-actions[bot]"  # who GITHUB_TOKEN posts as
TRUSTED_PERMISSIONS = frozenset({"admin", "maintain", "write"})
REACTIONS = frozenset({"+1", "-1", "laugh", "confused", "heart", "hooray", "rocket", "eyes"})
OK_TO_TEST = re.compile(r"/ok to test +([0-9a-f]{7,40})", re.IGNORECASE)
LOGIN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})(?:\[bot\])?")
OUTPUT_VALUE = re.compile(r"[A-Za-z0-9._/-]*")

ATTEMPTS = 3
MAX_WAIT_S = 60.0
REQUEST_TIMEOUT_S = 30.0
sleep = time.sleep  # replaced by tests, so waiting for Retry-After costs nothing


# --------------------------------------------------------------------------- HTTP


class ApiError(GitHubError):
    """An HTTP error answer; `status` lets callers tell a failed POST from a refused one."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]  # lower-cased names
    data: Any


class GitHub:
    """A tiny REST client: JSON in and out, retries where GitHub asks for them, pagination."""

    def __init__(self, base_url: str, token: str, repo: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.repo = repo

    @classmethod
    def from_env(cls, repo: str | None) -> GitHub:
        token = os.environ.get("GITHUB_TOKEN", "")
        if not token:
            raise ConfigError("GITHUB_TOKEN is not set; the workflow step must pass it in env")
        repo = repo or os.environ.get("GITHUB_REPOSITORY", "")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", repo):
            raise ConfigError(f"repository {repo!r} is not OWNER/NAME; pass --repo or set GITHUB_REPOSITORY")
        return cls(os.environ.get("GITHUB_API_URL") or "https://api.github.com", token, repo)

    def repo_path(self, suffix: str) -> str:
        return f"/repos/{self.repo}/{suffix.lstrip('/')}"

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params).data

    def request(
        self, method: str, path_or_url: str, *, params: dict[str, Any] | None = None,
        body: Any = None, idempotent: bool | None = None,
    ) -> Response:
        """Send one request; retry rate limits always, server errors only when repeating is harmless."""
        if idempotent is None:
            idempotent = method != "POST"
        url = self._url(path_or_url, params)
        label = f"{method} {urllib.parse.urlsplit(url).path}"
        for attempt in range(1, ATTEMPTS + 1):
            response = self._send(method, url, body, label)
            if response.status < 400:
                return response
            wait = _rate_limit_wait(response)
            if wait is None and response.status >= 500 and idempotent:
                wait = _retry_after(response.headers) or float(2 ** (attempt - 1))
            if wait is None or attempt == ATTEMPTS:
                raise _api_error(label, response, retried=attempt > 1)
            if wait > MAX_WAIT_S:
                raise ApiError(f"GitHub API: {label} -> {response.status}: asked to retry after {wait:.0f}s, "
                               f"more than the {MAX_WAIT_S:.0f}s this command waits", response.status)
            sleep(wait)
        raise AssertionError("unreachable")

    def paginate(self, path: str, *, key: str | None = None, **params: Any) -> Iterator[dict]:
        """Every item of a list endpoint, following the Link header's rel="next"."""
        url: str | None = self._url(path, {"per_page": 100, **params})
        while url:
            response = self.request("GET", url)
            items = response.data.get(key, []) if key else response.data
            if not isinstance(items, list):
                raise GitHubError(f"GitHub API: GET {path} answered {type(items).__name__}, expected a list")
            yield from items
            url = _next_link(response.headers.get("link", ""))
            if url and not url.startswith(self.base_url + "/"):
                raise GitHubError(f"GitHub API: not following a next page outside {self.base_url}: {url}")

    def _url(self, path_or_url: str, params: dict[str, Any] | None) -> str:
        url = path_or_url if "://" in path_or_url else self.base_url + path_or_url
        if params:
            url += ("&" if "?" in url else "?") + urllib.parse.urlencode(params)
        return url

    def _send(self, method: str, url: str, body: Any, label: str) -> Response:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Accept", "application/vnd.github+json")
        request.add_header("X-GitHub-Api-Version", "2022-11-28")
        request.add_header("User-Agent", f"harness/{__version__}")
        # Unredirected: a redirect to another host must not carry the token.
        request.add_unredirected_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as answer:
                status, headers, raw = answer.status, answer.headers, answer.read()
        except urllib.error.HTTPError as error:
            status, headers, raw = error.code, error.headers, error.read()
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise GitHubError(f"GitHub API: {label}: cannot reach {self.base_url}: {reason}") from error
        return Response(status, {k.lower(): v for k, v in headers.items()}, _decode(raw))


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def _retry_after(headers: dict[str, str]) -> float | None:
    value = headers.get("retry-after", "").strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _rate_limit_wait(response: Response) -> float | None:
    """Seconds to wait when GitHub refused the request for rate limiting (so it was not carried out)."""
    if response.status not in (403, 429):
        return None
    wait = _retry_after(response.headers)
    if wait is not None:
        return wait
    if response.headers.get("x-ratelimit-remaining") == "0":
        reset = response.headers.get("x-ratelimit-reset", "")
        return max(0.0, float(reset) - time.time()) if reset.isdigit() else MAX_WAIT_S
    # A 429 without a hint: GitHub's documentation says to wait at least a minute.
    return MAX_WAIT_S if response.status == 429 else None


def _api_error(label: str, response: Response, *, retried: bool) -> ApiError:
    data = response.data
    if isinstance(data, dict):
        message = str(data.get("message") or "")
        details = [e.get("message") or e.get("code") for e in data.get("errors") or [] if isinstance(e, dict)]
        if details:
            message += " (" + "; ".join(str(d) for d in details if d) + ")"
    else:
        message = " ".join(str(data or "").split())[:200]
    hint = {
        401: "is GITHUB_TOKEN set and valid?",
        403: "the token lacks a permission: check the job's permissions:",
        404: "it does not exist, or the token cannot see it",
        422: "GitHub rejected the request's content",
    }.get(response.status, "GitHub failed; try again later" if response.status >= 500 else "")
    text = f"GitHub API: {label} -> {response.status}"
    text += f": {message}" if message else ""
    text += f" ({hint})" if hint else ""
    text += " after retrying" if retried else ""
    return ApiError(text, response.status)


def _next_link(link_header: str) -> str | None:
    for part in link_header.split(","):
        match = re.fullmatch(r'\s*<([^>]+)>\s*;\s*rel="?next"?\s*', part)
        if match:
            return match.group(1)
    return None


# --------------------------------------------------------------------------- event and outputs


def read_json(path: str | Path, what: str) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise ConfigError(f"{what} {path}: cannot read: {error.strerror or error}") from error
    except ValueError as error:
        raise ConfigError(f"{what} {path}: not JSON: {error}") from error


def dig(document: dict, dotted: str, kind: type, source: str) -> Any:
    """document['a']['b'] for 'a.b', checked to be of `kind`; a clear error otherwise."""
    value: Any = document
    for key in dotted.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise ConfigError(f"{source}: {dotted} is missing or not of type {kind.__name__}")
    return value


def write_outputs(values: dict[str, str]) -> None:
    """Step outputs for later steps, or stdout when not under Actions."""
    for key, value in values.items():
        if not OUTPUT_VALUE.fullmatch(value):  # never let a value add lines of its own
            raise GitHubError(f"refusing to write output {key}={value!r}: unexpected characters")
    lines = "".join(f"{key}={value}\n" for key, value in values.items())
    target = os.environ.get("GITHUB_OUTPUT")
    if target:
        with open(target, "a", encoding="utf-8") as stream:
            stream.write(lines)
    else:
        print(lines, end="")


def read_text(path: str | Path, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{what} {path}: cannot read: {error}") from error


def quoted(login: str) -> str:
    """A login in backticks; GitHub allows no backtick in one, but the event file is still input."""
    return "`" + login.replace("`", "'") + "`"


# --------------------------------------------------------------------------- authorize


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
            "the first line must be `/ok to test <sha>` alone, with the full or a 7+ character short sha "
            "of the pull request's head commit")
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
            f"`{prefix}` is not the head of #{event.number}, which is now `{head[:12]}`: "
            f"review the new commits, then comment `/ok to test {head[:12]}`")
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


def short_sha_doubt(gh: GitHub, event: CommentEvent, prefix: str, head: str) -> str | None:
    """Why a short sha cannot be shown to name only the commit the reviewer saw, or None when it can.

    A contributor can make a commit sharing a 7-character prefix in minutes, and push it between the
    comment and this job. So the prefix counts only where it matches exactly one commit of the pull
    request, that commit is the head, and the timeline shows no force-push since the comment (by the
    server's timestamps; commit dates are the contributor's to choose). A plain push of a twin leaves
    both commits in the list, which the first rule catches."""
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
    commented = _timestamp(event.created_at)
    if commented is None:
        return "the event gives no time for the comment"
    for entry in events:
        if not isinstance(entry, dict) or entry.get("event") not in HEAD_MOVES:
            continue
        moved = _timestamp(str(entry.get("created_at") or ""))
        if moved is None:
            return f"a {entry.get('event')} event has no time"
        if moved >= commented:
            return f"the branch was force-pushed at {moved.isoformat()}, after the comment"
    return None


def _timestamp(text: str) -> datetime.datetime | None:
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else None


def _first_line(text: str) -> str:
    return text.splitlines()[0][:200] if text else ""


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


# --------------------------------------------------------------------------- comments


def fit_body(body: str, limit: int = BODY_LIMIT) -> str:
    """Cut at a line boundary so the body fits GitHub's limit, saying that it was cut."""
    if len(body) <= limit:
        return body
    note = (f"\n\n… cut to fit GitHub's {limit:,}-character limit ({len(body):,} characters); "
            "the job summary and the artifacts hold everything.\n")
    kept = body[: limit - len(note)]
    kept = kept[: kept.rfind("\n")] if "\n" in kept else kept
    return kept + note


def find_comment(gh: GitHub, issue: int, marker: str, author: str) -> dict | None:
    for comment in gh.paginate(gh.repo_path(f"issues/{issue}/comments")):
        login = (comment.get("user") or {}).get("login")
        if login == author and str(comment.get("body") or "").startswith(marker):
            return comment
    return None


def upsert_comment(gh: GitHub, issue: int, body: str, marker: str, author: str) -> tuple[str, dict]:
    """Edit the comment that starts with `marker`, or create it: never two of them."""
    body = fit_body(body if body.startswith(marker) else f"{marker}\n{body}")
    for attempt in range(1, ATTEMPTS + 1):
        existing = find_comment(gh, issue, marker, author)
        if existing and existing.get("body") == body:
            return "unchanged", existing
        if existing:
            path = gh.repo_path(f"issues/comments/{existing['id']}")
            return "edited", gh.request("PATCH", path, body={"body": body}).data
        try:
            created = gh.request("POST", gh.repo_path(f"issues/{issue}/comments"), body={"body": body})
            return "created", created.data
        except ApiError as error:
            # A 5xx answer to a POST may still have created the comment: look again before posting again.
            if error.status < 500 or attempt == ATTEMPTS:
                raise
            sleep(float(attempt))
    raise AssertionError("unreachable")


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


# --------------------------------------------------------------------------- nightly


def previous_run_command(gh: GitHub, args: Any) -> int:
    """The newest finished run of this workflow on the branch, other than this one, that kept results."""
    current = os.environ.get("GITHUB_RUN_ID", "")
    runs = gh.get(gh.repo_path(f"actions/workflows/{urllib.parse.quote(args.workflow)}/runs"),
                  branch=args.branch, status="completed", per_page=20)
    for run in (runs or {}).get("workflow_runs", []):
        if str(run.get("id")) == current or run.get("conclusion") not in ("success", "failure"):
            continue
        artifacts = gh.paginate(gh.repo_path(f"actions/runs/{run['id']}/artifacts"), key="artifacts")
        kept = [a for a in artifacts if not a.get("expired")]
        if any(str(a.get("name")).startswith(args.artifact_prefix) for a in kept):
            write_outputs({"run_id": str(run["id"]), "sha": str(run.get("head_sha") or "")})
            print(f"previous run {run['id']} ({run.get('head_sha')}, {run.get('conclusion')})")
            return 0
    write_outputs({"run_id": "", "sha": ""})
    print(f"no earlier run of {args.workflow} on {args.branch} kept {args.artifact_prefix}* artifacts")
    return 0


def find_open_issue(gh: GitHub, label: str, author: str) -> dict | None:
    # The label filter of the issues list is exact and has no search-index delay.
    for issue in gh.paginate(gh.repo_path("issues"), state="open", labels=label):
        ours = (issue.get("user") or {}).get("login") == author
        if ours and "pull_request" not in issue and str(issue.get("body") or "").startswith(NIGHTLY_MARKER):
            return issue
    return None


TRIAGE_JSON_BYTES = 16 * 1024 * 1024


def triage_regressions(path: str | Path) -> tuple:
    """The new reds of `harness triage -o FILE` as the issue lists them: a test's class, or an errored cell's
    message and class. Read as input: a bad file is one line naming it, exit 2."""
    from harness.results import Regression

    text = read_text(path, "triage")
    if len(text) > TRIAGE_JSON_BYTES:
        raise ConfigError(f"triage {path}: larger than {TRIAGE_JSON_BYTES // (1024 * 1024)} MiB")
    try:
        rows = json.loads(text).get("reds")
    except (ValueError, AttributeError, RecursionError) as error:
        raise ConfigError(f"triage {path}: not the JSON `harness triage -o` writes: {error}") from None
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise ConfigError(f"triage {path}: 'reds' must be a list of objects")
    found = []
    for row in rows:
        cell, test, triage_class, message = (row.get(key) for key in ("cell", "test", "class", "message"))
        if not isinstance(cell, str) or not isinstance(triage_class, str) or not isinstance(test, (str, type(None))):
            raise ConfigError(f"triage {path}: a red needs 'cell' and 'class' strings and 'test' a string or null")
        if triage_class == "flaky":  # passed on a rerun: no regression, as nightly_regressions has it
            continue
        if test is None:
            found.append(Regression(cell_id=cell, kind="errored", text=f"{message} ({triage_class})"))
        else:
            found.append(Regression(cell_id=cell, kind="failing", test_id=test, text=triage_class))
    return tuple(found)


def nightly_issue_command(gh: GitHub, args: Any) -> int:
    from harness.report import read_baseline, render_nightly
    from harness.results import CellStatus, Digest, load_results, nightly_regressions

    current = load_results([args.results])
    # No baseline folder: the first night, or the previous night's artifacts expired.
    baseline = read_baseline(args.baseline) if args.baseline and Path(args.baseline).exists() else None
    regressions = nightly_regressions(current, baseline or Digest(cells={}),
                                      memory_mib=args.memory_mib, memory_percent=args.memory_percent)
    if getattr(args, "triage_json", None):
        # Triage's answer to "what is new since last night" (results.compare.night_before), not a second rule.
        regressions = (*triage_regressions(args.triage_json),
                       *(regression for regression in regressions if regression.kind == "memory"))
    green = all(cell.status is CellStatus.PASSED for cell in current.cells)
    issue = find_open_issue(gh, args.label, args.author)
    sha = (args.sha or os.environ.get("GITHUB_SHA") or "unknown")[:12]
    run_id = os.environ.get("GITHUB_RUN_ID", "")
    server = os.environ.get("GITHUB_SERVER_URL", "")
    run_url = f"{server}/{gh.repo}/actions/runs/{run_id}" if server and run_id.isdigit() else None
    # One comment per night, even when the job is re-run.
    night_marker = f"<!-- harness-nightly:{run_id if run_id.isdigit() else 'local'} -->"

    if green:
        if issue is None:
            print("all green; no open regression issue")
            return 0
        upsert_comment(gh, issue["number"], render_nightly("green", marker=night_marker, sha=sha, run_url=run_url),
                       night_marker, args.author)
        gh.request("PATCH", gh.repo_path(f"issues/{issue['number']}"),
                   body={"state": "closed", "state_reason": "completed"})
        print(f"closed issue #{issue['number']}")
        return 0

    against = "the night before" if baseline is not None else "no earlier results (first night, or they expired)"
    report = read_text(args.report, "report") if args.report else ""
    # Each red's class and bisect line, as `harness triage` rendered it.
    triage = read_text(args.triage, "triage").strip() if args.triage else ""
    body = fit_body(render_nightly("issue", marker=NIGHTLY_MARKER, sha=sha, run_url=run_url, regressions=regressions,
                                   matrix=args.matrix, against=against, report=report, triage=triage))
    if issue is None:
        if not regressions:
            print("failures persist from the night before, and no regression issue is open")
            return 0
        created = gh.request("POST", gh.repo_path("issues"), body={
            "title": f"Nightly regression: {args.matrix}", "body": body, "labels": [args.label]}).data
        print(f"opened issue #{created.get('number')}")
        return 0
    gh.request("PATCH", gh.repo_path(f"issues/{issue['number']}"), body={"body": body})
    if regressions:
        again = render_nightly("again", marker=night_marker, sha=sha, run_url=run_url, regressions=regressions)
        upsert_comment(gh, issue["number"], again, night_marker, args.author)
    print(f"updated issue #{issue['number']}")
    return 0


# --------------------------------------------------------------------------- dispatch

COMMANDS = {
    "authorize": authorize_command,
    "comment": comment_command,
    "previous-comment": previous_comment_command,
    "reply": reply_command,
    "react": react_command,
    "previous-run": previous_run_command,
    "nightly-issue": nightly_issue_command,
}


def command(args: Any) -> int:
    handler = COMMANDS[args.gh_command]
    return handler(GitHub.from_env(args.repo), args)
