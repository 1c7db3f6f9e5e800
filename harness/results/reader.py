"""Read `results/<cell-id>/` folders into one frozen `ResultSet`.

Every file in a cell folder may be missing, empty, malformed, huge or hostile: what cannot be read becomes
a `Problem` value on its cell (and, for junit.xml or an unreadable folder, an *errored* cell), never an
exception. Only regular files are opened (a FIFO would block the reader, a symbolic link point anywhere),
each read up to its size cap. Numbers are normalized (`model.number`), texts capped and made valid UTF-8
(a lone-surrogate escape in JSON, a folder name that is not UTF-8). Only bad input from the user (a path
that does not exist, a folder that holds no cells) raises `ConfigError`.

junit.xml is parsed by the standard library's expat, chosen here and not by whatever else is installed
(junitparser silently switches to lxml), with DTDs refused: a results file never declares entities.
"""

from __future__ import annotations

import errno
import gc
import json
import os
import re
import shlex
import stat
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO
from xml.parsers import expat

from harness.contract import (
    CONTRACT_FILES,
    ENV_JSON,
    ERROR_KINDS,
    JUNIT_BYTES,
    JUNIT_XML,
    MEMORY_JSON,
    PYTEST_LOG,
    RUNNING_TEST,
    SCHEMA,
    STATUS_NOT_RUN,
    STATUSES,
)
from harness.errors import ConfigError
from harness.results.model import (
    CellInfo,
    CellResult,
    CellStatus,
    Counts,
    GpuMemory,
    Number,
    Outcome,
    Problem,
    ResultSet,
    SuiteInfo,
    TestResult,
    capped,
    finite,
    natural_key,
    nothing_distributed_ran,
    number,
)

EXCERPT_LINES = 30
LINE_CHARS = 500  # per line of an excerpt or log tail
TEXT_CHARS = 2_000  # any other text read from a file
ID_CHARS = 1_000  # cell and test ids
LOG_TAIL_LINES = 30
LOG_TAIL_BYTES = 64 * 1024
JSON_BYTES = 4 * 1024 * 1024  # an env.json or memory.json beyond this is not one harness wrote
MAX_GPUS = 64  # per cell; a runner has at most 8, MIG slices included a few dozen

# pytest's messages that say where a test broke but not why; the traceback's `E` line says why.
_GENERIC_MESSAGES = {"", "collection failure"}
_CELL_ID = re.compile(r"^(?P<gpu>[a-z0-9]+)-(?P<gpus>\d+)(?:gpu|rank)-torch(?P<torch>[^-]+)-tf(?P<transformers>.+)$")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_RESULT_TAGS = ("failure", "error", "skipped")


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while a large result set is built or rendered: it makes no
    garbage cycles, and each full collection would walk all of its (up to millions of) objects again."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# ---------------------------------------------------------------------------------------------
# Finding cell folders


def load_results(paths: Iterable[str | Path]) -> ResultSet:
    """Read every cell folder under `paths`: a cell folder itself, a folder of cell folders, or a
    folder of downloaded artifacts holding cell folders one level down."""
    with paused_gc():
        return _load_results(paths)


def _load_results(paths: Iterable[str | Path]) -> ResultSet:
    folders: dict[Path, None] = {}
    for path in map(Path, paths):
        if not path.is_dir():
            raise ConfigError(f"results path {path} is not a folder")
        try:
            found = find_cell_folders(path)
        except OSError as error:
            raise ConfigError(f"results path {path}: cannot list it: {error.strerror or error}") from None
        if not found:
            raise ConfigError(f"no cell folders under {path} (none holds {', '.join(CONTRACT_FILES)})")
        folders.update(dict.fromkeys(folder.absolute() for folder in found))
    cells = sorted((read_cell(folder) for folder in folders), key=lambda cell: natural_key(cell.id))
    return ResultSet(tuple(_flag_duplicate_ids(cells)))


def _flag_duplicate_ids(cells: list[CellResult]) -> list[CellResult]:
    # Two folders for one cell (an artifact downloaded twice): keep both rows, say so on the second.
    first_folder: dict[str, str] = {}
    flagged = []
    for cell in cells:
        if cell.id in first_folder:
            problem = Problem(ENV_JSON, f"cell {cell.id} also read from {first_folder[cell.id]}")
            cell = replace(cell, problems=(*cell.problems, problem))
        first_folder.setdefault(cell.id, cell.folder)
        flagged.append(cell)
    return flagged


