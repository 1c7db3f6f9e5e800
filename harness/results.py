"""Read `results/<cell-id>/` folders into one frozen model.

Every file in a cell folder may be missing, empty or malformed: what cannot be read becomes a
`Problem` value on its cell (and, for junit.xml, an *errored* cell), never an exception. Only bad
input from the user (a path that does not exist, a folder that holds no cells) raises `ConfigError`.

The module also reduces a result set to a `Digest` (the numbers a later run compares against) and
compares a result set with one (`compare`), so a baseline can be a results folder or the digest
carried by a previous PR comment.
"""

from __future__ import annotations

import base64
import binascii
import gc
import json
import re
import shlex
import zlib
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from xml.etree.ElementTree import ParseError

from junitparser import Error, Failure, JUnitXml, JUnitXmlError, Properties, Skipped

from harness.errors import ConfigError

CONTRACT_FILES = ("junit.xml", "env.json", "memory.json", "pytest.log")
SCHEMA = 1
EXCERPT_LINES = 30
LOG_TAIL_LINES = 30
LOG_TAIL_BYTES = 64 * 1024

# What the suite records per test case with record_property.
GRAD_ERROR = "max_rel_grad_error"
GRAD_BOUND = "grad_error_bound"
ROUTING_MARGIN = "min_routing_margin"
PEAK_ALLOCATED_PREFIX = "peak_allocated_mib."

# pytest's messages that say where a test broke but not why; the traceback's `E` line says why.
_GENERIC_MESSAGES = {"", "collection failure"}
_CELL_ID = re.compile(
    r"^(?P<gpu>[a-z0-9]+)-(?P<gpus>\d+)(?:gpu|rank)-torch(?P<torch>[^-]+)-tf(?P<transformers>.+)$"
)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# `-k` accepts these characters in one identifier (pytest's mark expression grammar).
_K_IDENT = re.compile(r"^[\w:+\-.\[\]\\/]+$")
_K_KEYWORDS = {"and", "or", "not", "True", "False", "None"}


class Outcome(str, Enum):
    PASSED = "passed"
    FAILED = "failed"
    ERRORED = "errored"  # setup/teardown or collection error
    SKIPPED = "skipped"
    XFAILED = "xfailed"
    FLAKY = "flaky"  # failed, then passed on a rerun

    @property
    def is_failing(self) -> bool:
        return self in (Outcome.FAILED, Outcome.ERRORED)


class CellStatus(str, Enum):
    PASSED = "passed"
    FAILED = "failed"  # tests failed
    ERRORED = "errored"  # no usable junit.xml, or env.json says the cell itself broke


@dataclass(frozen=True, slots=True)
class Problem:
    """A contract file that could not be read as common.md describes it."""

    file: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.message}"


@dataclass(frozen=True, slots=True, kw_only=True)
class TestResult:
    __test__ = False  # not a pytest test class

    test_id: str  # pytest's node id, e.g. tests/gpu/test_ep.py::test_grad[2-bf16]
    name: str  # the function name with its parameters, what `-k` takes
    outcome: Outcome
    message: str | None = None  # first line of the failure, or the skip/xfail reason
    excerpt: str | None = None  # the end of the traceback
    attempts: int = 1  # 1 + reruns by pytest-rerunfailures
    duration_s: float = 0.0
    properties: tuple[tuple[str, str], ...] = ()
    # The numbers the report shows, read from `properties` once (a report may hold 200,000 tests).
    grad_error: float | None = field(init=False, compare=False, repr=False)
    grad_bound: float | None = field(init=False, compare=False, repr=False)
    routing_margin: float | None = field(init=False, compare=False, repr=False)
    peak_allocated_mib: float | None = field(init=False, compare=False, repr=False)  # largest over ranks

    def __post_init__(self) -> None:
        values = dict(self.properties)
        peaks = [_as_float(value) for key, value in self.properties if key.startswith(PEAK_ALLOCATED_PREFIX)]
        known_peaks = [peak for peak in peaks if peak is not None]
        object.__setattr__(self, "grad_error", _as_float(values.get(GRAD_ERROR)))
        object.__setattr__(self, "grad_bound", _as_float(values.get(GRAD_BOUND)))
        object.__setattr__(self, "routing_margin", _as_float(values.get(ROUTING_MARGIN)))
        object.__setattr__(self, "peak_allocated_mib", max(known_peaks) if known_peaks else None)

    def property_value(self, name: str) -> str | None:
        for key, value in self.properties:
            if key == name:
                return value
        return None

    def number(self, name: str) -> float | None:
        return _as_float(self.property_value(name))


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuMemory:
    index: int
    name: str | None = None
    uuid: str | None = None
    total_mib: float | None = None
    used_before_mib: float | None = None
    peak_used_mib: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CellInfo:
    id: str
    gpu: str | None = None
    gpus: int | None = None
    torch: str | None = None
    transformers: str | None = None
    matrix: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Counts:
    passed: int = 0
    failed: int = 0
    errored: int = 0
    skipped: int = 0
    xfailed: int = 0
    flaky: int = 0

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.errored + self.skipped + self.xfailed + self.flaky

    def __add__(self, other: Counts) -> Counts:
        return Counts(**{name: getattr(self, name) + getattr(other, name) for name in self.__slots__})

    @classmethod
    def of(cls, tests: Iterable[TestResult]) -> Counts:
        tally = dict.fromkeys(cls.__slots__, 0)
        for test in tests:
            tally[test.outcome.value] += 1
        return cls(**tally)


