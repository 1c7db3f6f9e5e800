"""A new `harness run` keeps the earlier run's results: moved aside into `<results>/.earlier/<start>/`, never
deleted, put back when the run stops before any cell has a folder; a report of the results folder reads the
current run only. Played with the real CLI on small throwaway suites (run_helpers.py)."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shutil
import signal
from pathlib import Path

import pytest
from run_helpers import cell_folder, run, write_matrix

import harness.run.prepare
from harness.cli import main
from harness.engines import Interrupted

KEPT_LINE = re.compile(r"^kept (\d+) folders? of an earlier run aside in (\S+)/: (.+) \(a results folder holds one "
                       r"run; rm -r (\S+) removes every kept run\)$", re.MULTILINE)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (links not followed), by its path inside it: names and bytes."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*"))
            if path.is_file() and not path.is_symlink()}


def kept_where(out: str, results: Path) -> Path:
    """The folder the run said it kept the earlier run in (the user finds it from that line)."""
    found = KEPT_LINE.findall(out)
    assert len(found) == 1, f"no one line says where the earlier run was kept:\n{out}"
    _, where, _, remove = found[0]
    assert Path(remove) == results / ".earlier"
    return Path(where)


def report_terminal(results: Path, capsys) -> str:
    capsys.readouterr()
    assert main(["report", str(results), "--format", "terminal"]) in (0, 1)
    return capsys.readouterr().out


def started_stamp(folder: Path) -> str:
    start = json.loads((folder / "env.json").read_text())["start"]
    moment = datetime.datetime.fromisoformat(start).astimezone(datetime.timezone.utc)
    return moment.strftime("%Y%m%dT%H%M%SZ")


@pytest.mark.usefixtures("pip_index")  # the index lacks the typo'd torch: the cell errors at once, offline
def test_a_run_that_fails_at_once_on_a_typod_version_keeps_the_earlier_runs_files_byte_identical(tmp_path, capsys):
    """Issue 44 item 6: a run into a folder holding an earlier run errored 2 s later on a typo'd version, and the
    earlier run's 23 minutes of results were gone."""
    results = tmp_path / "results"
    assert run(tmp_path, write_matrix(tmp_path, "passing")) == 0
    earlier = cell_folder(results)
    before = snapshot(earlier)
    assert {"env.json", "junit.xml", "pytest.log", "memory.json"} <= set(before)
    capsys.readouterr()

    assert run(tmp_path, write_matrix(tmp_path, "passing", torch="2.1.30")) == 1  # 2.13.0, typo'd
    out = capsys.readouterr().out
    assert any(snapshot(folder) == before for folder in results.rglob(earlier.name)), "the earlier run's files are gone"
    typod = cell_folder(results, torch="2.1.30")
    assert "torch 2.1.30 is not on the package index" in json.loads((typod / "env.json").read_text())["error"]
    where = kept_where(out, results)
    assert where == results / ".earlier" / started_stamp(where / earlier.name)
    assert snapshot(where / earlier.name) == before  # every file, byte for byte
    assert f"kept:    {where} (the earlier run; harness report {where} renders it)" in out
    assert sorted(path.name for path in results.iterdir()) == [".earlier", typod.name]
    # The kept run renders on its own, as it did before.
    shown = report_terminal(where, capsys)
    assert earlier.name in shown and "PASSED" in shown


def test_each_run_is_kept_and_a_report_of_the_results_folder_reads_only_the_newest(tmp_path, capsys):
    results = tmp_path / "results"
    assert run(tmp_path, write_matrix(tmp_path, "passing")) == 0
    first = snapshot(cell_folder(results))
    capsys.readouterr()
    # The same cell again, now red: the passing run must neither vanish nor show in this run's report.
    assert run(tmp_path, write_matrix(tmp_path, "failing")) == 1
    first_kept = kept_where(capsys.readouterr().out, results)
    assert snapshot(first_kept / cell_folder(results).name) == first
    shown = report_terminal(results, capsys)
    assert "1 cell," in shown and "FAILED" in shown and "PASSED" not in shown
    second = snapshot(cell_folder(results))
    # Another cell: the red run is kept beside the first, and the report reads the new cell alone.
    assert run(tmp_path, write_matrix(tmp_path, "passing", ranks=4)) == 0
    second_kept = kept_where(capsys.readouterr().out, results)
    assert second_kept != first_kept and second_kept.parent == first_kept.parent
    assert snapshot(second_kept / cell_folder(results).name) == second
    assert snapshot(first_kept / cell_folder(results).name) == first
    shown = report_terminal(results, capsys)
    assert "1 cell," in shown and cell_folder(results, ranks=4).name in shown
    assert cell_folder(results).name not in shown


def test_dry_run_names_what_would_be_kept_aside_and_moves_nothing(tmp_path, capsys):
    results = tmp_path / "results"
    assert run(tmp_path, write_matrix(tmp_path, "passing")) == 0
    earlier = cell_folder(results)
    before = snapshot(earlier)
    capsys.readouterr()
    assert run(tmp_path, write_matrix(tmp_path, "passing", ranks=4), "--dry-run") == 0
    out = capsys.readouterr().out.splitlines()
    where = results / ".earlier" / started_stamp(earlier)
    assert [line for line in out if "earlier" in line] == [
        f"earlier run: 1 folder would be kept aside in {where}/: {earlier.name}"]
    assert snapshot(earlier) == before and not (results / ".earlier").exists()