def find_cell_folders(path: Path) -> list[Path]:
    if _is_cell_folder(path):
        return [path]
    found = []
    for child in _subfolders(path):
        if _is_cell_folder(child):
            found.append(child)
        else:  # an artifact folder holding cell folders
            found.extend(grandchild for grandchild in _subfolders(child) if _is_cell_folder(grandchild))
    return found


def _subfolders(path: Path) -> list[Path]:
    try:
        return sorted(child for child in path.iterdir() if child.is_dir())
    except OSError:
        return []  # an artifact folder nobody may list: _is_cell_folder made it a row already


def _is_cell_folder(path: Path) -> bool:
    try:
        return any((path / name).is_file() for name in CONTRACT_FILES)
    except OSError:
        return True  # unreadable: one errored row that says why, not a crash and not a silent gap


# ---------------------------------------------------------------------------------------------
# One cell


def read_cell(folder: Path) -> CellResult:
    try:
        return _read_cell(folder)
    except (OSError, RecursionError, MemoryError, ValueError) as error:
        # What the per-file reads below do not foresee still costs one row, never the report.
        why = f"unreadable folder: {type(error).__name__}: {getattr(error, 'strerror', None) or error}"
        info = _cell_info({}, folder.name, [])
        return CellResult(
            info=info,
            status=CellStatus.ERRORED,
            reason=_text(why),
            folder=_text(str(folder), len(str(folder))),
            reproduce=_reproduce(None, info),
        )


def _read_cell(folder: Path) -> CellResult:
    problems: list[Problem] = []
    env = _read_json(folder / ENV_JSON, problems)
    memory_doc = _read_json(folder / MEMORY_JSON, problems)
    junit = _read_junit(folder / JUNIT_XML)
    if junit.problem:
        problems.append(junit.problem)
    problems.extend(junit.notes)

    env_fields = _Fields(ENV_JSON, env, problems)
    info = _cell_info(env_fields.mapping("cell"), folder.name, problems)
    env_status = env_fields.choice("status", STATUSES)
    exit_code = env_fields.integer("exit_code")
    tests = _with_stopped_test(junit, _read_running_test(folder / RUNNING_TEST))
    status, reason = _cell_status(
        env_status, env_fields.text("error"), exit_code, junit.problem, Counts.of(tests), nothing_distributed_ran(tests)
    )
    memory, memory_note = _read_memory(memory_doc, problems)
    duration_s = env_fields.number("duration_s")
    return CellResult(
        info=info,
        status=status,
        reason=reason,
        error_kind=env_fields.choice("error_kind", ERROR_KINDS) if status is CellStatus.ERRORED else None,
        tests=tests,
        suite=SuiteInfo.of(junit.suite_properties),
        memory=memory,
        memory_note=memory_note,
        duration_s=duration_s if duration_s is not None else junit.time_s,
        versions=tuple(sorted(env_fields.string_map("versions").items())),
        exit_code=exit_code,
        git_sha=env_fields.text("git_sha"),
        git_dirty=env_fields.boolean("git_dirty"),
        trigger_sha=env_fields.text("trigger_sha"),
        host=env_fields.text("host"),
        runner=env_fields.text("runner"),
        driver=env_fields.text("driver"),
        reproduce=_reproduce(env_fields.text("reproduce"), info),
        pytest_args=env_fields.command_words("pytest_args", PYTEST_ARGS_MAX, PYTEST_ARGS_CHARS),
        log_tail=_read_log_tail(folder / PYTEST_LOG, problems) if status is CellStatus.ERRORED else None,
        problems=tuple(problems),
        folder=_text(str(folder), len(str(folder))),
    )


def _cell_status(
    env_status: str | None,
    env_error: str | None,
    exit_code: int | None,
    junit_problem: Problem | None,
    counts: Counts,
    nothing_distributed: bool,
) -> tuple[CellStatus, str | None]:
    if env_status == "errored":
        return CellStatus.ERRORED, env_error or "env.json says errored and gives no reason"
    if junit_problem:
        return CellStatus.ERRORED, str(junit_problem)
    if env_status is None:  # harness writes a status on every way out: without one the run never finished
        return CellStatus.ERRORED, "env.json gives no status: the run did not finish (interrupted or killed)"
    if counts.failed or counts.errored:
        return CellStatus.FAILED, None
    if env_status == "failed":
        return CellStatus.FAILED, f"pytest exited with code {exit_code} but junit.xml records no failure"
    # Either one saying so is enough: a cell that ran nothing distributed is never read as green.
    if env_status == STATUS_NOT_RUN or nothing_distributed:
        return CellStatus.NOT_RUN, None
    return CellStatus.PASSED, None


