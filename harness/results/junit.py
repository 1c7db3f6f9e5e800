"""junit.xml -> a cell's tests, parsed by the standard library's expat with DTDs refused, whatever is installed."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import NoReturn
from xml.parsers import expat

from harness.contract import JUNIT_BYTES, JUNIT_XML
from harness.results.files import ID_CHARS, LINE_CHARS, NotRegular, read_regular
from harness.results.model import Outcome, Problem, TestResult
from harness.results.values import Number, capped, clean_text, finite, number

EXCERPT_LINES = 30
# Beyond its byte cap, what one junit.xml may hold: pytest nests five deep (testsuites, testsuite, testcase,
# properties, property) and writes some twenty elements a test. 32 MiB of tiny nested elements (`<a><a>...`) is
# 4.8 million of them, 1.4 GB as a tree: past either limit the file is refused before it grows that large.
MAX_DEPTH = 32
MAX_ELEMENTS = 500_000
# pytest's messages that say where a test broke but not why; the traceback's `E` line says why.
_GENERIC_MESSAGES = {"", "collection failure"}
_RESULT_TAGS = ("failure", "error", "skipped")


class Junit:
    def __init__(
        self,
        tests: tuple[TestResult, ...] = (),
        problem: Problem | None = None,
        time_s: Number | None = None,
        suite_properties: dict[str, str] | None = None,
        notes: tuple[Problem, ...] = (),
        stopped: bool = False,
        missing: bool = False,
    ) -> None:
        self.tests, self.problem, self.time_s = tests, problem, time_s
        self.missing = missing  # no junit.xml at all
        self.stopped = stopped  # pytest was interrupted during a test (a nameless <testcase>)
        self.suite_properties = suite_properties or {}
        self.notes = notes  # what was wrong but cost no test


class RefusedMarkup(ValueError):
    pass


# expat is chosen here, not by whatever else is installed (junitparser silently switches to lxml).
def guarded_parser() -> expat.XMLParserType:
    """An expat parser that refuses any DTD (so no entity of any kind); the caller sets its element handlers.
    Parsing raises `expat.ExpatError`, or `RefusedMarkup` for a declaration."""
    parser = expat.ParserCreate()
    parser.buffer_text = True

    def refuse(*_: object) -> NoReturn:
        raise RefusedMarkup("a DOCTYPE or entity declaration (results never declare one)")

    parser.StartDoctypeDeclHandler = refuse
    parser.EntityDeclHandler = refuse
    parser.ExternalEntityRefHandler = refuse
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    return parser


def too_large(depth: int, elements: int) -> str | None:
    """Why a document with `depth` elements open and `elements` opened in all is refused, or None."""
    if depth > MAX_DEPTH:
        return f"elements nested deeper than {MAX_DEPTH} (pytest nests 5)"
    if elements > MAX_ELEMENTS:
        return f"more than {MAX_ELEMENTS:,} elements"
    return None


def parse_xml(data: bytes) -> ET.Element:
    """A tree from expat with no DTD (so no entity of any kind) and no recursion, whatever is installed; at most
    MAX_DEPTH deep and MAX_ELEMENTS large (`RefusedMarkup` past either, before the tree grows past them)."""
    builder = ET.TreeBuilder()
    parser = guarded_parser()
    depth = elements = 0

    def start(tag: str, attributes: dict[str, str]) -> None:
        nonlocal depth, elements
        depth += 1
        elements += 1
        if depth > MAX_DEPTH or elements > MAX_ELEMENTS:
            raise RefusedMarkup(too_large(depth, elements))
        builder.start(tag, attributes)

    def end(tag: str) -> None:
        nonlocal depth
        depth -= 1
        builder.end(tag)

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = builder.data
    parser.Parse(data, True)
    return builder.close()


def read_junit_tests(path: Path) -> tuple[TestResult, ...]:
    """The tests of one junit.xml, read as a cell's are (none when it cannot be read)."""
    return read_junit(path).tests