def interrupt_before_any_cell():
    @contextlib.contextmanager
    def interrupted():
        # What Ctrl-C raises inside `harness run` (harness.engines.interruptible), between keeping the earlier run
        # aside and the first cell; raised here, not signalled, so it cannot land later, in the cell.
        raise Interrupted(signal.SIGINT)
        yield

    return interrupted


def fail_before_any_cell():
    @contextlib.contextmanager
    def failing():
        raise OSError(28, "No space left on device")
        yield

    return failing


@pytest.mark.parametrize(("stop", "ends"), [(interrupt_before_any_cell, 130), (fail_before_any_cell, OSError)])
def test_a_run_that_stops_before_any_cell_has_a_folder_puts_the_earlier_run_back(tmp_path, capsys, monkeypatch,
                                                                                  stop, ends):
    results = tmp_path / "results"
    assert run(tmp_path, write_matrix(tmp_path, "passing")) == 0
    earlier = cell_folder(results)
    (results / "notes.txt").write_text("mine")
    before = snapshot(results)
    capsys.readouterr()
    monkeypatch.setattr(harness.run.prepare, "harness_import_path", stop())
    matrix = write_matrix(tmp_path, "passing", ranks=4)  # another cell: the earlier one is in its way only as a run
    if isinstance(ends, int):
        assert run(tmp_path, matrix) == ends
    else:
        with pytest.raises(ends):
            run(tmp_path, matrix)
    out = capsys.readouterr().out
    assert snapshot(results) == before and earlier.is_dir() and not (results / ".earlier").exists()
    assert f"put 1 folder of the earlier run back in {results}: this run wrote no cell folder" in out


def test_what_a_report_would_read_is_kept_aside_links_as_links_and_the_users_other_files_stay(tmp_path, capsys):
    results = tmp_path / "results"
    assert run(tmp_path, write_matrix(tmp_path, "passing")) == 0
    cell = cell_folder(results)
    # Downloaded artifacts (a folder of cell folders) and a link to a cell folder elsewhere: a report reads both.
    artifact = results / "results-downloaded"
    shutil.copytree(cell, artifact / "cpu-8rank-torch0-tf0")
    outside = tmp_path / "outside"
    shutil.copytree(cell, outside / "linked-cell")
    (results / "linked").symlink_to(outside / "linked-cell", target_is_directory=True)
    (results / "harness-report.html").write_text("<p>mine</p>")
    (results / "bisect" / "transformers5.20.0" / "cpu-2rank-x").mkdir(parents=True)  # not read by a report
    outside_before = snapshot(outside)
    capsys.readouterr()
    assert run(tmp_path, write_matrix(tmp_path, "passing", ranks=4)) == 0
    where = kept_where(capsys.readouterr().out, results)
    assert sorted(path.name for path in where.iterdir()) == sorted([cell.name, "linked", "results-downloaded"])
    assert (where / "linked").is_symlink() and os.readlink(where / "linked") == str(outside / "linked-cell")
    assert snapshot(outside) == outside_before  # the link's target: not moved, not changed
    assert sorted(path.name for path in results.iterdir()) == sorted(
        [".earlier", "bisect", "harness-report.html", cell_folder(results, ranks=4).name])
    shown = report_terminal(results, capsys)
    assert "1 cell," in shown and "8rank" not in shown


def test_a_kept_folder_that_is_a_link_is_refused_in_one_line_and_nothing_moves(tmp_path, capsys):
    results = tmp_path / "results"
    assert run(tmp_path, write_matrix(tmp_path, "passing")) == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (results / ".earlier").symlink_to(elsewhere, target_is_directory=True)
    before = snapshot(results)
    capsys.readouterr()
    assert run(tmp_path, write_matrix(tmp_path, "passing", ranks=4)) == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error == (f"harness: error: --results {results}: {results / '.earlier'} is not a folder (a symbolic link "
                     "or a file); harness keeps earlier runs in a folder of that name: move it away")
    assert snapshot(results) == before and list(elsewhere.iterdir()) == []


def test_a_move_that_fails_returns_the_ones_before_it_and_is_one_line(tmp_path, capsys, monkeypatch):
    results = tmp_path / "results"
    for name in ("cpu-2rank-torch1-tf1", "cpu-2rank-torch2-tf2"):
        (results / name).mkdir(parents=True)
        (results / name / "env.json").write_text(f'{{"start": "2026-01-05T10:15:00+00:00", "name": "{name}"}}')
    before = snapshot(results)
    rename = os.rename

    def failing_on_the_second(source, target, **kwargs):  # the names move in order: the first has gone aside
        if source == "cpu-2rank-torch2-tf2":
            raise OSError(18, "Invalid cross-device link")
        return rename(source, target, **kwargs)

    monkeypatch.setattr(os, "rename", failing_on_the_second)  # the run stops before any cell: nothing else renames
    assert run(tmp_path, write_matrix(tmp_path, "passing")) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"harness: error: --results {results}: cannot keep {results / 'cpu-2rank-torch2-tf2'} of an earlier run aside "
        f"in {results / '.earlier' / '20260105T101500Z'}: Invalid cross-device link")
    assert snapshot(results) == before and sorted(path.name for path in results.iterdir()) == [
        "cpu-2rank-torch1-tf1", "cpu-2rank-torch2-tf2"]
