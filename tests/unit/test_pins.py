"""Pinned versions checked against the package index before anything builds (`matrix --check`, and
`harness run` for the cells it would build); `--dry-run` says why it would build."""

from __future__ import annotations

import importlib.metadata
import json
import textwrap

from harness.cli import main
from harness.plan import versions
from harness.plan.cells import Cell
from harness.plan.pins import missing_pins

TORCH = importlib.metadata.version("torch").split("+")[0]
TRANSFORMERS = importlib.metadata.version("transformers").split("+")[0]


def matrix(tmp_path, torch: str, transformers: str = TRANSFORMERS) -> str:
    (tmp_path / "suite").mkdir(exist_ok=True)
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent(f"""
        axes: {{gpu: [cpu], gpus: [2], torch: ["{torch}"], transformers: ["{transformers}"]}}
        suite: ["{tmp_path / 'suite'}"]
    """))
    return str(path)


def test_a_pin_the_index_lacks_is_named_with_the_newest_release(pip_index):
    assert missing_pins([]) == []
    problems = missing_pins([_cell("2.99.0"), _cell("2.14.0rc1"), _cell(TORCH)])
    assert problems == [f"torch 2.99.0 is not on the package index (newest: {TORCH})"]


def _cell(torch: str) -> Cell:
    return Cell(gpu="cpu", gpus=2, torch=torch, transformers=TRANSFORMERS, matrix="m", labels=(),
                timeout_minutes=5, reruns=0, suite=("tests",))


def test_matrix_check_fails_in_one_line(pip_index, tmp_path, capsys):
    path = matrix(tmp_path, "2.99.0")
    assert main(["matrix", "--matrix", path]) == 0  # without --check the index is not asked
    assert pip_index == []
    capsys.readouterr()
    assert main(["matrix", "--matrix", path, "--check"]) == 2
    assert capsys.readouterr().err == (f"harness: error: {path}: torch 2.99.0 is not on the package index "
                                       f"(newest: {TORCH})\n")


def test_run_errors_a_cell_whose_pin_is_missing_at_once_and_runs_the_others(pip_index, tmp_path, capsys, monkeypatch):
    def no_build(spec, path, log):
        raise AssertionError(f"built {path.name}")

    monkeypatch.setattr("harness.envs.build.build", no_build)
    path = tmp_path / "two.yaml"
    (tmp_path / "suite").mkdir()
    path.write_text(textwrap.dedent(f"""
        axes: {{gpu: [cpu], gpus: [2], torch: ["2.99.0", "{TORCH}"], transformers: ["{TRANSFORMERS}"]}}
        suite: ["{tmp_path / 'suite'}"]
    """))
    (tmp_path / "suite" / "test_one.py").write_text("def test_one():\n    pass\n")
    assert main(["run", "--matrix", str(path), "--env-dir", str(tmp_path / "envs"),
                 "--results", str(tmp_path / "results")]) == 1
    errored = json.loads((tmp_path / "results" / f"cpu-2rank-torch2.99.0-tf{TRANSFORMERS}" / "env.json").read_text())
    assert errored["status"] == "errored"
    assert errored["error"] == f"environment: torch 2.99.0 is not on the package index (newest: {TORCH})"
    passed = json.loads((tmp_path / "results" / f"cpu-2rank-torch{TORCH}-tf{TRANSFORMERS}" / "env.json").read_text())
    assert passed["status"] == "passed"


def test_dry_run_says_a_missing_pin_would_error_the_cell(pip_index, tmp_path, capsys):
    assert main(["run", "--matrix", matrix(tmp_path, "2.99.0"), "--env-dir", str(tmp_path / "envs"), "--dry-run"]) == 0
    assert (f"torch 2.99.0 is not on the package index (newest: {TORCH}) (the cell would be errored at once)"
            in capsys.readouterr().out)


def test_a_cell_this_interpreter_runs_asks_no_index(pip_index, tmp_path, capsys):
    assert main(["run", "--matrix", matrix(tmp_path, TORCH), "--env-dir", str(tmp_path / "envs"), "--dry-run"]) == 0
    assert pip_index == [] and "environment: this interpreter" in capsys.readouterr().out


def test_dry_run_says_why_it_would_build(pip_index, tmp_path, capsys):
    assert main(["run", "--matrix", matrix(tmp_path, "2.12.0"), "--env-dir", str(tmp_path / "envs"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert (f"(this interpreter has torch {importlib.metadata.version('torch')} and transformers {TRANSFORMERS}, "
            f"the cell pins 2.12.0 and {TRANSFORMERS}; the cache has none)") in out


def test_when_the_index_cannot_be_asked_the_build_decides(pip_index, tmp_path, monkeypatch, capsys):
    def unreachable(package, pre):
        raise versions.VersionLookupError(f"{package}: cannot ask the package index: network unreachable")

    monkeypatch.setattr(versions, "ask_pip", unreachable)
    assert main(["run", "--matrix", matrix(tmp_path, "2.12.0"), "--env-dir", str(tmp_path / "envs"), "--dry-run"]) == 0
    assert "environment: build " in capsys.readouterr().out