def read_junit(path: Path) -> Junit:
    """Tests of one junit.xml; a file that cannot be read gives no tests and the Problem."""
    try:
        data = read_regular(path, JUNIT_BYTES)
    except FileNotFoundError:
        return Junit(problem=Problem(JUNIT_XML, "missing: pytest never wrote it (crash, kill or timeout)"),
                     missing=True)
    except NotRegular as error:
        return Junit(problem=Problem(JUNIT_XML, str(error)))
    except OSError as error:
        return Junit(problem=Problem(JUNIT_XML, f"unreadable: {error.strerror or error}"))
    if len(data) > JUNIT_BYTES:
        return Junit(problem=Problem(JUNIT_XML, f"larger than {JUNIT_BYTES:,} bytes; not read"))
    if not data.strip():
        return Junit(problem=Problem(JUNIT_XML, "empty"))
    try:
        root = parse_xml(data)
    except expat.ExpatError as error:
        return Junit(problem=Problem(JUNIT_XML, f"malformed or truncated XML: {error}"))
    except RefusedMarkup as error:
        return Junit(problem=Problem(JUNIT_XML, f"refused: {error}"))
    if root.tag not in ("testsuites", "testsuite"):
        return Junit(problem=Problem(JUNIT_XML, f"not JUnit XML: the root is <{clean_text(root.tag, 40)}>"))
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    suite_properties = {}
    for suite in suites:  # record_testsuite_property: <testsuite><properties><property .../>
        suite_properties.update(_properties(suite))
    times = [finite(number(suite.get("time"))) for suite in suites]
    entries = list(root.iter("testcase"))  # iterative: nested suites (up to MAX_DEPTH) cost no recursion
    # A <testcase> with no name is the test pytest was running when it was interrupted: not a test result.
    named = [entry for entry in entries if is_named(entry)]
    bad_times = [
        entry.get("time")
        for entry in (*suites, *entries)
        if entry.get("time") is not None and number(entry.get("time")) is None
    ]
    notes = (
        (Problem(JUNIT_XML, f"malformed attribute: time {bad_times[0]!r:.40} is not a number"),) if bad_times else ()
    )
    return Junit(
        tests=_group_attempts(named),
        stopped=len(named) < len(entries),
        time_s=sum(time for time in times if time is not None),
        suite_properties=suite_properties,
        notes=notes,
    )


def is_named(entry: ET.Element) -> bool:
    return bool(entry.get("name") or entry.get("classname") or entry.get("file"))


def _properties(element: ET.Element) -> dict[str, str]:
    found = {}
    for holder in element.findall("properties"):
        for prop in holder.findall("property"):
            found[clean_text(prop.get("name") or "", 200)] = clean_text(prop.get("value") or "")
    return found


def _group_attempts(entries: list[ET.Element]) -> tuple[TestResult, ...]:
    """pytest-rerunfailures leaves one empty <testcase> per rerun attempt before the final one, and a
    call failure followed by a teardown error gives two entries with results; group them per test."""
    return tuple(_test_result(test_id, attempts) for test_id, attempts in grouped_attempts(entries).items())


def grouped_attempts(entries: list[ET.Element]) -> dict[str, list[ET.Element]]:
    """The <testcase> entries per test id, in the file's order."""
    grouped: dict[str, list[ET.Element]] = {}
    for entry in entries:
        grouped.setdefault(test_id_of(entry), []).append(entry)
    return grouped


def _results_of(entry: ET.Element) -> list[ET.Element]:
    return [child for child in entry if child.tag in _RESULT_TAGS]


def attempts_outcome(entries: list[ET.Element]) -> tuple[Outcome, str | None, str | None, int]:
    """One test's outcome, message and excerpt over its entries (reruns included), and its number of attempts."""
    if len(entries) == 1 and not len(entries[0]) and not entries[0].text:  # the common pass: one bare entry
        return Outcome.PASSED, None, None, 1
    results = [_results_of(entry) for entry in entries]
    final_from = len(entries) - 1
    while final_from > 0 and results[final_from - 1]:
        final_from -= 1
    final = [result for entry_results in results[final_from:] for result in entry_results]
    attempts = final_from + 1
    outcome, message, excerpt = _outcome(final)
    if outcome is Outcome.PASSED and attempts > 1:
        outcome = Outcome.FLAKY
    return outcome, message, excerpt, attempts


