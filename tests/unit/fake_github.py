"""A local stand-in for GitHub's REST API (stdlib http.server on 127.0.0.1) that answers with the real shapes,
pages with Link headers and validates like GitHub does, and the issue_comment webhook payload as GitHub delivers
it. Shared by the tests of `harness gh` (test_github.py), the nightly triage and the workflow runs; the fixtures
that serve it (`fake`, `env`, `sleeps`) are in conftest.py."""

from __future__ import annotations

import json
import re
import urllib.parse
from http.server import BaseHTTPRequestHandler
from pathlib import Path

REPO = "octo-org/harness"
REPO_ID = 1296269
TOKEN = "ghs_16C7e42F292c6912E7710c838347Ae178B4a"
BOT = "github-actions[bot]"
HEAD = "6dcb09b5b57875f334f61aebed695e2e4193db5e"
OLD_HEAD = "e5bd3914e2e596debea16f433f57875b5b90bcd6"
MARKER = "<!-- harness-report -->"


def user(login: str) -> dict:
    return {"login": login, "id": abs(hash(login)) % 10**7, "node_id": "MDQ6VXNlcjE=",
            "avatar_url": f"https://avatars.githubusercontent.com/u/{login}", "url": f"/users/{login}",
            "html_url": f"https://github.com/{login}", "type": "Bot" if login.endswith("[bot]") else "User",
            "site_admin": False}


class FakeGitHub:
    """State behind the fake API, and the log of what harness asked of it."""

    def __init__(self) -> None:
        self.base = ""
        self.permissions: dict[str, tuple[str, str]] = {}  # login -> (permission, role_name)
        self.pulls: dict[int, dict] = {}
        self.commits: dict[int, list[dict]] = {}  # a pull request's commits, oldest first
        self.timeline: dict[int, list[dict]] = {}
        self.comments: dict[int, list[dict]] = {}
        self.issues: dict[int, dict] = {}
        self.reactions: dict[int, set[str]] = {}
        self.runs: list[dict] = []
        self.artifacts: dict[int, list[dict]] = {}
        self.jobs: dict[int, list[dict]] = {}  # run id -> its jobs (GET /actions/runs/ID/jobs)
        self.default_branch = "main"
        self.failures: list[dict] = []  # each answers one matching request instead of (or after) the real one
        self.log: list[tuple[str, str, object]] = []
        self.next_id = 1_000_000

    # ---- setup helpers
    def add_pull(self, number: int, head: str = HEAD, state: str = "open", merged: bool = False) -> None:
        self.pulls[number] = {
            "url": f"{self.base}/repos/{REPO}/pulls/{number}", "id": 1000 + number, "number": number,
            "state": state, "locked": False, "title": "Speed up the EP loader", "user": user("forker"),
            "body": "", "draft": False, "merged": merged,
            "merged_at": "2026-11-29T10:00:00Z" if merged else None,
            "author_association": "CONTRIBUTOR",
            "head": {"label": "forker:ep-loader", "ref": "ep-loader", "sha": head, "user": user("forker"),
                     "repo": {"full_name": "forker/harness", "fork": True}},
            "base": {"label": "octo-org:main", "ref": "main", "sha": OLD_HEAD, "repo": {"full_name": REPO}},
        }
        self.comments.setdefault(number, [])
        self.commits[number] = [commit(head)]
        self.timeline[number] = [timeline_commit(head), {
            "id": 1, "event": "commented", "actor": user("maintainer"), "created_at": "2026-11-29T09:30:00Z"}]

    def push(self, number: int, sha: str) -> None:
        """A plain push of one commit: the old head stays in the pull request's commits."""
        self.commits[number].append(commit(sha))
        self.timeline[number].append(timeline_commit(sha))
        self.pulls[number]["head"]["sha"] = sha

    def force_push(self, number: int, sha: str, at: str) -> None:
        """The branch rewritten to one new commit at server time `at`: the reviewed commit is gone."""
        self.commits[number] = [commit(sha)]
        self.timeline[number] += [timeline_commit(sha), {
            "id": 2, "node_id": "HRFPE_kwDOABCD", "url": f"{self.base}/repos/{REPO}/issues/events/2",
            "actor": user("forker"), "event": "head_ref_force_pushed", "commit_id": None, "commit_url": None,
            "created_at": at, "performed_via_github_app": None}]
        self.pulls[number]["head"]["sha"] = sha

    def add_comment(self, issue: int, login: str, body: str) -> dict:
        self.next_id += 1
        comment = {
            "url": f"{self.base}/repos/{REPO}/issues/comments/{self.next_id}",
            "html_url": f"https://github.com/{REPO}/pull/{issue}#issuecomment-{self.next_id}",
            "issue_url": f"{self.base}/repos/{REPO}/issues/{issue}", "id": self.next_id,
            "node_id": "IC_kwDOABCD", "user": user(login), "created_at": "2026-11-30T03:00:00Z",
            "updated_at": "2026-11-30T03:00:00Z", "author_association": "NONE", "body": body,
            "performed_via_github_app": None,
        }
        self.comments.setdefault(issue, []).append(comment)
        return comment

    def add_issue(self, title: str, body: str, labels: list[str], login: str = BOT,
                  state: str = "open") -> dict:
        self.next_id += 1
        number = len(self.issues) + 100
        issue = {"url": f"{self.base}/repos/{REPO}/issues/{number}", "id": self.next_id, "number": number,
                 "title": title, "body": body, "user": user(login), "state": state, "state_reason": None,
                 "labels": [{"name": name} for name in labels], "comments": 0,
                 "html_url": f"https://github.com/{REPO}/issues/{number}"}
        self.issues[number] = issue
        self.comments.setdefault(number, [])
        return issue

    def fail(self, method: str, path: str, status: int, *, headers: dict | None = None, body: object = None,
             after: bool = False) -> None:
        """The next `method` request matching `path` gets `status`; with `after`, once it was carried out."""
        self.failures.append({"method": method, "path": re.compile(path), "status": status,
                              "headers": headers or {}, "body": body, "after": after})

    def requests(self, method: str, pattern: str = "") -> list[tuple[str, str, object]]:
        return [entry for entry in self.log if entry[0] == method and re.search(pattern, entry[1])]

    def marker_comments(self, issue: int) -> list[dict]:
        return [c for c in self.comments.get(issue, []) if c["body"].startswith(MARKER)]


