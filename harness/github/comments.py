"""The comments harness keeps on GitHub: one per marker (edited in place, never two), cut to fit."""

from __future__ import annotations

from harness.contract import COMMENT_LIMIT as BODY_LIMIT  # characters GitHub accepts in an issue or comment body
from harness.github import api as github_api
from harness.github.api import ApiError, GitHub


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
    for attempt in range(1, github_api.ATTEMPTS + 1):
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
            if error.status < 500 or attempt == github_api.ATTEMPTS:
                raise
            github_api.sleep(float(attempt))
    raise AssertionError("unreachable")