def _cell_info(cell: Mapping[str, object], folder_name: str, problems: list[Problem]) -> CellInfo:
    fields = _Fields("env.json: cell", cell, problems)
    cell_id = capped(fields.text("id") or _text(folder_name, ID_CHARS), ID_CHARS)
    # Without env.json the id still says what the cell was.
    parsed = _CELL_ID.match(cell_id)
    from_id = parsed.groupdict() if parsed else {}
    gpus = fields.integer("gpus")
    return CellInfo(
        id=cell_id,
        gpu=fields.text("gpu") or from_id.get("gpu"),
        gpus=gpus if gpus is not None else (int(from_id["gpus"]) if from_id else None),
        torch=fields.text("torch") or from_id.get("torch"),
        transformers=fields.text("transformers") or from_id.get("transformers"),
        matrix=fields.text("matrix"),
    )


def _reproduce(recorded: str | None, info: CellInfo) -> str:
    # Shown in a shell block: trust env.json's command only when it is one plain, short line.
    if (
        recorded
        and recorded.startswith("harness run ")
        and recorded.isprintable()
        and "`" not in recorded
        and len(recorded) < 500
    ):
        return recorded
    matrix = f" --matrix {shlex.quote(info.matrix)}" if info.matrix else ""
    return f"harness run{matrix} --cell {shlex.quote(info.id)}"


# The run's pytest arguments go into a command shown in a shell block: a few plain, short strings.
PYTEST_ARGS_MAX = 32
PYTEST_ARGS_CHARS = 400  # all of them together; _reproduce bounds the recorded command likewise


def _text(value: str | None, limit: int = TEXT_CHARS) -> str | None:
    """Capped, and valid UTF-8: a lone surrogate (from a JSON escape, or a name that is not UTF-8) becomes
    "?", as it would stop any rendering from being written."""
    if value is None:
        return None
    value = value if len(value) <= limit else value[: limit - 1] + "…"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "replace").decode("utf-8")
    return value


class _NotRegular(OSError):
    """A contract file that is a FIFO, socket, device, folder or symbolic link: never opened for reading."""


def _read_regular(path: Path, limit: int) -> bytes:
    """At most `limit + 1` bytes of a regular file (one more than the cap, so the caller sees it was larger)."""
    with _open_regular(path) as stream:
        return stream.read(limit + 1)