def commit(sha: str) -> dict:
    """An item of GET /pulls/N/commits. Its dates are the author's to choose."""
    person = {"name": "Forker", "email": "forker@example.com", "date": "2026-11-29T08:00:00Z"}
    return {"sha": sha, "node_id": "C_kwDOABCD", "commit": {"author": person, "committer": person,
            "message": "Speed up the EP loader"}, "author": user("forker"), "committer": user("forker"),
            "parents": []}


def timeline_commit(sha: str) -> dict:
    """A `committed` timeline event: no server timestamp, only the commit's own dates."""
    person = {"name": "Forker", "email": "forker@example.com", "date": "2026-11-29T08:00:00Z"}
    return {"sha": sha, "node_id": "C_kwDOABCD", "author": person, "committer": person,
            "message": "Speed up the EP loader", "event": "committed"}


def page(items: list, query: dict, url: str) -> tuple[list, dict]:
    """GitHub's pagination: per_page (max 100), page, and a Link header with rel=next/last."""
    per_page = min(int(query.get("per_page", 30)), 100)
    number = int(query.get("page", 1))
    last = max(1, -(-len(items) // per_page))
    links = []
    for rel, target in (("next", number + 1), ("last", last)):
        if number < last:
            links.append(f'<{url}?{urllib.parse.urlencode({**query, "page": target})}>; rel="{rel}"')
    return items[(number - 1) * per_page: number * per_page], ({"Link": ", ".join(links)} if links else {})


class Handler(BaseHTTPRequestHandler):
    fake: FakeGitHub

    def log_message(self, *args) -> None:  # keep pytest's output clean
        pass

    def do_GET(self) -> None:
        self.answer("GET")

    def do_POST(self) -> None:
        self.answer("POST")

    def do_PATCH(self) -> None:
        self.answer("PATCH")

    def answer(self, method: str) -> None:
        fake = self.fake
        split = urllib.parse.urlsplit(self.path)
        # Link headers point at /repositories/<id>/..., as GitHub's do.
        path = split.path.replace(f"/repositories/{REPO_ID}/", f"/repos/{REPO}/")
        query = dict(urllib.parse.parse_qsl(split.query))
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        fake.log.append((method, path + (f"?{split.query}" if split.query else ""), body))
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self.send(401, {"message": "Bad credentials", "status": "401",
                                   "documentation_url": "https://docs.github.com/rest"})
        failure = next((f for f in fake.failures if f["method"] == method and f["path"].search(path)), None)
        if failure:
            fake.failures.remove(failure)
            if not failure["after"]:
                return self.send(failure["status"], failure["body"], failure["headers"])
        status, data, headers = self.route(method, path, query, body)
        if failure:
            return self.send(failure["status"], failure["body"], failure["headers"])
        self.send(status, data, headers)

    def route(self, method: str, path: str, query: dict, body) -> tuple[int, object, dict]:
        fake, prefix = self.fake, f"/repos/{REPO}"
        not_found = (404, {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}, {})
        if path == prefix and method == "GET":
            return 200, {"full_name": REPO, "default_branch": fake.default_branch}, {}
        if not path.startswith(prefix + "/"):
            return not_found
        rest = path[len(prefix):]
        if match := re.fullmatch(r"/pulls/(\d+)/commits", rest):
            number = int(match[1])
            if number not in fake.commits:
                return not_found
            return (200, *page(fake.commits[number], query,
                               f"{fake.base}/repositories/{REPO_ID}/pulls/{number}/commits"))
        if match := re.fullmatch(r"/issues/(\d+)/timeline", rest):
            number = int(match[1])
            if number not in fake.timeline:
                return not_found
            return (200, *page(fake.timeline[number], query,
                               f"{fake.base}/repositories/{REPO_ID}/issues/{number}/timeline"))
        if match := re.fullmatch(r"/pulls/(\d+)", rest):
            pull = fake.pulls.get(int(match[1]))
            return (200, pull, {}) if pull and method == "GET" else not_found
        if match := re.fullmatch(r"/collaborators/([^/]+)/permission", rest):
            login = urllib.parse.unquote(match[1])
            if login not in fake.permissions:
                return not_found
            permission, role = fake.permissions[login]
            answer = {"permission": permission, "role_name": role, "user": {**user(login), "role_name": role}}
            return 200, answer, {}
        if match := re.fullmatch(r"/issues/(\d+)/comments", rest):
            number = int(match[1])
            if number not in fake.comments:
                return not_found
            if method == "GET":
                items, headers = page(fake.comments[number], query,
                                      f"{fake.base}/repositories/{REPO_ID}/issues/{number}/comments")
                return 200, items, headers
            text = body.get("body") if isinstance(body, dict) else None
            if not text:
                missing = [{"resource": "IssueComment", "code": "missing_field", "field": "body"}]
                return 422, {"message": "Validation Failed", "errors": missing}, {}
            if len(text) > 65536:
                return 422, {"message": "Validation Failed", "errors": [
                    {"resource": "IssueComment", "code": "custom", "field": "body",
                     "message": "body is too long (maximum is 65536 characters)"}]}, {}
            return 201, fake.add_comment(number, BOT, text), {}
        if match := re.fullmatch(r"/issues/comments/(\d+)", rest):
            comment = next((c for cs in fake.comments.values() for c in cs if c["id"] == int(match[1])), None)
            if comment is None or method != "PATCH":
                return not_found
            comment["body"] = body["body"]
            comment["updated_at"] = "2026-11-30T04:00:00Z"
            return 200, comment, {}
        if match := re.fullmatch(r"/issues/comments/(\d+)/reactions", rest):
            seen = fake.reactions.setdefault(int(match[1]), set())
            status = 200 if body["content"] in seen else 201
            seen.add(body["content"])
            return status, {"id": 1, "content": body["content"], "user": user(BOT)}, {}
        if rest == "/issues" and method == "GET":
            wanted = set(query.get("labels", "").split(",")) - {""}
            state = query.get("state", "open")
            matching = [issue for issue in fake.issues.values()
                        if issue["state"] == state and wanted <= {label["name"] for label in issue["labels"]}]
            items, headers = page(matching, query, f"{fake.base}/repositories/{REPO_ID}/issues")
            return 200, items, headers
        if rest == "/issues" and method == "POST":
            return 201, fake.add_issue(body["title"], body["body"], body.get("labels", [])), {}
        if (match := re.fullmatch(r"/issues/(\d+)", rest)) and method == "PATCH":
            issue = fake.issues.get(int(match[1]))
            if issue is None:
                return not_found
            issue.update(body)
            return 200, issue, {}
        if match := re.fullmatch(r"/actions/workflows/([^/]+)/runs", rest):
            runs = [run for run in fake.runs if run["path"].endswith(match[1])
                    and run["head_branch"] == query.get("branch") and run["status"] == query.get("status")]
            return 200, {"total_count": len(runs), "workflow_runs": runs}, {}
        if match := re.fullmatch(r"/actions/runs/(\d+)/jobs", rest):
            jobs = fake.jobs.get(int(match[1]), [])
            return 200, {"total_count": len(jobs), "jobs": jobs}, {}
        if match := re.fullmatch(r"/actions/runs/(\d+)/artifacts", rest):
            artifacts = fake.artifacts.get(int(match[1]), [])
            return 200, {"total_count": len(artifacts), "artifacts": artifacts}, {}
        return not_found

    def send(self, status: int, data: object, headers: dict | None = None) -> None:
        raw = b"" if data is None else (data.encode() if isinstance(data, str) else json.dumps(data).encode())
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(raw)))
        self.send_header("X-GitHub-Api-Version-Selected", "2022-11-28")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(raw)