@dataclass(frozen=True, slots=True, kw_only=True)
class CellResult:
    info: CellInfo
    status: CellStatus
    reason: str | None = None  # why errored, or why failed when no test says so
    tests: tuple[TestResult, ...] = ()
    memory: tuple[GpuMemory, ...] = ()
    memory_note: str | None = None  # why there are no GPU numbers
    duration_s: float | None = None
    versions: tuple[tuple[str, str | None], ...] = ()
    exit_code: int | None = None
    git_sha: str | None = None
    git_dirty: bool | None = None  # tracked files differed from git_sha's commit
    host: str | None = None
    runner: str | None = None
    driver: str | None = None
    reproduce: str = ""
    log_tail: str | None = None  # end of pytest.log, kept for errored cells
    problems: tuple[Problem, ...] = ()
    folder: str = ""
    counts: Counts = field(init=False, compare=False)  # from `tests`
    failing_tests: tuple[TestResult, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "counts", Counts.of(self.tests))
        object.__setattr__(self, "failing_tests", tuple(test for test in self.tests if test.outcome.is_failing))

    @property
    def id(self) -> str:
        return self.info.id

    def reproduce_command(self) -> str:
        """`harness run ... --cell ID -- -k 'a or b'` selecting this cell's failing tests."""
        names = sorted({_k_name(test.name) for test in self.failing_tests})
        if not names or len(names) > 8:
            return self.reproduce
        return f"{self.reproduce} -- -k {shlex.quote(' or '.join(names))}"


@dataclass(frozen=True, slots=True)
class ResultSet:
    cells: tuple[CellResult, ...]

    @property
    def counts(self) -> Counts:
        total = Counts()
        for cell in self.cells:
            total = total + cell.counts
        return total

    def cells_with(self, status: CellStatus) -> tuple[CellResult, ...]:
        return tuple(cell for cell in self.cells if cell.status is status)

    @property
    def git_sha(self) -> str | None:
        return _only({cell.git_sha for cell in self.cells})

    @property
    def git_dirty(self) -> bool:
        return any(cell.git_dirty for cell in self.cells)

    @property
    def matrix(self) -> str | None:
        return _only({cell.info.matrix for cell in self.cells})


# ---------------------------------------------------------------------------------------------
# Finding cell folders


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
        found = find_cell_folders(path)
        if not found:
            raise ConfigError(f"no cell folders under {path} (none holds {', '.join(CONTRACT_FILES)})")
        folders.update(dict.fromkeys(folder.resolve() for folder in found))
    cells = sorted((read_cell(folder) for folder in folders), key=lambda cell: natural_key(cell.id))
    return ResultSet(tuple(_flag_duplicate_ids(cells)))


