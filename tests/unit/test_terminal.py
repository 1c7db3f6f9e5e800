"""The terminal rendering: 80 columns, colour on a TTY only, NO_COLOR; and `harness report -o` choosing
its format from the file's extension."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from harness.cli import main
from harness.report.render import render
from harness.report.terminal import COLUMNS, paint, wants_color, wrap
from harness.results import load_results

RUN = Path(__file__).parent / "golden" / "samples" / "run"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def terminal_lines(color: bool = False) -> list[str]:
    return render(load_results([str(RUN)]), "terminal", color=color).splitlines()


def verdict_line(lines: list[str]) -> str:
    [line] = [line for line in lines if ANSI.sub("", line).startswith("harness: ")]
    return line


def test_every_line_but_coverage_and_commands_fits_80_columns():
    """The coverage line is issue 21's; a reproduce command is kept whole so it can be copied."""
    lines = terminal_lines()
    reproduce = lines.index("reproduce:")
    commands = lines[reproduce + 1:lines.index("", reproduce)]
    assert commands and all(line.startswith("  harness run ") for line in commands)
    long = [line for line in lines if len(line) > COLUMNS and line not in commands
            and not line.startswith("EP families")]
    assert long == []


def test_each_cell_is_its_status_and_id_then_its_numbers_under_the_header():
    lines = terminal_lines()
    header = next(index for index, line in enumerate(lines) if line.split()[:2] == ["pass", "fail"])
    assert lines[header + 1].split() == ["FAILED", "ada-2gpu-torch2.11.0-tf5.9.0"]
    assert lines[header + 2].split() == ["3", "6", "7", "1", "1", "1", "12.3/12.1", "GiB", "12m", "35s"]
    columns = [match.end() for match in re.finditer(r"\S+", lines[header])][:6]  # right-aligned counts
    assert [match.end() for match in re.finditer(r"\S+", lines[header + 2])][:6] == columns
    assert "40.0-41.0 GiB x8" in "\n".join(lines)  # more than four GPUs: their range


def test_colour_marks_statuses_and_the_verdict_but_never_changes_the_text():
    plain, painted = terminal_lines(), terminal_lines(color=True)
    assert [ANSI.sub("", line) for line in painted] == plain
    assert "\x1b[31mFAILED \x1b[0m ada-2gpu" in "\n".join(painted)
    assert verdict_line(painted).startswith("harness: \x1b[31m1 of 5 cells failed")
    assert not any(ANSI.search(line) for line in plain)


def test_a_cell_that_ran_nothing_distributed_reads_not_run_in_its_own_colour():
    painted = render(load_results([str(RUN.parent / "notrun")]), "terminal", color=True).splitlines()
    plain = [ANSI.sub("", line) for line in painted]
    assert verdict_line(plain).startswith("harness: nothing distributed ran in any of 2 cells")
    assert verdict_line(painted).startswith("harness: \x1b[35mnothing distributed ran")  # neither green nor red
    assert "\x1b[35mNOT RUN\x1b[0m ada-1gpu-torch2.11.0-tf5.24.0" in painted
    assert "NOT RUN cpu-1rank-torch2.13.0-tf5.24.0" in plain
    assert not any(line.startswith(("PASSED", "harness: all", "harness: the only")) for line in plain)
    assert all(len(line) <= COLUMNS for line in plain if not line.startswith("EP families"))


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("environ", "stream", "expected"), [
    ({}, Tty(), True),
    ({}, io.StringIO(), False),  # a pipe or a file
    ({"NO_COLOR": "1"}, Tty(), False),
    ({"NO_COLOR": ""}, Tty(), True),  # no-color.org: set and non-empty
    ({"TERM": "dumb"}, Tty(), False),
])
def test_colour_only_on_a_tty_without_no_color(monkeypatch, environ, stream, expected):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    assert wants_color(stream) is expected


def test_paint_and_wrap():
    assert paint("x", "failed", False) == "x" and paint("x", "nothing", True) == "x"
    assert paint("x", "passed", True) == "\x1b[32mx\x1b[0m"
    assert wrap("a " * 60, indent=2, hang=3).splitlines()[1].startswith("     a")
    assert all(len(line) <= COLUMNS for line in wrap("word " * 100 + "x" * 200, indent=4).splitlines())


@pytest.mark.parametrize(("name", "starts"), [
    ("r.html", "<!DOCTYPE html>"), ("r.HTM", "<!DOCTYPE html>"), ("r.txt", "not run:\n"),
])
def test_report_output_format_follows_the_extension(tmp_path, name, starts):
    assert main(["report", str(RUN), "-o", str(tmp_path / name)]) == 0
    text = (tmp_path / name).read_text()
    assert text.startswith(starts) and not ANSI.search(text)


def test_report_output_with_an_unknown_extension_asks_for_a_format(tmp_path, capsys):
    assert main(["report", str(RUN), "-o", str(tmp_path / "r.md")]) == 2
    error = capsys.readouterr().err.strip()
    assert error == (f"harness: error: -o {tmp_path / 'r.md'}: cannot tell the format from .md; "
                     "pass --format pr-comment|summary|terminal|html")
    assert not (tmp_path / "r.md").exists()


def test_an_explicit_format_wins_over_the_extension(tmp_path):
    assert main(["report", str(RUN), "--format", "summary", "-o", str(tmp_path / "r.html")]) == 0
    assert not (tmp_path / "r.html").read_text().startswith("<!DOCTYPE")
