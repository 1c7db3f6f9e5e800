"""Each test's seconds in the newest earlier run of a cell that the results folder kept (`<results>/.earlier/`):
what a cell packing its tests starts first (the longest) and how the progress line estimates the time left
(`--pack-durations`). Read as any junit.xml is (harness.results.junit: untrusted, capped); a test without a
finite, non-negative time is left out, and so is a kept run that cannot be read: the cell then weighs tests
by their world size and counts them, as it does with no earlier run."""

from __future__ import annotations

import json
import math
from pathlib import Path

from harness.contract import EARLIER_FOLDER, JUNIT_XML
from harness.results.junit import read_junit_tests

MAX_RUNS_LOOKED_AT = 20  # the newest kept runs first; a cell absent from all of them has no durations


def earlier_durations(results_root: Path, cell_id: str) -> dict[str, float]:
    """{test id: seconds} from the newest kept run that holds this cell's junit.xml as a regular file; {} if none."""
    kept = results_root / EARLIER_FOLDER
    try:
        runs = sorted((entry for entry in kept.iterdir() if entry.is_dir() and not entry.is_symlink()), reverse=True)
    except OSError:
        return {}
    for run in runs[:MAX_RUNS_LOOKED_AT]:
        junit = run / cell_id / JUNIT_XML
        if junit.is_symlink() or (run / cell_id).is_symlink() or not junit.is_file():
            continue
        durations = {test.test_id: test.duration_s for test in read_junit_tests(junit)
                     if isinstance(test.duration_s, float) and _usable(test.duration_s)}
        if durations:
            return durations
    return {}


def write_durations(durations: dict[str, float], path: Path) -> Path:
    path.write_text(json.dumps(durations, sort_keys=True), encoding="utf-8")
    return path


def _usable(seconds: float) -> bool:  # a Labelled number (inf, nan, out of range) is none
    return math.isfinite(seconds) and seconds >= 0