def _flag_duplicate_ids(cells: list[CellResult]) -> list[CellResult]:
    # Two folders for one cell (an artifact downloaded twice): keep both rows, say so on the second.
    first_folder: dict[str, str] = {}
    flagged = []
    for cell in cells:
        if cell.id in first_folder:
            problem = Problem("env.json", f"cell {cell.id} also read from {first_folder[cell.id]}")
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
    return sorted(child for child in path.iterdir() if child.is_dir())


def _is_cell_folder(path: Path) -> bool:
    return any((path / name).is_file() for name in CONTRACT_FILES)


def natural_key(text: str) -> tuple[str | int, ...]:
    """Sort `torch2.9.0` before `torch2.11.0` and `2gpu` before `8gpu`."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


# ---------------------------------------------------------------------------------------------
# One cell


def read_cell(folder: Path) -> CellResult:
    problems: list[Problem] = []
    env = _read_json(folder / "env.json", problems)
    memory_doc = _read_json(folder / "memory.json", problems)
    tests, junit_problem, junit_time_s = _read_junit(folder / "junit.xml")
    if junit_problem:
        problems.append(junit_problem)

    env_fields = _Fields("env.json", env, problems)
    info = _cell_info(env_fields.mapping("cell"), folder.name, problems)
    env_status = env_fields.choice("status", ("passed", "failed", "errored"))
    exit_code = env_fields.integer("exit_code")
    counts = Counts.of(tests)
    status, reason = _cell_status(env_status, env_fields.text("error"), exit_code, junit_problem, counts)
    memory, memory_note = _read_memory(memory_doc, problems)
    duration_s = env_fields.number("duration_s")
    return CellResult(
        info=info,
        status=status,
        reason=reason,
        tests=tests,
        memory=memory,
        memory_note=memory_note,
        duration_s=duration_s if duration_s is not None else junit_time_s,
        versions=tuple(sorted(env_fields.string_map("versions").items())),
        exit_code=exit_code,
        git_sha=env_fields.text("git_sha"),
        git_dirty=env_fields.boolean("git_dirty"),
        host=env_fields.text("host"),
        runner=env_fields.text("runner"),
        driver=env_fields.text("driver"),
        reproduce=_reproduce(env_fields.text("reproduce"), info),
        log_tail=_read_log_tail(folder / "pytest.log", problems) if status is CellStatus.ERRORED else None,
        problems=tuple(problems),
        folder=str(folder),
    )


def _cell_status(
    env_status: str | None, env_error: str | None, exit_code: int | None,
    junit_problem: Problem | None, counts: Counts,
) -> tuple[CellStatus, str | None]:
    if env_status == "errored":
        return CellStatus.ERRORED, env_error or "env.json says errored and gives no reason"
    if junit_problem:
        return CellStatus.ERRORED, str(junit_problem)
    if counts.failed or counts.errored:
        return CellStatus.FAILED, None
    if env_status == "failed":
        return CellStatus.FAILED, f"pytest exited with code {exit_code} but junit.xml records no failure"
    return CellStatus.PASSED, None


def _cell_info(cell: Mapping[str, object], folder_name: str, problems: list[Problem]) -> CellInfo:
    fields = _Fields("env.json: cell", cell, problems)
    cell_id = fields.text("id") or folder_name
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
    # Shown in a shell block: trust env.json's command only when it is one plain line.
    if recorded and recorded.startswith("harness run ") and recorded.isprintable() and "`" not in recorded:
        return recorded
    matrix = f" --matrix {shlex.quote(info.matrix)}" if info.matrix else ""
    return f"harness run{matrix} --cell {shlex.quote(info.id)}"


def _k_name(test_name: str) -> str:
    """A `-k` term for one test: its full name where the grammar allows it, else the function."""
    if _K_IDENT.match(test_name) and test_name not in _K_KEYWORDS:
        return test_name
    return test_name.split("[", 1)[0]


# ---------------------------------------------------------------------------------------------
# Files


def _read_text(path: Path, problems: list[Problem]) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        problems.append(Problem(path.name, "missing"))
    except OSError as error:
        problems.append(Problem(path.name, f"unreadable: {error.strerror or error}"))
    return None


def _read_json(path: Path, problems: list[Problem]) -> Mapping[str, object]:
    text = _read_text(path, problems)
    if text is None:
        return {}
    if not text.strip():
        problems.append(Problem(path.name, "empty"))
        return {}
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        problems.append(Problem(path.name, f"malformed JSON: {error}"))
        return {}
    if not isinstance(document, dict):
        problems.append(Problem(path.name, f"expected an object, found {type(document).__name__}"))
        return {}
    schema = document.get("schema")
    if schema != SCHEMA:
        problems.append(Problem(path.name, f"schema {schema!r}, this reader knows {SCHEMA}"))
    return document


def _read_log_tail(path: Path, problems: list[Problem]) -> str | None:
    try:
        with path.open("rb") as log:
            log.seek(max(0, log.seek(0, 2) - LOG_TAIL_BYTES))
            data = log.read()
    except FileNotFoundError:
        problems.append(Problem(path.name, "missing"))
        return None
    except OSError as error:
        problems.append(Problem(path.name, f"unreadable: {error.strerror or error}"))
        return None
    lines = _ANSI.sub("", data.decode("utf-8", errors="replace")).rstrip().splitlines()
    return "\n".join(lines[-LOG_TAIL_LINES:]) or None


def _read_memory(
    document: Mapping[str, object], problems: list[Problem]
) -> tuple[tuple[GpuMemory, ...], str | None]:
    if not document:
        return (), "memory.json missing or unreadable"
    fields = _Fields("memory.json", document, problems)
    if fields.boolean("available") is False:
        return (), fields.text("reason") or "memory.json says not available"
    gpus = []
    for position, entry in enumerate(fields.items("gpus")):
        gpu = _Fields(f"memory.json: gpus[{position}]", entry, problems)
        index = gpu.integer("index")
        gpus.append(GpuMemory(
            index=index if index is not None else position,
            name=gpu.text("name"),
            uuid=gpu.text("uuid"),
            total_mib=gpu.number("total_mib"),
            used_before_mib=gpu.number("used_before_mib"),
            peak_used_mib=gpu.number("peak_used_mib"),
        ))
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
        where = f"key {key!r}" if key else "value"
        self.problems.append(Problem(self.source, f"{where} is {value!r:.80}, expected {expected}"))

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
        return self._get(key, (str,), "a string")

    def integer(self, key: str) -> int | None:
        return self._get(key, (int,), "an integer")

    def number(self, key: str) -> float | None:
        value = self._get(key, (int, float), "a number")
        return float(value) if value is not None else None

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

    def string_map(self, key: str) -> dict[str, str | None]:
        entries = self.mapping(key)
        inner = _Fields(f"{self.source}: {key}", entries, self.problems)
        return {name: inner.text(name) for name in entries}


# ---------------------------------------------------------------------------------------------
# junit.xml


def _read_junit(path: Path) -> tuple[tuple[TestResult, ...], Problem | None, float | None]:
    """Tests of one junit.xml; a file that cannot be read gives no tests and the Problem."""
    if not path.is_file():
        return (), Problem("junit.xml", "missing: pytest never wrote it (crash, kill or timeout)"), None
    if path.stat().st_size == 0:
        return (), Problem("junit.xml", "empty"), None
    try:
        document = JUnitXml.fromfile(str(path))
        suites = list(document)
        entries = [case for suite in suites for case in suite]
        return _group_attempts(entries), None, sum(suite.time or 0.0 for suite in suites)
    except ParseError as error:
        return (), Problem("junit.xml", f"malformed or truncated XML: {error}"), None
    except JUnitXmlError as error:
        return (), Problem("junit.xml", f"not JUnit XML: {error}"), None
    except ValueError as error:  # a time attribute that is not a number
        return (), Problem("junit.xml", f"malformed attribute: {error}"), None
    except OSError as error:
        return (), Problem("junit.xml", f"unreadable: {error.strerror or error}"), None


def _group_attempts(entries: list) -> tuple[TestResult, ...]:
    """pytest-rerunfailures leaves one empty <testcase> per rerun attempt before the final one, and a
    call failure followed by a teardown error gives two entries with results; group them per test."""
    grouped: dict[str, list] = {}
    for entry in entries:
        grouped.setdefault(_test_id(entry), []).append(entry)
    return tuple(_test_result(test_id, attempts) for test_id, attempts in grouped.items())


def _test_result(test_id: str, entries: list) -> TestResult:
    results = [entry.result for entry in entries]
    final_from = len(entries) - 1
    while final_from > 0 and results[final_from - 1]:
        final_from -= 1
    final = [result for entry_results in results[final_from:] for result in entry_results]
    attempts = final_from + 1
    outcome, message, excerpt = _outcome(final)
    if outcome is Outcome.PASSED and attempts > 1:
        outcome = Outcome.FLAKY
    properties = entries[-1].child(Properties)
    return TestResult(
        test_id=test_id,
        name=entries[-1].name or test_id,
        outcome=outcome,
        message=message,
        excerpt=excerpt,
        attempts=attempts,
        duration_s=sum(entry.time or 0.0 for entry in entries),
        properties=tuple((prop.name or "", prop.value or "") for prop in properties) if properties else (),
    )


def _outcome(results: list) -> tuple[Outcome, str | None, str | None]:
    for kind, outcome in ((Failure, Outcome.FAILED), (Error, Outcome.ERRORED)):
        found = [result for result in results if isinstance(result, kind)]
        if found:
            return outcome, _first_line(found[0].message, found[0].text), _excerpt(found[0].text)
    for result in results:
        if isinstance(result, Skipped):
            outcome = Outcome.XFAILED if result.type == "pytest.xfail" else Outcome.SKIPPED
            return outcome, _first_line(result.message, result.text) or "no reason given", None
    return Outcome.PASSED, None, None


def _test_id(entry) -> str:
    """pytest's node id back from xunit1's classname (dotted module + class) and file."""
    classname, name, file = entry.classname or "", entry.name or "", entry._elem.get("file")
    if file:
        module = file.removesuffix(".py").replace("\\", ".").replace("/", ".")
        if not classname:  # a collection error names the module, not a test
            return file
        if classname == module:
            return f"{file}::{name}"
        if classname.startswith(module + "."):
            return f"{file}::{classname[len(module) + 1:].replace('.', '::')}::{name}"
    return f"{classname}::{name}" if classname else name


def _first_line(message: str | None, text: str | None) -> str | None:
    first = next((line.strip() for line in (message or "").splitlines() if line.strip()), "")
    if first in _GENERIC_MESSAGES:
        # The last `E   ...` line of the traceback is the exception itself.
        raised = [line[1:].strip() for line in (text or "").splitlines() if line.startswith("E ")]
        first = f"{first}: {raised[-1]}" if first and raised else (raised[-1] if raised else first)
    first = first.removeprefix("AssertionError: ")
    return first or None


def _excerpt(text: str | None) -> str | None:
    lines = (text or "").rstrip().splitlines()
    if len(lines) > EXCERPT_LINES:
        lines = [f"... {len(lines) - EXCERPT_LINES} lines cut ...", *lines[-EXCERPT_LINES:]]
    return "\n".join(lines) or None


def _as_float(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _only(values: set[str | None]) -> str | None:
    values.discard(None)
    return values.pop() if len(values) == 1 else None


# ---------------------------------------------------------------------------------------------
# Digest: the numbers a later run compares against, small enough to ride in a PR comment


DIGEST_TAG = "harness-digest v1"
_COUNT_FIELDS = ("passed", "failed", "errored", "skipped", "xfailed", "flaky")
_DIGEST_PAYLOAD = re.compile(re.escape(DIGEST_TAG) + r"\s+([A-Za-z0-9+/=]+)")


@dataclass(frozen=True, slots=True, kw_only=True)
class CellDigest:
    status: CellStatus
    counts: Counts
    failing: frozenset[str] | None  # test ids; None where a shortened digest dropped them
    skipped: frozenset[str] | None
    peak_used_mib: tuple[float | None, ...] = ()  # per GPU index


@dataclass(frozen=True, slots=True, kw_only=True)
class Digest:
    cells: Mapping[str, CellDigest]
    git_sha: str | None = None
    matrix: str | None = None


def digest(result_set: ResultSet, *, sha: str | None = None, matrix: str | None = None) -> Digest:
    cells = {}
    for cell in result_set.cells:
        cells[cell.id] = CellDigest(
            status=cell.status,
            counts=cell.counts,
            failing=frozenset(test.test_id for test in cell.failing_tests),
            skipped=frozenset(test.test_id for test in cell.tests if test.outcome is Outcome.SKIPPED),
            # Whole MiB: what the comment carries, so a folder and a comment give the same digest.
            peak_used_mib=tuple(None if gpu.peak_used_mib is None else float(round(gpu.peak_used_mib))
                                for gpu in cell.memory),
        )
    return Digest(cells=cells, git_sha=sha or result_set.git_sha, matrix=matrix or result_set.matrix)


def encode_digest(summary: Digest, max_chars: int) -> str:
    """base64 of zlib-compressed compact JSON; drops skipped ids, then failing ids, to fit."""
    for keep_skipped, keep_failing in ((True, True), (False, True), (False, False)):
        payload = _digest_payload(summary, keep_skipped=keep_skipped, keep_failing=keep_failing)
        if len(payload) <= max_chars:
            return payload
    return payload  # counts and memory only; as small as it gets


def _digest_payload(summary: Digest, *, keep_skipped: bool, keep_failing: bool) -> str:
    test_ids: dict[str, int] = {}

    def indices(ids: frozenset[str] | None, keep: bool) -> list[int] | None:
        if ids is None or not keep:
            return None
        return [test_ids.setdefault(test_id, len(test_ids)) for test_id in sorted(ids)]

    cells = []
    for cell_id, cell in summary.cells.items():
        counts = cell.counts
        cells.append({
            "id": cell_id,
            "status": cell.status.value,
            "counts": [getattr(counts, name) for name in _COUNT_FIELDS],
            "failing": indices(cell.failing, keep_failing),
            "skipped": indices(cell.skipped, keep_skipped),
            "peak": [None if peak is None else round(peak) for peak in cell.peak_used_mib],
        })
    document = {
        "v": 1, "sha": summary.git_sha, "matrix": summary.matrix, "tests": list(test_ids), "cells": cells,
    }
    packed = zlib.compress(json.dumps(document, separators=(",", ":")).encode(), 9)
    return base64.b64encode(packed).decode("ascii")


def decode_digest(text: str) -> Digest:
    """The digest inside a previous comment's text; ValueError says why there is none."""
    # The last one: the comment ends with its digest, and a test's message quoted above it may hold a fake.
    found = next(reversed(list(_DIGEST_PAYLOAD.finditer(text))), None)
    if not found:
        raise ValueError(f"no '<!-- {DIGEST_TAG} ... -->' digest in it")
    try:
        document = json.loads(zlib.decompress(base64.b64decode(found.group(1), validate=True)))
        tests = document["tests"]

        def ids(indices: list[int] | None) -> frozenset[str] | None:
            return None if indices is None else frozenset(tests[index] for index in indices)

        cells = {
            cell["id"]: CellDigest(
                status=CellStatus(cell["status"]),
                counts=Counts(**dict(zip(_COUNT_FIELDS, cell["counts"], strict=True))),
                failing=ids(cell["failing"]),
                skipped=ids(cell["skipped"]),
                peak_used_mib=tuple(None if peak is None else float(peak) for peak in cell["peak"]),
            )
            for cell in document["cells"]
        }
    except (binascii.Error, zlib.error, KeyError, IndexError, TypeError, ValueError) as error:
        raise ValueError(f"the digest is unreadable ({type(error).__name__}: {error})") from None
    return Digest(cells=cells, git_sha=document.get("sha"), matrix=document.get("matrix"))


