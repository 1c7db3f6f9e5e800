"""Hostile results folders, as a pull request's code could leave them: each renders in every format as
one errored (or readable) row, without hanging, crashing or reading past its cap."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness.cli import main
from harness.results import CellStatus, junit, load_results

CELL = "ada-2gpu-torch2.11.0-tf5.9.0"
FORMATS = ["pr-comment", "summary", "terminal", "html"]
JUNIT = ('<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" time="1.0">'
         '<testcase classname="t" name="test_ok" time="0.5"/></testsuite></testsuites>')


def env_json(folder: Path, text: str | None = None, **fields) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    record = {"schema": 1, "cell": {"id": CELL, "matrix": "pr"}, "status": "passed", "exit_code": 0, **fields}
    (folder / "env.json").write_text(text if text is not None else json.dumps(record))


def render_all(results: Path, tmp_path: Path) -> dict[str, str]:
    """Every format through the CLI, written as UTF-8 (where a lone surrogate used to raise)."""
    rendered = {}
    for fmt in FORMATS:
        output = tmp_path / f"out.{fmt}"
        assert main(["report", str(results), "--format", fmt, "--output", str(output)]) == 0, fmt
        rendered[fmt] = output.read_text(encoding="utf-8")
    return rendered


def test_a_fifo_named_junit_xml_is_an_errored_row_not_a_hang(tmp_path):
    folder = tmp_path / "results" / CELL
    env_json(folder)
    os.mkfifo(folder / "junit.xml")  # nobody ever writes to it: reading it would wait forever
    os.mkfifo(folder / "pytest.log")
    [cell] = load_results([tmp_path / "results"]).cells
    assert cell.status is CellStatus.ERRORED and "not a regular file (a FIFO)" in cell.reason
    assert any("pytest.log" in str(problem) and "FIFO" in str(problem) for problem in cell.problems)
    render_all(tmp_path / "results", tmp_path)


def test_a_symbolic_link_is_not_followed(tmp_path):
    folder = tmp_path / "results" / CELL
    env_json(folder)
    secret = tmp_path / "secret.xml"
    secret.write_text(JUNIT.replace("test_ok", "test_secret_from_outside_the_folder"))
    (folder / "junit.xml").symlink_to(secret)
    [cell] = load_results([tmp_path / "results"]).cells
    assert cell.status is CellStatus.ERRORED and "symbolic link; not followed" in cell.reason
    assert "secret" not in "".join(render_all(tmp_path / "results", tmp_path).values())


def test_a_junit_xml_over_the_cap_is_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(junit, "JUNIT_BYTES", len(JUNIT) - 1)  # the cap is 32 MiB; the rule is the same
    folder = tmp_path / "results" / CELL
    env_json(folder)
    (folder / "junit.xml").write_text(JUNIT)
    [cell] = load_results([tmp_path / "results"]).cells
    assert cell.status is CellStatus.ERRORED and f"larger than {len(JUNIT) - 1:,} bytes; not read" in cell.reason
    assert cell.tests == ()


def test_a_junit_xml_at_the_cap_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(junit, "JUNIT_BYTES", len(JUNIT))
    folder = tmp_path / "results" / CELL
    env_json(folder)
    (folder / "junit.xml").write_text(JUNIT)
    [cell] = load_results([tmp_path / "results"]).cells
    assert cell.status is CellStatus.PASSED and [test.name for test in cell.tests] == ["test_ok"]


@pytest.mark.parametrize("escape", ["\\ud800", "\\udfff", "x\\ud83d"])
def test_a_lone_surrogate_in_env_json_renders_in_every_format(tmp_path, escape):
    folder = tmp_path / "results" / CELL
    text = json.dumps({"schema": 1, "cell": {"id": CELL, "matrix": "pr"}, "status": "errored", "exit_code": 1,
                       "error": "ESCAPE broke", "runner": "ESCAPE", "versions": {"ESCAPE": "ESCAPE"}})
    env_json(folder, text.replace("ESCAPE", escape))
    rendered = render_all(tmp_path / "results", tmp_path)
    assert all("broke" in text for fmt, text in rendered.items() if fmt != "terminal")


def test_a_cell_folder_name_that_is_not_utf8_renders_in_every_format(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    folder = Path(os.fsdecode(bytes(results) + b"/ada-2gpu-torch2.11.0-tf5.9.0-\xff\xfe"))
    folder.mkdir()
    (folder / "junit.xml").write_text(JUNIT)  # no env.json: the id comes from the folder's name
    [cell] = load_results([results]).cells
    assert cell.id == "ada-2gpu-torch2.11.0-tf5.9.0-??"  # each byte that is not UTF-8 shows as "?"
    cell.folder.encode("utf-8")
    rendered = render_all(results, tmp_path)
    assert all("ada-2gpu-torch2.11.0-tf5.9.0-" in text for text in rendered.values())


def junit_case(properties: dict[str, str], result: str) -> str:
    listed = "".join(f'<property name="{name}" value="{value}"/>' for name, value in properties.items())
    return ('<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" time="1.0">'
            f'<testcase classname="t" name="test_case" time="0.5"><properties>{listed}</properties>{result}'
            '</testcase></testsuite></testsuites>')


SKIP = '<skipped type="pytest.skip" message="needs 4 GPUs"/>'


@pytest.mark.parametrize("value", ["9" * 1000, "-2", "2.0", "1e9", "nan", " ", "0x10", "２", "1000001"])
def test_a_garbled_world_size_is_not_a_number_but_the_case_still_did_not_run(tmp_path, value):
    folder = tmp_path / "results" / CELL
    env_json(folder)
    properties = {"needs_world_size": value, "host_ranks": value, "host_rank_unit": "&lt;script&gt;x"}
    (folder / "junit.xml").write_text(junit_case(properties, SKIP))
    [cell] = load_results([tmp_path / "results"]).cells
    assert cell.status is CellStatus.NOT_RUN  # the property is there: the case was skipped for too few ranks
    assert (cell.not_run.cases, cell.not_run.smallest_world, cell.not_run.host_ranks) == (1, None, None)
    assert cell.not_run.host_rank_unit is None  # only GPUs or ranks
    rendered = render_all(tmp_path / "results", tmp_path)
    said = "nothing distributed ran: 1 case needs more GPUs or ranks, more than this host has"
    assert all(said in " ".join(text.split()) for text in rendered.values())  # the terminal wraps it
    assert not any("<script>" in text for text in rendered.values())


@pytest.mark.parametrize("value", ["1e9", "2.5", "-2", "two", "9" * 100])
def test_a_garbled_world_size_on_a_case_that_ran_does_not_make_it_distributed(tmp_path, value):
    folder = tmp_path / "results" / CELL
    env_json(folder)
    (folder / "junit.xml").write_text(junit_case({"world_size": value, "family": "x" * 10_000}, ""))
    [cell] = load_results([tmp_path / "results"]).cells
    [test] = cell.tests
    assert test.world_size is None and not test.ran_distributed
    assert test.family is None and cell.ran_families == ()  # a family name is short
    render_all(tmp_path / "results", tmp_path)
