"""Hostile matrices, as a pull request could write them: each is refused with one line naming the file and
the limit, before anything is expanded or written to GITHUB_OUTPUT."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli import main
from harness.plan.files import MAX_YAML_BYTES
from harness.plan.matrix import MAX_CELLS, MAX_PRODUCT

AXES = "axes: {{gpu: [ada], gpus: [1], torch: [{torch}], transformers: [{transformers}]}}\n"


def versions(count: int, major: int) -> str:
    return ", ".join(f"'{major}.{i}.0'" for i in range(count))


def alias_bomb(levels: int) -> str:
    """`description` lists level N, which lists level N-1 ten times: 10**levels strings from a few hundred
    bytes (str() of it hangs at 9 levels)."""
    entries = ["&l0 lol"] + [f"&l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, levels + 1)]
    return f"description: [{', '.join(entries)}]\n"


CASES = {
    # a few hundred bytes that str() would turn into 10**6 strings (10**9 hangs)
    "alias bomb in description": (
        alias_bomb(6) + AXES.format(torch="'2.11.0'", transformers="'5.9.0'"),
        "alias *",
    ),
    "product over the bound": (
        AXES.format(torch=versions(70, 2), transformers=versions(70, 5)),
        f"their product has 4,900 cells; at most {MAX_PRODUCT:,}",
    ),
    "300 cells": (
        AXES.format(torch=versions(15, 2), transformers=versions(20, 5)),
        f"300 cells; GitHub runs at most {MAX_CELLS} jobs per matrix",
    ),
    "markers with a newline": (
        AXES.format(torch="'2.11.0'", transformers="'5.9.0'") + "markers: \"deep\\nand not wide\"\n",
        "markers: expected a pytest marker expression",
    ),
    "markers over the length": (
        AXES.format(torch="'2.11.0'", transformers="'5.9.0'") + "markers: '" + "deep or " * 40 + "wide'\n",
        "markers: expected a pytest marker expression (one line, at most 200 characters)",
    ),
    "markers not a string": (
        AXES.format(torch="'2.11.0'", transformers="'5.9.0'") + "markers: [deep]\n",
        "markers: expected a pytest marker expression",
    ),
    "oversized file": (
        "description: '" + "x" * (MAX_YAML_BYTES + 1) + "'\n" + AXES.format(torch="'2.11.0'", transformers="'5.9.0'"),
        f"a matrix or runners file may have at most {MAX_YAML_BYTES:,}",
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_hostile_matrix_is_refused_in_one_line(tmp_path, capsys, name):
    text, message = CASES[name]
    path = tmp_path / "m.yaml"
    path.write_text(text)
    assert main(["matrix", "--matrix", str(path), "--format", "github"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert str(path) in captured.err and message in captured.err, captured.err[:500]
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err


def test_a_fifo_named_as_a_runners_file_is_refused(tmp_path, capsys):
    import os

    os.mkfifo(tmp_path / "runners.yaml")  # read_yaml would block on it forever
    (tmp_path / "m.yaml").write_text(AXES.format(torch="'2.11.0'", transformers="'5.9.0'"))
    assert main(["matrix", "--matrix", str(tmp_path / "m.yaml")]) == 2
    assert "runners.yaml: not a regular file" in capsys.readouterr().err


def test_a_matrix_of_exactly_the_limit_expands(unreachable_index, tmp_path, capsys):
    path = tmp_path / "m.yaml"
    path.write_text(AXES.format(torch=versions(16, 2), transformers=versions(16, 5)))
    assert main(["matrix", "--matrix", str(path), "--format", "ids"]) == 0
    assert len(capsys.readouterr().out.split()) == MAX_CELLS


def test_a_matrix_marker_expression_reaches_pytest_as_one_argument(tmp_path):
    """`markers` replaces the project's default selection (pyproject's addopts `-m`): pytest takes the last `-m`."""
    from harness.engines.base import pytest_command
    from harness.plan.matrix import load_matrix

    path = tmp_path / "m.yaml"
    path.write_text(AXES.format(torch="'2.11.0'", transformers="'5.9.0'") + "markers: 'not workflows; rm -rf /'\n")
    [cell] = load_matrix(str(path)).cells
    command = pytest_command(cell, Path("python"), tmp_path, ["-k", "x"])
    assert command[3:6] == ["tests/gpu", "-m", "not workflows; rm -rf /"]  # an argument, never a shell's
    path.write_text(AXES.format(torch="'2.11.0'", transformers="'5.9.0'"))
    [plain] = load_matrix(str(path)).cells
    assert pytest_command(plain, Path("python"), tmp_path, [])[3:5] == ["tests/gpu", "-p"]
