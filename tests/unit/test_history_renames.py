"""`harness history append --renamed FILE`: a renamed test file's earlier nights follow it, so its trend goes on;
the mapping is untrusted input."""

from __future__ import annotations

from pathlib import Path

import pytest
from history_helpers import Case, stored, write_night

from harness.cli import main

OLD = "tests/gpu/test_deliberate_bugs.py"
NEW = "tests/gpu/test_planted_bugs.py"
CELL = "cpu-2rank"


def append(db: Path, night: str, folder: Path, date: str, renamed: Path | None = None) -> int:
    extra = ["--renamed", str(renamed)] if renamed is not None else []
    return main(["history", "append", "--db", str(db), "--night", night, "--date", date, *extra, str(folder)])


def night(tmp_path: Path, name: str, file: str, *others: str, time_s: float = 2.0) -> Path:
    cases = [Case(test_id=f"{file}::test_planted[{bug}]", time_s=time_s) for bug in ("swap", "scale")]
    cases += [Case(test_id=f"{other}::test_x", time_s=time_s) for other in others]
    return write_night(tmp_path / name, {CELL: cases})


def renames(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "renamed.yaml"
    path.write_text(text)
    return path


def times_by_name(db: Path, night_id: str) -> dict[str, float | None]:
    return {test: kept.time_s for (_, test), kept in stored(db, night_id).items()}


def test_earlier_nights_follow_a_renamed_file_and_unrelated_files_stay(tmp_path):
    db = tmp_path / "history.db"
    mapping = renames(tmp_path, f"{OLD}: {NEW}\n")
    assert append(db, "n1", night(tmp_path, "n1", OLD, OLD + "x", time_s=3.0), "2026-01-01") == 0
    assert append(db, "n2", night(tmp_path, "n2", NEW, OLD + "x"), "2026-01-02", mapping) == 0
    assert times_by_name(db, "n1") == {f"{NEW}::test_planted[swap]": 3.0, f"{NEW}::test_planted[scale]": 3.0,
                                  f"{OLD}x::test_x": 3.0}  # `a.py` never takes `a.pyx`'s tests
    assert set(times_by_name(db, "n2")) == set(times_by_name(db, "n1"))
    # Listed on every later night: nothing matches any more, nothing changes.
    assert append(db, "n3", night(tmp_path, "n3", NEW), "2026-01-03", mapping) == 0
    assert set(times_by_name(db, "n1")) == set(times_by_name(db, "n2"))


def test_a_name_stored_under_both_files_is_merged_into_the_new(tmp_path):
    db = tmp_path / "history.db"
    assert append(db, "n1", night(tmp_path, "n1", OLD, time_s=3.0), "2026-01-01") == 0
    assert append(db, "n2", night(tmp_path, "n2", NEW), "2026-01-02") == 0  # ran before the rename was listed
    assert append(db, "n3", night(tmp_path, "n3", NEW), "2026-01-03", renames(tmp_path, f"{OLD}: {NEW}\n")) == 0
    for night_id in ("n1", "n2", "n3"):
        assert set(times_by_name(db, night_id)) == {f"{NEW}::test_planted[swap]", f"{NEW}::test_planted[scale]"}
    assert times_by_name(db, "n1")[f"{NEW}::test_planted[swap]"] == 3.0


def test_a_night_that_ran_both_files_is_refused_and_the_history_is_left_as_it_was(tmp_path, capsys):
    db = tmp_path / "history.db"
    assert append(db, "n1", night(tmp_path, "n1", OLD, NEW), "2026-01-01") == 0
    both = write_night(tmp_path / "both", {CELL: [Case(test_id=f"{OLD}::test_x"), Case(test_id=f"{NEW}::test_x")]})
    assert append(db, "n2", both, "2026-01-02") == 0
    before = {night_id: times_by_name(db, night_id) for night_id in ("n1", "n2")}
    assert append(db, "n3", night(tmp_path, "n3", NEW), "2026-01-03", renames(tmp_path, f"{OLD}: {NEW}\n")) == 2
    assert "a night ran both" in capsys.readouterr().err
    assert {night_id: times_by_name(db, night_id) for night_id in ("n1", "n2")} == before


@pytest.mark.parametrize("text, says", [
    ("- a.py\n", "expected a mapping"),
    ("a.py: 7\n", "7 is not a test file"),
    ("a.py: ''\n", "'' is not a test file"),
    ("'a.py::': b.py\n", "not ending in '::'"),
    ("a.py: a.py\n", "renamed to itself"),
    ("a.py: b.py\nb.py: c.py\n", "which is itself renamed"),
    ("a.py: &x b.py\nc.py: *x\n", "alias"),
    ("a.py: [b.py\n", "YAML does not parse"),
])
def test_a_bad_mapping_is_one_line_naming_the_file_and_exit_2(tmp_path, capsys, text, says):
    db = tmp_path / "history.db"
    mapping = renames(tmp_path, text)
    assert append(db, "n1", night(tmp_path, "n1", OLD), "2026-01-01", mapping) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and str(mapping) in err and len(err.splitlines()) == 1
    assert not db.exists()  # read before the database is touched


def test_the_suites_renames_name_files_that_exist_and_the_nightly_passes_them():
    """tests/gpu/renamed.yaml is read by the nightly: each new file exists, each old one is gone (a test file
    brought back under an old name would have its nights taken by the new one)."""
    import yaml

    from harness.history.renames import read_renames

    root = Path(__file__).resolve().parents[2]
    listed = read_renames(root / "tests/gpu/renamed.yaml")
    assert listed
    for rename in listed:
        assert (root / rename.new).is_file() and not (root / rename.old).exists()
    nightly = yaml.safe_load((root / ".github/workflows/nightly.yml").read_text())
    runs = [step.get("run", "") for job in nightly["jobs"].values() for step in job.get("steps", [])]
    assert any("harness history append" in run and "--renamed tests/gpu/renamed.yaml" in run for run in runs)
