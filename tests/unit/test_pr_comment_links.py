"""The PR comment's way to the logs (the run, each cell's job and artifact, from the report job's own
environment and `harness gh run-links`, never from results) and each red's class against main's last
nightly (new / already red there / flaky / known upstream / infrastructure, nightly triage's rules)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.report.links import run_url
from harness.report.red_classes import RedClass, classify_reds
from harness.results import load_results

SAMPLES = Path(__file__).parent / "golden" / "samples"
RUN = "https://github.com/o/harness/actions/runs/42"
ACTIONS = {"GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "o/harness", "GITHUB_RUN_ID": "42",
           "GITHUB_RUN_ATTEMPT": "1"}
ADA = "ada-2gpu-torch2.11.0-tf5.9.0"
CPU = "cpu-2rank-torch2.13.0-tf5.24.0"


@pytest.fixture
def actions(monkeypatch):
    for key, value in ACTIONS.items():
        monkeypatch.setenv(key, value)


def comment(tmp_path: Path, *extra: str, results: Path = SAMPLES / "run") -> str:
    out = tmp_path / "comment.md"
    assert main(["report", str(results), "--format", "pr-comment", "-o", str(out), *extra]) == 0
    return out.read_text()


def test_the_run_link_comes_from_the_report_jobs_environment(tmp_path, actions, monkeypatch):
    assert f"· [workflow run]({RUN})" in comment(tmp_path)
    monkeypatch.setenv("GITHUB_RUN_ATTEMPT", "2")
    assert f"[workflow run]({RUN}/attempts/2)" in comment(tmp_path)


def test_outside_actions_there_is_no_link(tmp_path, monkeypatch):
    for key in ACTIONS:
        monkeypatch.delenv(key, raising=False)
    assert "workflow run" not in comment(tmp_path) and "](http" not in comment(tmp_path)


@pytest.mark.parametrize("server", ["https://github.com", "javascript:alert(1)//x", "https://evil.example/)["])
def test_only_a_run_url_becomes_a_link(server):
    url = run_url({**ACTIONS, "GITHUB_SERVER_URL": server})
    assert (url is not None) is (server == "https://github.com")


def test_each_cell_links_its_job_and_artifact_and_each_failure_its_log(tmp_path, actions):
    links = tmp_path / "links.json"
    links.write_text(json.dumps({"jobs": {ADA: f"{RUN}/job/7", "Plan": f"{RUN}/job/1"},
                                 "artifacts": {ADA: f"{RUN}/artifacts/8", CPU: f"{RUN}/artifacts/9"}}))
    text = comment(tmp_path, "--links", str(links))
    table = [line for line in text.splitlines() if line.startswith(("| ❌ | ada", "| ✅ | cpu", "| 💥 | gb200"))]
    assert table[0].endswith(f" [job]({RUN}/job/7) · [results]({RUN}/artifacts/8) |")
    assert table[1].endswith(f" [results]({RUN}/artifacts/9) |")
    assert table[2].endswith(" — |")
    assert f"in `{ADA}` ([log]({RUN}/job/7))" in text


@pytest.mark.parametrize("url", ["https://github.com/o/harness/actions/runs/41/job/7", "https://evil.example/x",
                                 f"{RUN}/job/7)[x](https://evil.example"])
def test_a_links_file_naming_anything_but_this_runs_jobs_is_refused(tmp_path, actions, capsys, url):
    links = tmp_path / "links.json"
    links.write_text(json.dumps({"jobs": {ADA: url}, "artifacts": {}}))
    assert main(["report", str(SAMPLES / "run"), "--format", "pr-comment", "--links", str(links)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"harness: error: --links {links}: jobs: ") and error.endswith(f"is not a job URL of {RUN}")


def test_each_red_is_classified_against_the_nightly_with_triages_rules():
    classes = classify_reds(load_results([str(SAMPLES / "run")]), load_results([str(SAMPLES / "baseline")]))
    by_class: dict[RedClass, set] = {}
    for key, red in classes.items():
        by_class.setdefault(red.red_class, set()).add(key)
    assert (ADA, "tests/gpu/test_ep.py::test_ep_routing") in by_class[RedClass.NEW]
    assert (ADA, "tests/gpu/test_fsdp.py::test_fsdp_gradients[2]") in by_class[RedClass.ALREADY_RED]  # red there too
    # pytest killed by SIGKILL, and no typed cause in its env.json: a crash of the code under test, new (its words
    # a label), infrastructure only where the bisect finds it on the last good build
    sigkill = ("h200-8gpu-torch2.11.0-tf5.18.0", None)
    assert sigkill in by_class[RedClass.NEW]
    assert classes[sigkill].label == "looks like a crash or a device assert"
    assert {key[1] for key in by_class[RedClass.FLAKY]} == {"tests/gpu/test_fsdp.py::test_fsdp_rank_barrier"}
    # its junit.xml is truncated, which no typed event explains (the tested code can write its folder): new; an
    # XFAIL line in its log decides nothing (triage reads causes)
    assert ("gb200-4gpu-torch2.12.0-tf5.24.0", None) in by_class[RedClass.NEW]
    assert RedClass.INFRASTRUCTURE not in by_class
    assert sum(len(keys) for keys in by_class.values()) == len(classes)


def test_the_comment_tallies_the_reds_and_labels_each(tmp_path, monkeypatch):
    for key in ACTIONS:
        monkeypatch.delenv(key, raising=False)
    text = comment(tmp_path, "--classify-against", str(SAMPLES / "baseline"))
    assert ("Reds against main's last nightly (`0a9b8c7d6e5f`): 🆕 7 new, 🔁 2 already red on the baseline, "
            "⚠️ 2 flaky") in text
    assert f"in `{ADA}` (🆕 new)" in text
    # the label beside the class, as data from triage
    assert "errored (🆕 new, looks like a crash or a device assert): pytest crashed: killed by signal SIGKILL" in text


def test_a_green_run_has_no_reds_line(tmp_path):
    green = SAMPLES / "run" / f"results-{CPU}"
    text = comment(tmp_path, "--classify-against", str(SAMPLES / "baseline"), results=green)
    assert "Reds against" not in text and "No red to classify" not in text
