"""Results folders -> what the history keeps of each test, read in one streaming pass over each junit.xml.

The report's reader builds the whole results model (every property of every test, cleaned and typed); a night of
100 cells x 2,000 cases took 7 s that way, most of it on values the history never keeps. Here expat (with
junit's guard against any DTD, and its size cap) calls back for the few elements that matter, keeps only the
properties `rows.night_test` reads, and junit's own rules decide the test ids, reruns and outcomes, so a test
reads as it does in the report.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from xml.parsers import expat

from harness.contract import ENV_JSON, JUNIT_BYTES, JUNIT_XML, RUNNING_TEST
from harness.history.rows import NightCell, night_test, wanted_property
from harness.results import Outcome, paused_gc
from harness.results.files import read_json, read_regular, read_running_test
from harness.results.junit import (
    MAX_DEPTH,
    MAX_ELEMENTS,
    RefusedMarkup,
    attempts_outcome,
    attempts_time,
    grouped_attempts,
    guarded_parser,
    is_named,
    too_large,
)
from harness.results.reader import cell_folders
from harness.results.records import Fields, cell_info
from harness.results.values import TEXT_CHARS, clean_text

_RESULT_TAGS = frozenset(("failure", "error", "skipped"))
_ROOT_TAGS = ("testsuites", "testsuite")


# Below this many cells a night is read here: starting worker processes would cost more than it saves.
PARALLEL_FROM_CELLS = 8


def read_night(paths: Iterable[str | Path], workers: int | None = None) -> tuple[NightCell, ...]:
    """Every cell folder under `paths` (as `load_results` finds them), in their order; a cell whose junit.xml
    cannot be read keeps no tests, as in the report, where it is an errored cell. Reading is Python-bound (expat's
    callbacks), so a large night is read by one process per usable core (`workers`: how many, 1 = here)."""
    folders = list(cell_folders(paths))
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if len(folders) >= PARALLEL_FROM_CELLS else 1
    workers = max(1, min(workers, len(folders)))
    # Forked workers: spawned ones would run the caller's __main__ again. Forking a process that runs other threads
    # can copy a lock one of them holds, so such a caller reads here.
    if workers == 1 or threading.active_count() > 1:
        return tuple(_read_cells(folders))
    size = -(-len(folders) // (workers * 4))  # 4 parts a worker: one part is taken in while the next is read
    chunks = [folders[start:start + size] for start in range(0, len(folders), size)]
    with paused_gc(), ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        return tuple(cell for cells in pool.map(_read_cells, chunks) for cell in cells)  # map keeps the order


def _read_cells(folders: list[Path]) -> list[NightCell]:
    with paused_gc():
        return [read_cell_tests(folder) for folder in folders]


def read_cell_tests(folder: Path) -> NightCell:
    with contextlib.suppress(OSError):  # an lstat that fails: the reads below say nothing either
        if folder.is_symlink():  # never followed: the report's errored row for it, and no tests here
            return NightCell(cell=cell_info({}, folder.name, []).id, tests=())
    problems: list = []  # the report shows them; the history keeps numbers only
    env = Fields(ENV_JSON, read_json(folder / ENV_JSON, problems), problems)
    cell = cell_info(env.mapping("cell"), folder.name, problems).id
    try:
        entries, properties = _testcases(read_regular(folder / JUNIT_XML, JUNIT_BYTES))
    except (OSError, expat.ExpatError, RefusedMarkup, RecursionError):
        entries, properties = [], {}
    named = [entry for entry in entries if is_named(entry)]
    tests = {}
    for test_id, attempts in grouped_attempts(named).items():
        outcome = attempts_outcome(attempts)[0]
        tests[test_id] = night_test(test_id, outcome.value, attempts_time(attempts), properties.get(attempts[-1], {}))
    running = read_running_test(folder / RUNNING_TEST)
    if running is not None:  # the test pytest was running when it stopped: errored, never a pass (as the report)
        tests[running] = night_test(running, Outcome.ERRORED.value, 0.0, {})
    return NightCell(cell=cell, tests=tuple(tests.values()))


def _testcases(data: bytes) -> tuple[list[ET.Element], dict[ET.Element, dict[str, str]]]:
    """The <testcase> elements (attributes and result children only) and each one's wanted properties."""
    if len(data) > JUNIT_BYTES:
        return [], {}
    entries: list[ET.Element] = []
    properties: dict[ET.Element, dict[str, str]] = {}
    case_properties: list[dict[str, str]] = []  # those of each open <testcase>
    path: list[str] = []  # the open elements' tags
    open_cases: list[ET.Element] = []
    opened = 0  # elements in all: with len(path), held to junit's limits as the report's reader is
    parser = guarded_parser()

    def start(tag: str, attributes: dict[str, str]) -> None:
        nonlocal opened
        opened += 1
        if opened > MAX_ELEMENTS or len(path) >= MAX_DEPTH:
            raise RefusedMarkup(too_large(len(path) + 1, opened))
        # By frequency: a case's properties, then its other children, then the cases themselves.
        if tag == "property":
            if open_cases and path[-1] == "properties" and path[-2] == "testcase":
                name = attributes.get("name") or ""
                if wanted_property(name):
                    value = attributes.get("value") or ""
                    # As junit's reader does; expat's text is valid UTF-8 already, so only the cap can apply.
                    case_properties[-1][name] = value if len(value) <= TEXT_CHARS else clean_text(value)
        elif tag == "testcase":
            entry = ET.Element(tag, attributes)
            entries.append(entry)
            open_cases.append(entry)
            case_properties.append(properties.setdefault(entry, {}))
        elif tag in _RESULT_TAGS and open_cases and path[-1] == "testcase":
            open_cases[-1].append(ET.Element(tag, attributes))
        elif not path and tag not in _ROOT_TAGS:
            raise RefusedMarkup(f"not JUnit XML: the root is <{tag:.40}>")
        path.append(tag)

    def end(tag: str) -> None:
        if path.pop() == "testcase":
            open_cases.pop()
            case_properties.pop()

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.Parse(data, True)
    return entries, properties