def _open_regular(path: Path) -> BinaryIO:
    """A regular file opened for reading, checked on the open descriptor (no window to swap it). O_NONBLOCK:
    opening a FIFO returns at once instead of waiting for a writer; O_NOFOLLOW: no symbolic link."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise _NotRegular("a symbolic link; not followed") from None
        raise
    stream = os.fdopen(descriptor, "rb")
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        stream.close()
        raise _NotRegular(f"not a regular file ({_file_kind(mode)}); not read")
    return stream


def _file_kind(mode: int) -> str:
    kinds = {stat.S_ISFIFO: "a FIFO", stat.S_ISSOCK: "a socket", stat.S_ISDIR: "a folder",
             stat.S_ISCHR: "a device", stat.S_ISBLK: "a device"}
    return next((name for test, name in kinds.items() if test(mode)), "not a file")


# ---------------------------------------------------------------------------------------------
# JSON files and the log


def _read_json(path: Path, problems: list[Problem]) -> Mapping[str, object]:
    try:
        data = _read_regular(path, JSON_BYTES)
    except FileNotFoundError:
        problems.append(Problem(path.name, "missing"))
        return {}
    except _NotRegular as error:
        problems.append(Problem(path.name, str(error)))
        return {}
    except OSError as error:
        problems.append(Problem(path.name, f"unreadable: {error.strerror or error}"))
        return {}
    if len(data) > JSON_BYTES:
        problems.append(Problem(path.name, f"larger than {JSON_BYTES // (1024 * 1024)} MiB; not read"))
        return {}
    text = data.decode("utf-8", errors="replace")
    if not text.strip():
        problems.append(Problem(path.name, "empty"))
        return {}
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as error:
        problems.append(Problem(path.name, f"malformed JSON: {_text(str(error), 200)}"))
        return {}
    if not isinstance(document, dict):
        problems.append(Problem(path.name, f"expected an object, found {type(document).__name__}"))
        return {}
    schema = document.get("schema")
    if schema != SCHEMA:
        problems.append(Problem(path.name, f"schema {schema!r:.40}, this reader knows {SCHEMA}"))
    return document


def _read_log_tail(path: Path, problems: list[Problem]) -> str | None:
    try:
        with _open_regular(path) as log:
            log.seek(max(0, log.seek(0, 2) - LOG_TAIL_BYTES))
            data = log.read()
    except FileNotFoundError:
        problems.append(Problem(path.name, "missing"))
        return None
    except _NotRegular as error:
        problems.append(Problem(path.name, str(error)))
        return None
    except OSError as error:
        problems.append(Problem(path.name, f"unreadable: {error.strerror or error}"))
        return None
    lines = _ANSI.sub("", data.decode("utf-8", errors="replace")).rstrip().splitlines()
    return "\n".join(_text(line, LINE_CHARS) for line in lines[-LOG_TAIL_LINES:]) or None


RUNNING_TEST_BYTES = 4 * ID_CHARS


def _read_running_test(path: Path) -> str | None:
    """The id of the test that was running when pytest stopped (the ranks plugin removes the file when a test
    ends), or None. A regular file only, read bounded: it came from the tested code's run."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return None
        data = os.read(descriptor, RUNNING_TEST_BYTES)
    except OSError:
        return None
    finally:
        os.close(descriptor)
    lines = data.decode("utf-8", errors="replace").splitlines()
    return capped(_text(lines[0].strip(), ID_CHARS), ID_CHARS) if lines and lines[0].strip() else None


def _with_stopped_test(junit: _Junit, running: str | None) -> tuple[TestResult, ...]:
    """The tests, with the one pytest was running when it stopped as errored: never a pass. pytest writes an
    interrupted test as a <testcase> without a name (read as a pass, it made an interrupted cell read "1 test:
    1 passed"); the running-test file names it, where harness run had the plugin write one."""
    if not junit.stopped and running is None:
        return junit.tests
    tests = tuple(test for test in junit.tests if test.test_id != running)
    test_id = running or "(the test that was running; its name was not recorded)"
    stopped = TestResult(test_id=test_id, name=test_id.rsplit("::", 1)[-1], outcome=Outcome.ERRORED,
                         message="was still running when pytest stopped (timed out, crashed or interrupted)")
    return (*tests, stopped)


def _read_memory(document: Mapping[str, object], problems: list[Problem]) -> tuple[tuple[GpuMemory, ...], str | None]:
    if not document:
        return (), "memory.json missing or unreadable"
    fields = _Fields(MEMORY_JSON, document, problems)
    if fields.boolean("available") is False:
        return (), fields.text("reason") or "memory.json says not available"
    gpus = []
    entries = fields.items("gpus")
    if len(entries) > MAX_GPUS:
        problems.append(Problem(MEMORY_JSON, f"lists {len(entries)} GPUs; the first {MAX_GPUS} are read"))
    for position, entry in enumerate(entries[:MAX_GPUS]):
        gpu = _Fields(f"memory.json: gpus[{position}]", entry, problems)
        index = gpu.integer("index")
        gpus.append(
            GpuMemory(
                index=index if index is not None and 0 <= index < 1024 else position,
                name=gpu.text("name"),
                uuid=gpu.text("uuid"),
                total_mib=gpu.number("total_mib"),
                used_before_mib=gpu.number("used_before_mib"),
                peak_used_mib=gpu.number("peak_used_mib"),
            )
        )
    return tuple(sorted(gpus, key=lambda gpu: gpu.index)), None if gpus else "memory.json lists no GPUs"


