"""GitHub's REST API, as harness uses it: a tiny client (JSON in and out, retries where GitHub asks for
them, pagination) and its error. Standard library only: `python3 -m harness gh` runs from a checkout with
nothing installed."""

from __future__ import annotations

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
from typing import Any

from harness import __version__
from harness.errors import ConfigError, GitHubError

ATTEMPTS = 3
MAX_WAIT_S = 60.0
REQUEST_TIMEOUT_S = 30.0
sleep = time.sleep  # replaced by tests, so waiting for Retry-After costs nothing


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