def load_baseline(path: str | Path) -> Digest:
    """A baseline is a results folder, or a file holding a previous comment's text with its digest."""
    path = Path(path)
    if path.is_dir():
        return digest(load_results([path]))
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        raise ConfigError(f"baseline {path}: {error.strerror or error}") from None
    try:
        return decode_digest(text)
    except ValueError as error:
        raise ConfigError(f"baseline {path}: {error}; pass a results folder or a previous comment") from None


# ---------------------------------------------------------------------------------------------
# Comparison with a baseline

MEMORY_CHANGE_MIB = 256.0
MEMORY_CHANGE_FRACTION = 0.05


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryChange:
    gpu_index: int
    before_mib: float
    after_mib: float


@dataclass(frozen=True, slots=True, kw_only=True)
class CellChange:
    cell_id: str
    status_before: CellStatus | None  # None: a cell the baseline did not have
    status_after: CellStatus | None  # None: a baseline cell missing from this run
    new_failures: tuple[str, ...] = ()
    fixed: tuple[str, ...] = ()
    newly_skipped: tuple[str, ...] = ()
    memory: tuple[MemoryChange, ...] = ()
    incomplete: tuple[str, ...] = ()  # what the (shortened) baseline could not tell
    # False where a side had no tests (a new, missing or errored cell): new_failures, fixed and
    # newly_skipped are then empty, and only the status says what changed.
    tests_compared: bool = False

    @property
    def status_changed(self) -> bool:
        return self.status_before is not self.status_after

    @property
    def is_empty(self) -> bool:
        return not (self.status_changed or self.new_failures or self.fixed or self.newly_skipped
                    or self.memory or self.incomplete)


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    baseline_sha: str | None
    cells: tuple[CellChange, ...]  # only cells where something changed


