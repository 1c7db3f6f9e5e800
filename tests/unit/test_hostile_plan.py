"""The nightly's bisect plan, as the bisect job reads it: a test id with spaces, quotes, `$(...)` or a
glob stays one argument, and nothing in it reaches a shell as code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from harness.results.triage import Red, Triage, bisect_plan

ROOT = Path(__file__).resolve().parents[2]
IDS = [
    "tests/gpu/test_ep.py::test_load[a b]",
    "tests/gpu/test_ep.py::test_x[$(touch pwned)]",
    "tests/gpu/test_ep.py::test_y['\"*?\\ ]",
    "tests/gpu/test_ep.py::test_z[tab\there]",
]


def bisect_step_reader() -> str:
    """The line of nightly.yml's bisect step that turns $TESTS into the `tests` array."""
    workflow = yaml.safe_load((ROOT / ".github/workflows/nightly.yml").read_text())
    [script] = [step["run"] for step in workflow["jobs"]["bisect"]["steps"] if "TESTS" in step.get("env", {})]
    [line] = [line for line in script.splitlines() if "TESTS" in line]
    return line


def test_each_test_id_reaches_bisect_as_one_argument(tmp_path):
    reds = [Red(cell_id="h200-2gpu-torch2.13.0-tf5.20.0", test_id=test_id, test_name=test_id.split("::")[1],
                message="boom", triage=Triage.REAL, cause="", good={"transformers": "5.19.0"},
                bad={"transformers": "5.20.0"}) for test_id in IDS]
    [job] = bisect_plan(reds, {"h200": ["gpu-h200"]}, {reds[0].cell_id: "h200"})
    venv = tmp_path / "harness-venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    script = bisect_step_reader() + '\nprintf "%s\\0" "${tests[@]}"'
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, check=True,
                          env={**os.environ, "TESTS": job.tests, "RUNNER_TEMP": str(tmp_path)})
    assert done.stdout.decode().split("\0")[:-1] == IDS
    assert not (tmp_path / "pwned").exists()