def comment_event(tmp_path: Path, body: str, login: str = "maintainer", *, association: str = "MEMBER",
                  number: int = 7, pull_request: bool = True, action: str = "created") -> Path:
    """An issue_comment webhook payload, shaped as GitHub delivers it."""
    issue = {
        "url": f"https://api.github.com/repos/{REPO}/issues/{number}",
        "repository_url": f"https://api.github.com/repos/{REPO}",
        "html_url": f"https://github.com/{REPO}/{'pull' if pull_request else 'issues'}/{number}",
        "id": 2_000_000 + number, "node_id": "PR_kwDOABCD", "number": number,
        "title": "Speed up the EP loader",
        "user": user("forker"), "labels": [], "state": "open", "locked": False, "assignee": None,
        "comments": 3, "created_at": "2026-11-29T09:00:00Z", "updated_at": "2026-11-30T03:00:00Z",
        "author_association": "CONTRIBUTOR", "body": "Makes loading faster.",
    }
    if pull_request:
        issue["pull_request"] = {
            "url": f"https://api.github.com/repos/{REPO}/pulls/{number}",
            "html_url": f"https://github.com/{REPO}/pull/{number}",
            "diff_url": f"https://github.com/{REPO}/pull/{number}.diff",
            "patch_url": f"https://github.com/{REPO}/pull/{number}.patch", "merged_at": None}
    event = {
        "action": action,
        "issue": issue,
        "comment": {
            "url": f"https://api.github.com/repos/{REPO}/issues/comments/555001",
            "html_url": f"https://github.com/{REPO}/pull/{number}#issuecomment-555001",
            "issue_url": issue["url"], "id": 555001, "node_id": "IC_kwDOABCD", "user": user(login),
            "created_at": "2026-11-30T03:00:00Z", "updated_at": "2026-11-30T03:00:00Z",
            "author_association": association, "body": body, "performed_via_github_app": None,
            "reactions": {"url": "", "total_count": 0, "+1": 0, "-1": 0, "laugh": 0, "hooray": 0,
                          "confused": 0, "heart": 0, "rocket": 0, "eyes": 0},
        },
        "repository": {"id": REPO_ID, "node_id": "R_kgDOABCD", "name": "harness", "full_name": REPO,
                       "private": False, "owner": user("octo-org"), "default_branch": "main"},
        "organization": {"login": "octo-org", "id": 9919},
        "sender": user(login),
    }
    path = tmp_path / "event.json"
    path.write_text(json.dumps(event))
    return path
