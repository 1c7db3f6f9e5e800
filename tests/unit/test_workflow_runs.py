"""The workflows run as a runner would run them: `/ok to test <sha>` -> authorize -> gpu-tests.yml on the
cpu cell -> the report job's PR comment, and the nightly, each job in a fresh clone and a fresh venv,
against the local GitHub API stand-in of fake_github.py. Minutes, not seconds: marked `workflows`."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from fake_github import BOT, REPO, TOKEN, FakeGitHub, comment_event
from workflow_runner import Runner

# Minutes of pip installs and fresh venvs, longer on a busy machine: no per-test clock (pyproject's 600 s would
# race the load); each step instead fails when it stalls (workflow_runner.STEP_STALL_SECONDS). The default
# `python -m pytest` leaves the marker out (pyproject's addopts); .ci/run runs it as its own step.
pytestmark = [pytest.mark.workflows, pytest.mark.timeout(0)]

ROOT = Path(__file__).resolve().parents[2]
TORCH = importlib.metadata.version("torch").split("+")[0]
TRANSFORMERS = importlib.metadata.version("transformers").split("+")[0]
CPU_CELL = f"cpu-2rank-torch{TORCH}-tf{TRANSFORMERS}"
PROBE_TEST = """
def test_probe(record_property):
    record_property("max_rel_grad_error", 0.001)
"""


def git(repo: Path, *arguments: str) -> str:
    command = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *arguments]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def upstream(tmp_path_factory) -> tuple[Path, str, str]:
    """GitHub's copy of this working tree: main, whose pr and nightly matrices are one cpu cell running a
    small suite, and a pull request's head that adds a test to it. Returns (repository, main, head)."""
    repo = tmp_path_factory.mktemp("upstream") / "harness"
    files = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    for name in files:
        if (ROOT / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, repo / name)
    for matrix in ("pr", "nightly"):
        (repo / "matrices" / f"{matrix}.yaml").write_text(
            textwrap.dedent(f"""
            description: one cpu cell, for the workflow test
            axes: {{gpu: [cpu], gpus: [2], torch: ["{TORCH}"], transformers: ["{TRANSFORMERS}"]}}
            suite: [tests/probe]
            timeout_minutes: 10
        """)
        )
    (repo / "tests" / "probe").mkdir()
    (repo / "tests" / "probe" / "test_probe.py").write_text(PROBE_TEST)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "main")
    main = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "pr")
    (repo / "tests" / "probe" / "test_pull_request.py").write_text("def test_added_by_the_pull_request():\n    pass\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "the pull request")
    head = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    return repo, main, head


def machine_environment(api: FakeGitHub, tmp_path: Path) -> dict[str, str]:
    """The runner machine's environment: this one without anything of this test's session or of Actions."""
    environ = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("GITHUB_", "HARNESS_", "PYTEST_", "VIRTUAL_ENV", "RUNNER_"))
    }
    environ["PATH"] = os.pathsep.join(p for p in environ["PATH"].split(os.pathsep) if not p.startswith(str(ROOT)))
    environ.update(
        GITHUB_API_URL=api.base,
        no_proxy="127.0.0.1,localhost",
        NO_PROXY="127.0.0.1,localhost",
        HARNESS_ENV_DIR=str(tmp_path / "envs"),
    )
    return environ


def repository_variables() -> dict[str, str]:
    """HARNESS_EXTRA_INDEX_URL as a repository would set it: here, the indexes this machine's pip uses."""
    done = subprocess.run(
        ["python3", "-m", "pip", "config", "get", "global.extra-index-url"], capture_output=True, text=True
    )
    return {"HARNESS_EXTRA_INDEX_URL": done.stdout.strip()} if done.returncode == 0 else {}


def runner(upstream, api, tmp_path, event_name: str, event: dict) -> Runner:
    repo, main, _head = upstream
    event_path = tmp_path / "event.json"
    event_path.write_text(json.dumps(event))
    context = {
        "event_name": event_name,
        "event": event,
        "sha": main,
        "ref": "refs/heads/main",
        "ref_name": "main",
        "repository": REPO,
        "repository_owner": REPO.split("/")[0],
        "token": TOKEN,
        "run_id": "4242",
    }
    return Runner(
        repository=repo,
        work=tmp_path / "runner",
        github=context,
        event_path=event_path,
        environ=machine_environment(api, tmp_path),
        vars=repository_variables(),
    )


def explain(run: Runner) -> str:
    return "\n".join(run.logs)[-12000:]


def test_ok_to_test_runs_the_approved_head_and_comments_on_the_pull_request(upstream, fake, tmp_path):
    _repo, _main, head = upstream
    fake.add_pull(7, head=head)
    fake.permissions["maintainer"] = ("write", "write")
    event = json.loads(comment_event(tmp_path, f"/ok to test {head}").read_text())
    run = runner(upstream, fake, tmp_path, "issue_comment", event)
    results = run.run_workflow("ok-to-test.yml")
    assert {job: result.result for job, result in results.items()} == {
        "authorize": "success",
        "gpu-tests": "success",
    }, explain(run)
    (comment,) = fake.marker_comments(7)
    body = comment["body"]
    assert comment["user"]["login"] == BOT
    assert CPU_CELL in body and head[:12] in body and "passed" in body, body
    assert f"[workflow run](https://github.com/{REPO}/actions/runs/4242)" in body, body  # the run's own link
    assert "rocket" in fake.reactions[555001]
    assert any(CPU_CELL in summary for summary in run.summaries)
    cell = json.loads((run.artifacts / f"results-{CPU_CELL}" / CPU_CELL / "env.json").read_text())
    assert cell["status"] == "passed" and cell["git_sha"] == head  # the approved head ran, not main
    assert (
        "test_added_by_the_pull_request" in (run.artifacts / f"results-{CPU_CELL}" / CPU_CELL / "junit.xml").read_text()
    )


def test_nightly_runs_the_nightly_matrix_and_keeps_an_html_report(upstream, fake, tmp_path):
    event = {"schedule": "17 2 * * *", "repository": {"full_name": REPO, "default_branch": "main"}}
    run = runner(upstream, fake, tmp_path, "schedule", event)
    results = run.run_workflow("nightly.yml")
    assert {job: result.result for job, result in results.items()} == {
        "gpu-tests": "success",
        "triage": "success",  # nothing new is red, so there is nothing to bisect
        "bisect": "skipped",
        "regression": "success",
    }, explain(run)
    assert (run.artifacts / "nightly-report" / "nightly.html").read_text().startswith("<!DOCTYPE html>")
    # tonight went into the history the next night downloads, and its trend page and regressions were kept
    assert (run.artifacts / "nightly-history" / "history.db").read_bytes().startswith(b"SQLite format 3\0")
    assert (run.artifacts / "nightly-trend" / "trend.html").read_text().lstrip().startswith("<!DOCTYPE html>")
    assert json.loads((run.artifacts / "nightly-trend" / "trend.json").read_text())["regressions"] == []
    assert fake.requests("GET", r"/actions/workflows/nightly\.yml/runs")
    assert fake.issues == {}  # a green first night opens no regression issue
