"""Matrix expansion, validation and selection, and the `harness matrix` command."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from harness.cli import main
from harness.errors import ConfigError
from harness.plan.cells import Runner
from harness.plan.matrix import expand, expand_braces, load_matrix, select
from harness.plan.runners import load_runners

REPO = Path(__file__).resolve().parents[2]
RUNNERS = {
    "ada": Runner(name="ada", labels=("self-hosted", "gpu-ada"), gpus=2),
    "h200": Runner(name="h200", labels=("self-hosted", "gpu-h200"), gpus=8),
    "cpu": Runner(name="cpu", labels=("ubuntu-latest",), gpus=0, ranks=4),
}


def spec(**overrides):
    base = {"axes": {"gpu": ["ada"], "gpus": [2], "torch": ["2.11.0"], "transformers": ["5.9.0", "5.18.0"]}}
    base.update(overrides)
    return base


def ids(cells):
    return [cell.id for cell in cells]


def test_product_is_deterministic_and_ids_are_stable():
    cells = expand(spec(), RUNNERS, name="m", source="m.yaml")
    assert ids(cells) == ["ada-2gpu-torch2.11.0-tf5.9.0", "ada-2gpu-torch2.11.0-tf5.18.0"]
    assert cells[0].labels == ("self-hosted", "gpu-ada") and cells[0].matrix == "m"
    assert ids(expand(spec(), RUNNERS, name="m", source="m.yaml")) == ids(cells)


def test_exclude_drops_every_matching_cell_and_include_adds_after():
    cells = expand(spec(axes={"gpu": ["ada", "h200"], "gpus": [2], "torch": ["2.11.0"],
                              "transformers": ["5.9.0"]},
                        exclude=[{"gpu": "ada"}],
                        include=[{"gpu": "h200", "gpus": 8, "torch": "2.13.0", "transformers": "5.24.0"}]),
                   RUNNERS, name="m", source="m.yaml")
    assert ids(cells) == ["h200-2gpu-torch2.11.0-tf5.9.0", "h200-8gpu-torch2.13.0-tf5.24.0"]


def test_cpu_cells_count_ranks():
    cells = expand(spec(axes={"gpu": ["cpu"], "gpus": [2], "torch": ["2.13.0"], "transformers": ["5.24.0"]}),
                   RUNNERS, name="cpu", source="cpu.yaml")
    assert ids(cells) == ["cpu-2rank-torch2.13.0-tf5.24.0"]


@pytest.mark.parametrize(("overrides", "message"), [
    ({"axes": {"gpu": ["tpu"], "gpus": [2], "torch": ["2.11.0"], "transformers": ["5.9.0"]}},
     "m.yaml: gpu 'tpu': unknown GPU type"),
    ({"axes": {"gpu": ["ada"], "gpus": [4], "torch": ["2.11.0"], "transformers": ["5.9.0"]}},
     "m.yaml: gpus 4 for gpu 'ada': its runner has 2 GPUs"),
    ({"axes": {"gpu": ["cpu"], "gpus": [8], "torch": ["2.11.0"], "transformers": ["5.9.0"]}},
     "its runner has 4 CPU ranks"),
    ({"axes": {"gpu": ["ada"], "gpus": [2], "torch": ["2.11"], "transformers": ["5.9.x"]}},
     "m.yaml: axes.transformers: '5.9.x': malformed version"),
    ({"axes": {"gpu": ["ada"], "gpus": [2], "torch": [2.11], "transformers": ["5.9.0"]}},
     "m.yaml: axes.torch: 2.11: versions must be quoted strings"),
    ({"axes": {"gpu": ["ada"], "gpus": [0], "torch": ["2.11.0"], "transformers": ["5.9.0"]}},
     "m.yaml: axes.gpus: 0: expected a whole number >= 1"),
    ({"axes": {"gpu": ["ada"], "gpus": [2], "torch": ["2.11.0"], "transformers": []}},
     "m.yaml: axes.transformers: expected a non-empty list"),
    ({"axes": {"gpu": ["ada"], "gpus": [2], "torch": ["2.11.0"], "transformers": ["5.9.0"], "cuda": ["13"]}},
     "m.yaml: axes.cuda: unknown axis"),
    ({"timeout": 30}, "m.yaml: unknown key 'timeout'"),
    ({"exclude": [{"gpu": "ada"}]}, "m.yaml: the matrix is empty"),
    ({"exclude": [{"gpus": 2, "tf": "5.9.0"}]}, "m.yaml: exclude[0].tf: unknown axis"),
    ({"include": [{"gpu": "ada", "gpus": 2}]}, "m.yaml: include[0]: missing torch, transformers"),
    ({"include": [{"gpu": "ada", "gpus": 2, "torch": "2.11.0", "transformers": "five"}]},
     "m.yaml: include[0].transformers: 'five': malformed version"),
    ({"reruns": -1}, "m.yaml: reruns: expected a whole number >= 0"),
    ({"timeout_minutes": "soon"}, "m.yaml: timeout_minutes: expected a number > 0"),
    ({"test_timeout_seconds": 0}, "m.yaml: test_timeout_seconds: expected a whole number >= 1"),
    ({"suite": []}, "m.yaml: suite: expected a non-empty list"),
])
def test_invalid_matrices_name_the_file_and_key(overrides, message):
    with pytest.raises(ConfigError) as raised:
        expand(spec(**overrides), RUNNERS, name="m", source="m.yaml")
    assert message in str(raised.value)


@pytest.mark.parametrize(("patterns", "expected"), [
    (None, 4),
    (["h200-*"], 2),
    (["*-tf5.9.0"], 2),
    (["ada-*-tf{5.9.0,5.18.0}"], 2),
    (["ada-*-tf5.9*", "h200-*-tf5.18*"], 2),
    (["gb200-*"], 0),
])
def test_select_by_glob_with_braces(patterns, expected):
    cells = expand(spec(axes={"gpu": ["ada", "h200"], "gpus": [2], "torch": ["2.11.0"],
                              "transformers": ["5.9.0", "5.18.0"]}), RUNNERS, name="m", source="m.yaml")
    assert len(select(cells, patterns)) == expected


def test_expand_braces_nested():
    assert expand_braces("a{b,c{d,e}}f") == ["abf", "acdf", "acef"]


def newest(package, value):
    """Floating versions as the index might resolve them, without asking it (tests never reach the internet)."""
    return {"torch": "2.13.0", "transformers": "5.24.0"}[package] if value == "latest" else f"{value}-not-floating"


@pytest.mark.parametrize("name", ["cpu", "ada-2gpu", "h200-2gpu", "gb200-4gpu", "pr", "nightly", "cpu-4host"])
def test_shipped_matrices_expand(name):
    matrix = load_matrix(name, resolve=newest)
    assert matrix.cells and len(set(ids(matrix.cells))) == len(matrix.cells)


def test_nightly_is_the_widest():
    cells = load_matrix("nightly", resolve=newest).cells
    # h100 is declared so that `harness run` on an H100 machine knows its type; the nightly asks for it once a
    # runner labelled gpu-h100 serves this repository (until then its jobs would wait for one)
    assert {c.gpu for c in cells} == {name for name, runner in load_runners().items()
                                      if not runner.is_cpu and name != "h100"}
    assert {c.gpus for c in cells if c.gpu == "h200"} == {2, 4, 8}
    assert len({c.torch for c in cells}) >= 2 and len({c.transformers for c in cells}) >= 3
    assert all(c.reruns == 0 for c in cells)
    assert "5.24.0" in {c.transformers for c in cells}  # `latest`, resolved: the cell ids name the release


def test_nightly_follows_the_newest_torch_and_transformers_releases():
    """A release of either package reads as news the morning after: both axes float to `latest`."""
    released = {"torch": "2.15.0", "transformers": "5.25.0"}
    cells = load_matrix("nightly", resolve=lambda package, value: released.get(package) if value == "latest" else value)
    cells = cells.cells
    assert "2.15.0" in {c.torch for c in cells} and "5.25.0" in {c.transformers for c in cells}
    assert "5.24.0" in {c.transformers for c in cells}  # the release before stays beside it


def write(tmp_path, text):
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_github_format_is_what_strategy_matrix_takes(pip_index, capsys):
    assert main(["matrix", "--matrix", "pr", "--format", "github"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert set(payload) == {"include"} and payload["include"]
    for entry in payload["include"]:
        assert {"id", "runs_on", "gpus", "torch", "transformers", "timeout_minutes", "matrix"} <= set(entry)
        assert isinstance(entry["runs_on"], list)


@pytest.mark.parametrize(("text", "message"), [
    ("axes: [unclosed\n", "m.yaml:2:1: YAML does not parse"),
    ("axes: {gpu: [ada], gpus: [2], torch: ['2.11.0'], transformers: ['5.9.0']}\nbogus: 1\n",
     "m.yaml: unknown key 'bogus'"),
    ("- just a list\n", "m.yaml: expected a mapping"),
])
def test_cli_errors_are_one_line_exit_2(tmp_path, capsys, text, message):
    assert main(["matrix", "--matrix", write(tmp_path, text)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_cli_errors_under_github_actions(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    assert main(["matrix", "--matrix", "no-such-matrix"]) == 2
    assert capsys.readouterr().err.startswith("::error::unknown matrix 'no-such-matrix'")


def test_cli_debug_shows_traceback(tmp_path, capsys):
    assert main(["--debug", "matrix", "--matrix", write(tmp_path, "axes: 3\n")]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_cli_no_cell_matches_is_an_error(capsys):
    assert main(["matrix", "--matrix", "pr", "--cell", "tpu-*"]) == 2
    assert "no cell matches --cell tpu-*" in capsys.readouterr().err


def test_python_dash_m_and_console_script_agree(local_index):
    import subprocess
    import sys

    local_index({"torch": ["2.13.0"], "transformers": ["5.25.0"]})
    done = subprocess.run([sys.executable, "-m", "harness", "matrix", "--matrix", "cpu"], cwd=REPO,
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "cpu-2rank-torch2.13.0-tf5.25.0"