def attempts_time(entries: list[ET.Element]) -> float:
    """The test's time: its attempts' times summed (one not a number counts 0)."""
    if len(entries) == 1:  # the common test, run once
        return finite(number(entries[0].get("time"))) or 0.0
    times = [finite(number(entry.get("time"))) for entry in entries]
    return finite(number(sum(time for time in times if time is not None))) or 0.0


def _test_result(test_id: str, entries: list[ET.Element]) -> TestResult:
    outcome, message, excerpt, attempts = attempts_outcome(entries)
    properties = _properties(entries[-1])
    return TestResult(
        test_id=test_id,
        name=capped(entries[-1].get("name") or test_id, ID_CHARS),
        outcome=outcome,
        message=message,
        excerpt=excerpt,
        attempts=attempts,
        duration_s=attempts_time(entries),
        properties=tuple(properties.items()),
    )


def _outcome(results: list[ET.Element]) -> tuple[Outcome, str | None, str | None]:
    for tag, outcome in (("failure", Outcome.FAILED), ("error", Outcome.ERRORED)):
        found = [result for result in results if result.tag == tag]
        if found:
            return outcome, _first_line(found[0].get("message"), found[0].text), _excerpt(found[0].text)
    for result in results:
        if result.tag == "skipped":
            outcome = Outcome.XFAILED if result.get("type") == "pytest.xfail" else Outcome.SKIPPED
            return outcome, _first_line(result.get("message"), result.text) or "no reason given", None
    return Outcome.PASSED, None, None


def test_id_of(entry: ET.Element) -> str:
    """pytest's node id back from xunit1's classname (dotted module + class) and file."""
    classname, name, file = entry.get("classname") or "", entry.get("name") or "", entry.get("file")
    if file:
        module = file.removesuffix(".py").replace("\\", ".").replace("/", ".")
        if not classname:  # a collection error names the module, not a test
            return capped(file, ID_CHARS)
        if classname == module:
            return capped(f"{file}::{name}", ID_CHARS)
        if classname.startswith(module + "."):
            return capped(f"{file}::{classname[len(module) + 1 :].replace('.', '::')}::{name}", ID_CHARS)
    return capped(f"{classname}::{name}" if classname else name, ID_CHARS)


def _first_line(message: str | None, text: str | None) -> str | None:
    first = next((line.strip() for line in (message or "").splitlines() if line.strip()), "")
    if first in _GENERIC_MESSAGES:
        # The last `E   ...` line of the traceback is the exception itself.
        raised = [line[1:].strip() for line in (text or "").splitlines() if line.startswith("E ")]
        first = f"{first}: {raised[-1]}" if first and raised else (raised[-1] if raised else first)
    first = first.removeprefix("AssertionError: ")
    return clean_text(first) or None


def _excerpt(text: str | None) -> str | None:
    lines = (text or "").rstrip().splitlines()
    if len(lines) > EXCERPT_LINES:
        lines = [f"... {len(lines) - EXCERPT_LINES} lines cut ...", *lines[-EXCERPT_LINES:]]
    return "\n".join(clean_text(line, LINE_CHARS) for line in lines) or None


def with_stopped_test(junit: Junit, running: str | None) -> tuple[TestResult, ...]:
    """The tests, with the one pytest was running when it stopped as errored: never a pass. pytest writes an
    interrupted test as a <testcase> without a name (read as a pass, it made an interrupted cell read "1 test:
    1 passed"); the running-test file names it, where harness run had the plugin write one."""
    if not junit.stopped and running is None:
        return junit.tests
    tests = tuple(test for test in junit.tests if test.test_id != running)
    test_id = running or "(the test that was running; its name was not recorded)"
    stopped = TestResult(test_id=test_id, name=test_id.rsplit("::", 1)[-1], outcome=Outcome.ERRORED,
                         message="was still running when pytest stopped (timed out, crashed or interrupted)",
                         stopped=True)
    return (*tests, stopped)