def compare(
    result_set: ResultSet, baseline: Digest, *,
    memory_change_mib: float = MEMORY_CHANGE_MIB, memory_change_fraction: float = MEMORY_CHANGE_FRACTION,
) -> Comparison:
    changes = []
    for cell in result_set.cells:
        before = baseline.cells.get(cell.id)
        if before is None:
            changes.append(CellChange(cell_id=cell.id, status_before=None, status_after=cell.status))
            continue
        change = _cell_change(cell, before, memory_change_mib, memory_change_fraction)
        if not change.is_empty:
            changes.append(change)
    current = {cell.id for cell in result_set.cells}
    changes.extend(
        CellChange(cell_id=cell_id, status_before=before.status, status_after=None)
        for cell_id, before in baseline.cells.items() if cell_id not in current
    )
    return Comparison(baseline_sha=baseline.git_sha,
                      cells=tuple(sorted(changes, key=lambda change: natural_key(change.cell_id))))


def _cell_change(
    cell: CellResult, before: CellDigest, change_mib: float, change_fraction: float
) -> CellChange:
    outcomes = {test.test_id: test.outcome for test in cell.tests}
    failing_now = {test.test_id for test in cell.failing_tests}
    # A side without tests (an errored cell) has nothing to compare test by test; its status says it.
    comparable = bool(cell.tests) and before.counts.total > 0
    incomplete = []
    new_failures: set[str] = set()
    fixed: set[str] = set()
    if before.failing is None:
        incomplete.append("failing tests")
    elif comparable:
        new_failures = failing_now - before.failing
        fixed = {test_id for test_id in before.failing
                 if outcomes.get(test_id) in (Outcome.PASSED, Outcome.FLAKY)}
    newly_skipped: set[str] = set()
    if before.skipped is None:
        incomplete.append("skipped tests")
    elif comparable:
        newly_skipped = {test_id for test_id, outcome in outcomes.items()
                         if outcome is Outcome.SKIPPED and test_id not in before.skipped}
    memory = []
    for gpu in cell.memory:
        if gpu.index >= len(before.peak_used_mib):
            continue
        old, new = before.peak_used_mib[gpu.index], gpu.peak_used_mib
        if old is None or new is None:
            continue
        if abs(new - old) >= change_mib and abs(new - old) >= change_fraction * max(old, 1.0):
            memory.append(MemoryChange(gpu_index=gpu.index, before_mib=old, after_mib=new))
    return CellChange(
        cell_id=cell.id, status_before=before.status, status_after=cell.status,
        new_failures=tuple(sorted(new_failures, key=natural_key)),
        fixed=tuple(sorted(fixed, key=natural_key)),
        newly_skipped=tuple(sorted(newly_skipped, key=natural_key)),
        memory=tuple(memory), incomplete=tuple(incomplete), tests_compared=comparable,
    )