class _Fields:
    """Typed reads from one JSON object; a value of the wrong type is a Problem and reads as None."""

    def __init__(self, source: str, document: object, problems: list[Problem]):
        self.source = source
        self.document = document if isinstance(document, Mapping) else {}
        self.problems = problems
        if not isinstance(document, Mapping):
            self._wrong("", document, "an object")

    def _wrong(self, key: str, value: object, expected: str) -> None:
        where = f"key {key!r:.80}" if key else "value"
        self.problems.append(Problem(self.source, f"{where} is {_short_repr(value)}, expected {expected}"))

    def _get(self, key: str, types: tuple[type, ...], expected: str) -> object:
        value = self.document.get(key)
        if value is None:
            return None
        # bool is an int in Python, never a count or a duration here.
        if isinstance(value, types) and not (isinstance(value, bool) and bool not in types):
            return value
        self._wrong(key, value, expected)
        return None

    def text(self, key: str) -> str | None:
        return _text(self._get(key, (str,), "a string"))

    def integer(self, key: str) -> int | None:
        value = self._get(key, (int,), "an integer")
        if value is not None and abs(value) > 2**63:
            self._wrong(key, value, "an integer of at most 64 bits")
            return None
        return value

    def number(self, key: str) -> Number | None:
        return number(self._get(key, (int, float), "a number"))

    def boolean(self, key: str) -> bool | None:
        return self._get(key, (bool,), "true or false")

    def mapping(self, key: str) -> Mapping[str, object]:
        return self._get(key, (dict,), "an object") or {}

    def items(self, key: str) -> list[object]:
        return self._get(key, (list,), "a list") or []

    def choice(self, key: str, allowed: tuple[str, ...]) -> str | None:
        value = self.text(key)
        if value is not None and value not in allowed:
            self._wrong(key, value, " or ".join(allowed))
            return None
        return value

    def command_words(self, key: str, max_words: int, max_chars: int) -> tuple[str, ...] | None:
        """A list of words for a command shown in a shell block: printable strings without a backtick, at most
        `max_words` of `max_chars` in all. None where absent, or (a Problem) where it is anything else."""
        words = self._get(key, (list,), "a list")
        if words is None:
            return None
        if (
            len(words) <= max_words
            and all(isinstance(word, str) and word.isprintable() and "`" not in word for word in words)
            and sum(len(word) for word in words) <= max_chars
        ):
            return tuple(words)
        self._wrong(key, words, f"at most {max_words} printable strings without a backtick, {max_chars} characters")
        return None

    def string_map(self, key: str) -> dict[str, str | None]:
        entries = self.mapping(key)
        inner = _Fields(f"{self.source}: {key}", entries, self.problems)
        return {_text(str(name), 100): inner.text(name) for name in list(entries)[:50]}


def _short_repr(value: object) -> str:
    if isinstance(value, (dict, list)):
        return f"a {type(value).__name__} of {len(value)}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**20:
        return "a very large integer"
    return f"{value!r:.80}"


# ---------------------------------------------------------------------------------------------
# junit.xml


class _Junit:
    def __init__(
        self,
        tests: tuple[TestResult, ...] = (),
        problem: Problem | None = None,
        time_s: Number | None = None,
        suite_properties: dict[str, str] | None = None,
        notes: tuple[Problem, ...] = (),
        stopped: bool = False,
    ) -> None:
        self.tests, self.problem, self.time_s = tests, problem, time_s
        self.stopped = stopped  # pytest was interrupted during a test (a nameless <testcase>)
        self.suite_properties = suite_properties or {}
        self.notes = notes  # what was wrong but cost no test


class _RefusedMarkup(ValueError):
    pass


def parse_xml(data: bytes) -> ET.Element:
    """A tree from expat with no DTD (so no entity of any kind) and no recursion, whatever is installed."""
    builder = ET.TreeBuilder()
    parser = expat.ParserCreate()
    parser.buffer_text = True

    def refuse(*_: object) -> None:
        raise _RefusedMarkup("a DOCTYPE or entity declaration (results never declare one)")

    parser.StartDoctypeDeclHandler = refuse
    parser.EntityDeclHandler = refuse
    parser.ExternalEntityRefHandler = refuse
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.StartElementHandler = builder.start
    parser.EndElementHandler = builder.end
    parser.CharacterDataHandler = builder.data
    parser.Parse(data, True)
    return builder.close()


def read_junit_tests(path: Path) -> tuple[TestResult, ...]:
    """The tests of one junit.xml, read as a cell's are (none when it cannot be read)."""
    return _read_junit(path).tests


