"""The nightly's triage steps as nightly.yml runs them, against the local GitHub API stand-in of
fake_github.py: `harness triage` plans the bisects, a bisect answers, `harness triage --bisects`
renders every red with its class and bisect line, and `harness gh nightly-issue --triage` puts that
in the regression issue."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from bisect_helpers import regression_from, table_probe
from triage_helpers import GRAD, junit_case, write_cell

from harness.bisect.search import bisect, write_json
from harness.cli import main

NIGHTLY_WORKFLOW = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "nightly.yml"

H200 = "h200-2gpu-torch2.13.0-tf5.20.0"
RELEASES = ["5.19.0", "5.20.0"]


def nights(tmp_path):
    before, after = tmp_path / "baseline", tmp_path / "results"
    write_cell(
        before,
        "2.13.0",
        "5.19.0",
        [junit_case("test_fsdp_ep_moe[2-float32]", "passed"), junit_case("test_ep_load[2]", "passed")],
        status="passed",
    )
    write_cell(
        after,
        "2.13.0",
        "5.20.0",
        [
            junit_case("test_fsdp_ep_moe[2-float32]", "failed", GRAD),
            junit_case("test_ep_load[2]", "failed", "RuntimeError: NCCL communicator was aborted on rank 1."),
        ],
    )
    return before, after


@pytest.mark.usefixtures("env")  # GITHUB_* pointing at the local API server
def test_the_regression_issue_lists_each_red_with_its_class_and_bisect_line(fake, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GITHUB_RUN_ID", "4242")
    before, after = nights(tmp_path)

    # Job `triage`: the plan, one bisect job for the cell with a real failure.
    plan = tmp_path / "plan.json"
    assert main(["triage", "--results", str(after), "--baseline", str(before), "--github-matrix", str(plan)]) == 0
    capsys.readouterr()
    [job] = json.loads(plan.read_text())["include"]
    assert (job["cell"], job["good"], job["bad"]) == (
        H200,
        "torch=2.13.0,transformers=5.19.0",
        "torch=2.13.0,transformers=5.20.0",
    )

    # Job `bisect`, on the cell's runner: its --json answer, from the real search over a known table.
    answer = bisect(
        "transformers", RELEASES, good="5.19.0", bad="5.20.0", probe=table_probe(regression_from("5.20.0", RELEASES))
    )
    bisects = tmp_path / "bisects" / f"bisect-{H200}"
    bisects.mkdir(parents=True)
    write_json(bisects / "bisect.json", answer.record(12.5, cell=job["cell"]))

    # Job `regression`: the table, then the issue.
    triage_md, triage_json = tmp_path / "triage.md", tmp_path / "triage.json"
    assert (
        main(["triage", "--results", str(after), "--baseline", str(before), "--bisects", str(tmp_path / "bisects"),
              "-o", str(triage_json)])
        == 0
    )
    triage_md.write_text(capsys.readouterr().out)
    report = tmp_path / "summary.md"
    report.write_text("| cell | result |\n")
    assert (
        main([
            "gh",
            "nightly-issue",
            "--results",
            str(after),
            "--baseline",
            str(before),
            "--report",
            str(report),
            "--sha",
            "6dcb09b5b57875f334f61aebed695e2e4193db5e",
            "--triage",
            str(triage_md),
            "--triage-json",
            str(triage_json),
        ])
        == 0
    )
    [issue] = fake.issues.values()
    body = issue["body"]
    assert "### Triage: 2 new reds" in body
    [real] = [line for line in body.splitlines() if "test_fsdp_ep_moe" in line and line.startswith("| ")]
    assert "| real failure |" in real
    # Escaped like every rendering: markup characters from results are text.
    assert "first bad: transformers 5.20.0 (last good 5.19.0) · test\\_fsdp\\_ep\\_moe\\[2-float32\\]" in real
    [communicator] = [
        line
        for line in body.splitlines()
        if "test\\_ep\\_load" in line or "test_ep_load" in line
        if line.startswith("| ")
    ]
    # A communicator error with no typed event is the code under test's: real, its words a label beside the class.
    assert "| real failure (looks like a communicator error) |" in communicator
    # The issue's list of regressions shows each red's class and label, from triage.json's fields.
    listed = [line for line in body.splitlines()
              if line.startswith("- ") and "test_ep_load" in line and "harness repro" not in line]
    # each with its bisect's line: the bisect of its cell
    assert listed == [f"- `{H200}` `tests/gpu/test_fsdp2.py::test_ep_load[2]` real failure (looks like a communicator "
                      "error) · first bad: transformers 5.20.0 (last good 5.19.0) · "
                      "test\\_fsdp\\_ep\\_moe\\[2-float32\\] · expert gradients differ: max relative error 0.5 \\> "
                      "bound 1e-05"]
    # and a standalone reproducer per red, its id quoted for a shell (rebuilt from the test id, never carried).
    assert f"- `{H200}`: `harness repro 'tests/gpu/test_fsdp2.py::test_ep_load[2]'`" in body.splitlines()
    # It opens with the release that is new since last night, and counts tonight's cases by class.
    assert body.startswith("<!-- harness-nightly -->\nNew since last night: transformers 5.19.0 → 5.20.0; torch 2.13.0 "
                           "(unchanged)\n\nNightly `nightly`")
    assert ("\nTonight's 2 cases: 2 new red · 0 known, still present · 0 fixed upstream · 0 not built · 0 not run · "
            "0 passed\n") in body
    assert issue["labels"] == [{"name": "nightly-regression"}]


def test_nightly_yml_wires_triage_bisect_and_issue():
    workflow = yaml.safe_load(NIGHTLY_WORKFLOW.read_text())
    jobs = workflow["jobs"]
    assert jobs["triage"]["needs"] == "gpu-tests" and jobs["bisect"]["needs"] == "triage"
    assert set(jobs["regression"]["needs"]) == {"gpu-tests", "triage", "bisect"}
    assert jobs["bisect"]["runs-on"] == "${{ matrix.runs_on }}"  # the failing cell's own runner shape
    assert jobs["bisect"]["permissions"] == {"contents": "read"}
    scripts = "\n".join(step.get("run", "") for job in jobs.values() for step in job.get("steps", []))
    assert "harness triage --results results" in scripts and "--github-matrix plan.json" in scripts
    assert re.search(r"harness\" bisect --matrix nightly --cell \"\$CELL\" --good \"\$GOOD\" --bad \"\$BAD\"", scripts)
    assert "--runs 2" in scripts and "--triage triage.md" in scripts
    # Values from results reach the shell only through env, never through ${{ }} in a script.
    assert "${{" not in scripts
