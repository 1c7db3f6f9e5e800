"""Pinned versions checked against the package index before anything builds (`harness matrix`, and
`harness run` for the cells it would build); `--dry-run` says why it would build."""

from __future__ import annotations

import importlib.metadata
import json
import textwrap

import pytest

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


def test_matrix_refuses_a_pin_the_index_lacks_in_one_line(pip_index, tmp_path, capsys):
    path = matrix(tmp_path, TORCH, "9.9.9")
    for check in ([], ["--check"]):
        assert main(["matrix", "--matrix", path, *check]) == 2
        assert capsys.readouterr() == ("", f"harness: error: {path}: transformers 9.9.9 is not on the package index "
                                          f"(newest: {TRANSFORMERS})\n")


@pytest.mark.parametrize(("actions", "prefix"), [("", "harness: warning: "), ("true", "::warning::")])
def test_an_index_out_of_reach_leaves_the_cells_printed_with_one_warning(unreachable_index, tmp_path, capsys,
                                                                         monkeypatch, actions, prefix):
    monkeypatch.setenv("GITHUB_ACTIONS", actions)
    path = matrix(tmp_path, "9.9.9")
    assert main(["matrix", "--matrix", path]) == 0
    assert capsys.readouterr() == (
        f"cpu-2rank-torch9.9.9-tf{TRANSFORMERS}\n",
        f"{prefix}{path}: the pins were not checked: torch: cannot reach the package index "
        "(NewConnectionError: [Errno 111] Connection refused)\n",
    )


def test_matrix_check_is_an_error_when_the_index_is_out_of_reach(unreachable_index, tmp_path, capsys):
    path = matrix(tmp_path, TORCH)
    assert main(["matrix", "--matrix", path, "--check"]) == 2
    assert capsys.readouterr() == ("", f"harness: error: {path}: the pins were not checked: torch: cannot reach the "
                                       "package index (NewConnectionError: [Errno 111] Connection refused)\n")


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