def _read_junit(path: Path) -> _Junit:
    """Tests of one junit.xml; a file that cannot be read gives no tests and the Problem."""
    try:
        data = _read_regular(path, JUNIT_BYTES)
    except FileNotFoundError:
        return _Junit(problem=Problem(JUNIT_XML, "missing: pytest never wrote it (crash, kill or timeout)"))
    except _NotRegular as error:
        return _Junit(problem=Problem(JUNIT_XML, str(error)))
    except OSError as error:
        return _Junit(problem=Problem(JUNIT_XML, f"unreadable: {error.strerror or error}"))
    if len(data) > JUNIT_BYTES:
        return _Junit(problem=Problem(JUNIT_XML, f"larger than {JUNIT_BYTES:,} bytes; not read"))
    if not data.strip():
        return _Junit(problem=Problem(JUNIT_XML, "empty"))
    try:
        root = parse_xml(data)
    except expat.ExpatError as error:
        return _Junit(problem=Problem(JUNIT_XML, f"malformed or truncated XML: {error}"))
    except _RefusedMarkup as error:
        return _Junit(problem=Problem(JUNIT_XML, f"refused: {error}"))
    if root.tag not in ("testsuites", "testsuite"):
        return _Junit(problem=Problem(JUNIT_XML, f"not JUnit XML: the root is <{_text(root.tag, 40)}>"))
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    suite_properties = {}
    for suite in suites:  # record_testsuite_property: <testsuite><properties><property .../>
        suite_properties.update(_properties(suite))
    times = [finite(number(suite.get("time"))) for suite in suites]
    entries = list(root.iter("testcase"))  # iterative: nested suites of any depth cost no recursion
    # A <testcase> with no name is the test pytest was running when it was interrupted: not a test result.
    named = [entry for entry in entries if entry.get("name") or entry.get("classname") or entry.get("file")]
    bad_times = [
        entry.get("time")
        for entry in (*suites, *entries)
        if entry.get("time") is not None and number(entry.get("time")) is None
    ]
    notes = (
        (Problem(JUNIT_XML, f"malformed attribute: time {bad_times[0]!r:.40} is not a number"),) if bad_times else ()
    )
    return _Junit(
        tests=_group_attempts(named),
        stopped=len(named) < len(entries),
        time_s=sum(time for time in times if time is not None),
        suite_properties=suite_properties,
        notes=notes,
    )


def _properties(element: ET.Element) -> dict[str, str]:
    found = {}
    for holder in element.findall("properties"):
        for prop in holder.findall("property"):
            found[_text(prop.get("name") or "", 200)] = _text(prop.get("value") or "")
    return found


def _group_attempts(entries: list[ET.Element]) -> tuple[TestResult, ...]:
    """pytest-rerunfailures leaves one empty <testcase> per rerun attempt before the final one, and a
    call failure followed by a teardown error gives two entries with results; group them per test."""
    grouped: dict[str, list[ET.Element]] = {}
    for entry in entries:
        grouped.setdefault(_test_id(entry), []).append(entry)
    return tuple(_test_result(test_id, attempts) for test_id, attempts in grouped.items())


def _results_of(entry: ET.Element) -> list[ET.Element]:
    return [child for child in entry if child.tag in _RESULT_TAGS]


def _test_result(test_id: str, entries: list[ET.Element]) -> TestResult:
    results = [_results_of(entry) for entry in entries]
    final_from = len(entries) - 1
    while final_from > 0 and results[final_from - 1]:
        final_from -= 1
    final = [result for entry_results in results[final_from:] for result in entry_results]
    attempts = final_from + 1
    outcome, message, excerpt = _outcome(final)
    if outcome is Outcome.PASSED and attempts > 1:
        outcome = Outcome.FLAKY
    times = [finite(number(entry.get("time"))) for entry in entries]
    properties = _properties(entries[-1])
    return TestResult(
        test_id=test_id,
        name=capped(entries[-1].get("name") or test_id, ID_CHARS),
        outcome=outcome,
        message=message,
        excerpt=excerpt,
        attempts=attempts,
        duration_s=number(sum(time for time in times if time is not None)) or 0.0,
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


def _test_id(entry: ET.Element) -> str:
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
    return _text(first) or None


def _excerpt(text: str | None) -> str | None:
    lines = (text or "").rstrip().splitlines()
    if len(lines) > EXCERPT_LINES:
        lines = [f"... {len(lines) - EXCERPT_LINES} lines cut ...", *lines[-EXCERPT_LINES:]]
    return "\n".join(_text(line, LINE_CHARS) for line in lines) or None
