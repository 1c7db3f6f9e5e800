"""Hostile results and history, the lesser findings: a cell folder that is a link, a view or trigger planted in the
history database, issue references and math in a test's words, escape sequences in the tested code's output, and
a junit.xml of millions of tiny nested elements. Each is refused, shown as text or read as one errored row."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from xml.sax.saxutils import quoteattr

import pytest
from history_helpers import Case, write_night
from markup_helpers import without_code_spans, without_fences

from harness.cli import main
from harness.engines.local import stream_output
from harness.history import migrations
from harness.history.night_reader import read_night
from harness.ranks.protocol import RankOutput
from harness.ranks.sections import rank_sections
from harness.report.filters import html_text, markdown_text
from harness.report.render import render
from harness.results import CellStatus, load_results

CELL = "ada-2gpu-torch2.11.0-tf5.9.0"


def write_cell(folder: Path, cases: str, status: str = "failed") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "env.json").write_text(json.dumps(
        {"schema": 1, "cell": {"id": folder.name, "matrix": "pr"}, "status": status, "exit_code": 1}))
    (folder / "junit.xml").write_text('<?xml version="1.0" encoding="utf-8"?><testsuites>'
                                      f'<testsuite name="pytest" time="1.0">{cases}</testsuite></testsuites>')
    return folder


def failing_case(name: str, message: str) -> str:
    return (f'<testcase classname="tests.gpu.test_ep" name={quoteattr(name)} file="tests/gpu/test_ep.py" time="1">'
            f'<failure message={quoteattr(message)}>E   {message}</failure></testcase>')


# ---------------------------------------------------------------------------------------------
# (a) A cell folder that is a symbolic link


def test_a_cell_folder_that_is_a_symbolic_link_is_an_errored_row_and_never_followed(tmp_path):
    outside = write_cell(tmp_path / "elsewhere" / CELL, failing_case("test_secret_from_outside", "secret words"))
    results = tmp_path / "results"
    results.mkdir()
    (results / CELL).symlink_to(outside, target_is_directory=True)
    artifact = results / "artifact-of-another-cell"  # a link one level down, where artifacts hold their cells
    artifact.mkdir()
    (artifact / "h100-2gpu-torch2.11.0-tf5.9.0").symlink_to(outside, target_is_directory=True)

    cells = load_results([results]).cells
    assert [(cell.id, cell.status) for cell in cells] == [
        ("ada-2gpu-torch2.11.0-tf5.9.0", CellStatus.ERRORED), ("h100-2gpu-torch2.11.0-tf5.9.0", CellStatus.ERRORED)]
    assert all("symbolic link; not followed" in cell.reason and not cell.tests for cell in cells)
    assert all(cell.folder.endswith(cell.id) for cell in cells)  # the row names the link, not where it points
    for fmt in ("pr-comment", "summary", "terminal", "html"):
        assert "secret" not in render(load_results([results]), fmt), fmt
    assert [(cell.cell, cell.tests) for cell in read_night([results])] == [
        ("ada-2gpu-torch2.11.0-tf5.9.0", ()), ("h100-2gpu-torch2.11.0-tf5.9.0", ())]


# ---------------------------------------------------------------------------------------------
# (b) A view or a trigger planted in the history database


def history(tmp_path: Path) -> Path:
    db = tmp_path / "history.db"
    night = write_night(tmp_path / "night1", {"cpu-2rank": [Case()]})
    assert main(["history", "append", "--db", str(db), "--night", "run-1", "--date", "2026-01-01", str(night)]) == 0
    return db


PLANTED = {
    # Every insert into packed rewrites every night appended before.
    "trigger": ("trigger 'forge'", "CREATE TRIGGER forge AFTER INSERT ON packed BEGIN "
                                   "UPDATE nights SET night = 'forged', night_date = '1970-01-01'; END"),
    # `nights` is a query that never ends: trend's first statement would hang.
    "view": ("view 'nights'", "DROP TABLE nights; CREATE VIEW nights AS WITH RECURSIVE n(id) AS "
                              "(SELECT 1 UNION ALL SELECT id + 1 FROM n) SELECT id, 'run-' || id AS night, "
                              "'2026-01-01' AS night_date FROM n"),
}


@pytest.mark.parametrize("planted", sorted(PLANTED))
def test_a_view_or_trigger_planted_in_the_history_is_refused_before_any_statement_runs(tmp_path, planted):
    db = history(tmp_path)
    named, sql = PLANTED[planted]
    with sqlite3.connect(db) as connection:
        connection.executescript(sql)
    connection.close()
    planted_bytes = db.read_bytes()

    night = write_night(tmp_path / "night2", {"cpu-2rank": [Case()]})
    append = [sys.executable, "-m", "harness", "history", "append", "--db", str(db), "--night", "run-2",
              "--date", "2026-01-02", str(night)]
    trend = [sys.executable, "-m", "harness", "trend", "--db", str(db), "--html", str(tmp_path / "trend.html")]
    for command in (append, trend):
        # A subprocess with a deadline: the code this replaced never returned from the view (minutes here are
        # generous; refused, it exits at once).
        try:
            ran = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                                 env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
        except subprocess.TimeoutExpired:
            pytest.fail(f"{command[3]}: still running after 120 s on the planted {planted}")
        assert ran.returncode == 2, (command[3], ran.stdout, ran.stderr)
        [line] = ran.stderr.strip().splitlines()
        assert str(db) in line and named in line and "refused" in line, line
    assert db.read_bytes() == planted_bytes  # nothing written, the trigger never fired


def test_the_trend_reads_the_history_read_only_and_never_migrates_it(tmp_path):
    db = tmp_path / "history.db"
    with sqlite3.connect(db) as connection:  # an older harness's file
        connection.executescript(migrations()[0].sql)
        connection.execute("PRAGMA user_version = 1")
    connection.close()
    before = db.read_bytes()
    assert main(["trend", "--db", str(db), "--html", str(tmp_path / "trend.html")]) == 2
    assert db.read_bytes() == before and not (tmp_path / "trend.html").exists()


# ---------------------------------------------------------------------------------------------
# (c) Issue references and math in a test's words


REFERENCES = "GH-1 octo/repo#2 #3 gh-4 $x^2$ and $$\\sum_i y_i$$"


def test_issue_references_and_math_in_a_tests_words_stay_text_in_every_markdown_view(tmp_path):
    results = tmp_path / "results"
    write_cell(results / CELL, failing_case(f"test_refs[{REFERENCES}]", REFERENCES))
    for fmt in ("pr-comment", "summary"):
        markdown = render(load_results([results]), fmt)
        prose = without_code_spans(without_fences(markdown))
        prose = re.sub(r"<!-- harness-digest v1 [A-Za-z0-9+/=]+ -->", "", prose)
        text = re.sub(r"&#\d+;", "\u2060", prose)  # an entity is one character of text, never a digit after '#'
        assert not re.search(r"#\d", text), f"{fmt}: a live issue reference"
        assert not re.search(r"(?i)\bgh-\d", text), f"{fmt}: a live GH- reference"
        assert "$" not in text, f"{fmt}: a '$' GitHub may pair into math"
        assert "<span>&#36;</span>x^2<span>&#36;</span>" in prose, fmt  # the words are still all there
    assert markdown_text("GH-1 octo/repo#2") == "GH&#8203;-1 octo/repo\\#&#8203;2"
    assert html_text('#1 "$" &#2') == "#&#8203;1 &#34;<span>&#36;</span>&#34; &amp;#&#8203;2"  # entities whole


# ---------------------------------------------------------------------------------------------
# (d) Escape sequences in the tested code's output


ESCAPES = b"title\x1b]0;pwned\x07 clear\x1b[2J csi\xc2\x9b2J bell\x07 cr\rover tab\tnewline\n"


def test_escape_sequences_in_the_tested_codes_output_reach_no_terminal(tmp_path):
    read_end, write_end = os.pipe()
    os.write(write_end, ESCAPES)
    os.close(write_end)
    echoed: list[bytes] = []
    with open(read_end, "rb") as source, (tmp_path / "pytest.log").open("wb") as log:
        stream_output(source, log, echoed.append)
    shown = b"".join(echoed)
    assert (tmp_path / "pytest.log").read_bytes() == ESCAPES  # the raw log keeps the bytes as they came
    assert not re.search(rb"[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]", shown), shown
    assert shown == (b"title\\x1b]0;pwned\\x07 clear\\x1b[2J csi\\x9b2J bell\\x07 cr\\x0dover tab\tnewline\n")

    [(_, section)] = rank_sections([{0: RankOutput(stdout=ESCAPES.decode(), stderr="")}])
    assert "\x1b" not in section and "\x9b" not in section and "\\x1b]0;pwned\\x07" in section


# ---------------------------------------------------------------------------------------------
# (e) A junit.xml of millions of tiny nested elements


@pytest.mark.parametrize(("body", "says"), [
    ("<a>" * 1_000 + "</a>" * 1_000, "elements nested deeper than 32"),
    ("<a/>" * 500_001, "more than 500,000 elements"),
])
def test_a_junit_xml_of_tiny_elements_is_refused_before_its_tree_is_built(tmp_path, body, says):
    results = tmp_path / "results"
    write_cell(results / CELL, body + failing_case("test_inside", "gradients differ"), status="passed")
    [cell] = load_results([results]).cells
    assert cell.status is CellStatus.ERRORED and f"junit.xml: refused: {says}" in cell.reason, cell.reason
    assert cell.tests == ()
    [night_cell] = read_night([results])
    assert night_cell.tests == ()
