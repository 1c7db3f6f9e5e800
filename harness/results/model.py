"""The results model: frozen values for cells, tests and their numbers, built by the reader and read by
every later stage (digest, comparison, report). Nothing here reads a file."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from harness.contract import (
    CASE_FIXED_UPSTREAM,
    CASE_KNOWN_PRESENT,
    CASE_NEW_RED,
    CASE_NOT_BUILT,
    CASE_NOT_RUN,
    CASE_PASSED,
    EP_FAMILIES_COVERED,
    EP_FAMILIES_DECLARED,
    EP_FAMILIES_NOT_COVERED,
    FAMILY,
    GRAD_BOUND,
    GRAD_ERROR,
    GRAD_ERROR_PARAM,
    HOST_RANK_UNIT,
    HOST_RANKS,
    KNOWN_BUG,
    KNOWN_BUG_FIXED,
    KNOWN_BUG_KEY_CHARS,
    KNOWN_BUG_KEY_PATTERN,
    KNOWN_BUG_KEYS,
    LAUNCH_FAILED,
    LAUNCH_FAILURES,
    LOGITS_ATOL,
    LOGITS_DIFFERENCE,
    NEEDS_WORLD_SIZE,
    NOT_BUILT,
    NOT_BUILT_CHARS,
    PEAK_ALLOCATED_PREFIX,
    RANK_UNITS,
    ROUTING_MARGIN,
    STATUS_ERRORED,
    STATUS_FAILED,
    STATUS_NOT_RUN,
    STATUS_PASSED,
    TRANSFORMERS_VERSION,
    WORLD_SIZE,
)
from harness.results.training import TrainingCurve, training_curve
from harness.results.values import Labelled, Number, clean_text, number, whole_number

# `-k` accepts these characters in one identifier (pytest's mark expression grammar).
_K_IDENT = re.compile(r"[\w:+\-.\[\]\\/]+\Z", re.ASCII)
_K_KEYWORDS = {"and", "or", "not", "True", "False", "None"}
_K_NAME_CHARS = 200  # longer names make a command nobody pastes
_K_NAMES = 8
FAMILY_CHARS = 100  # a model_type name
_KNOWN_BUG_KEY = re.compile(KNOWN_BUG_KEY_PATTERN)


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
    PASSED = STATUS_PASSED
    FAILED = STATUS_FAILED  # tests failed
    ERRORED = STATUS_ERRORED  # no usable junit.xml, or env.json says the cell itself broke
    NOT_RUN = STATUS_NOT_RUN  # nothing failed, but no distributed case ran: the host had too few GPUs or ranks


@dataclass(frozen=True, slots=True)
class Problem:
    """A contract file that could not be read as the contract describes it."""

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
    duration_s: Number = 0.0
    properties: tuple[tuple[str, str], ...] = ()
    # The test pytest was running when the cell stopped (a timeout, a crash, an interrupt): junit.with_stopped_test
    # makes it an errored test, and the cell's error_kind says why it stopped.
    stopped: bool = False
    # The numbers the report shows, read from `properties` once (a report may hold 200,000 tests).
    grad_error: Number | None = field(init=False, compare=False, repr=False)
    grad_bound: Number | None = field(init=False, compare=False, repr=False)
    grad_error_param: str | None = field(init=False, compare=False, repr=False)
    routing_margin: Number | None = field(init=False, compare=False, repr=False)
    logits_difference: Number | None = field(init=False, compare=False, repr=False)
    logits_atol: Number | None = field(init=False, compare=False, repr=False)
    peak_allocated_mib: Number | None = field(init=False, compare=False, repr=False)  # largest over ranks
    # What the ranks fixture recorded: the world size a case launched on, or the one it needed and what the host
    # had when it was skipped for too few GPUs or ranks; and the family a suite case ran.
    world_size: int | None = field(init=False, compare=False, repr=False)
    needs_world_size: int | None = field(init=False, compare=False, repr=False)
    host_ranks: int | None = field(init=False, compare=False, repr=False)
    host_rank_unit: str | None = field(init=False, compare=False, repr=False)  # one of contract.RANK_UNITS
    family: str | None = field(init=False, compare=False, repr=False)
    training: TrainingCurve | None = field(init=False, compare=False, repr=False)  # a training case's steps
    # The known-bugs table's entries, by key, that explained this case's expected failure, and those covering a case
    # that passed (fixed upstream); () where the property is absent or not of its shape (contract.KNOWN_BUG).
    known_bug: tuple[str, ...] = field(init=False, compare=False, repr=False)
    known_bug_fixed: tuple[str, ...] = field(init=False, compare=False, repr=False)
    launch_failed: str | None = field(init=False, compare=False, repr=False)  # one of contract.LAUNCH_FAILURES
    # Why the suite could not build the case (contract.NOT_BUILT), bounded; None where the property is absent, "" where
    # it is there but empty (the property says the case was not built, whatever its value).
    not_built: str | None = field(init=False, compare=False, repr=False)
    # Skipped for too few GPUs or ranks: the property is there, whatever its value (a garbled number still
    # says the case did not run).
    not_run_for_ranks: bool = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        values = dict(self.properties)
        peaks = [number(value) for key, value in self.properties if key.startswith(PEAK_ALLOCATED_PREFIX)]
        odd = [peak for peak in peaks if isinstance(peak, Labelled)]
        usable = [peak for peak in peaks if isinstance(peak, float)]
        object.__setattr__(self, "grad_error", number(values.get(GRAD_ERROR)))
        object.__setattr__(self, "grad_bound", number(values.get(GRAD_BOUND)))
        object.__setattr__(self, "grad_error_param", values.get(GRAD_ERROR_PARAM))
        object.__setattr__(self, "routing_margin", number(values.get(ROUTING_MARGIN)))
        object.__setattr__(self, "logits_difference", number(values.get(LOGITS_DIFFERENCE)))
        object.__setattr__(self, "logits_atol", number(values.get(LOGITS_ATOL)))
        object.__setattr__(self, "peak_allocated_mib", odd[0] if odd else (max(usable) if usable else None))
        object.__setattr__(self, "world_size", whole_number(values.get(WORLD_SIZE), 1))
        object.__setattr__(self, "needs_world_size", whole_number(values.get(NEEDS_WORLD_SIZE), 1))
        object.__setattr__(self, "host_ranks", whole_number(values.get(HOST_RANKS), 0))
        unit = values.get(HOST_RANK_UNIT)
        object.__setattr__(self, "host_rank_unit", unit if unit in RANK_UNITS else None)
        family = values.get(FAMILY)
        object.__setattr__(self, "family", family if family and len(family) <= FAMILY_CHARS else None)
        object.__setattr__(self, "training", training_curve(values))
        object.__setattr__(self, "known_bug", known_bug_keys(values.get(KNOWN_BUG)))
        object.__setattr__(self, "known_bug_fixed", known_bug_keys(values.get(KNOWN_BUG_FIXED)))
        launch = values.get(LAUNCH_FAILED)
        object.__setattr__(self, "launch_failed", launch if launch in LAUNCH_FAILURES else None)
        object.__setattr__(self, "not_built", clean_text(values.get(NOT_BUILT), NOT_BUILT_CHARS))
        skipped = self.outcome is Outcome.SKIPPED
        object.__setattr__(self, "not_run_for_ranks", skipped and NEEDS_WORLD_SIZE in values)

    @property
    def ran_distributed(self) -> bool:
        """It launched on two ranks or more (passed, failed or xfailed: it ran)."""
        return self.outcome is not Outcome.SKIPPED and self.world_size is not None and self.world_size >= 2

    @property
    def has_metrics(self) -> bool:
        return any(
            value is not None
            for value in (
                self.grad_error,
                self.grad_bound,
                self.routing_margin,
                self.logits_difference,
                self.logits_atol,
            )
        )

    def property_value(self, name: str) -> str | None:
        for key, value in self.properties:
            if key == name:
                return value
        return None

    def number(self, name: str) -> Number | None:
        return number(self.property_value(name))


def known_bug_keys(value: str | None) -> tuple[str, ...]:
    """The known-bugs entries a property names, by key; () for a value of any other shape: the value is untrusted,
    and one that names no entry as the suite writes it names none."""
    if not value or len(value) > KNOWN_BUG_KEYS * (KNOWN_BUG_KEY_CHARS + 1):
        return ()
    keys = value.split(",")
    if len(keys) > KNOWN_BUG_KEYS:
        return ()
    if not all(len(key) <= KNOWN_BUG_KEY_CHARS and _KNOWN_BUG_KEY.fullmatch(key) for key in keys):
        return ()
    return tuple(keys)


def case_class(test: TestResult) -> str:
    """The case's class in the release view (one of contract.CASE_CLASSES), from its outcome and typed properties only:
    a failure's words ("fixed upstream", "not built: ...") decide nothing. A strict XPASS a known-bugs entry covers is
    reported failed and carries KNOWN_BUG_FIXED: fixed upstream. An error never is: the entry does not explain it. An
    xfail without KNOWN_BUG (a plain xfail mark) is no known bug: it failed as its test expects, so it passed. A flaky
    case passed in the end: it is listed as flaky, never counted red."""
    outcome = test.outcome
    if outcome is Outcome.FAILED:
        return CASE_FIXED_UPSTREAM if test.known_bug_fixed else CASE_NEW_RED
    if outcome is Outcome.ERRORED:
        return CASE_NEW_RED
    if outcome is Outcome.XFAILED:
        return CASE_KNOWN_PRESENT if test.known_bug else CASE_PASSED
    if outcome is Outcome.SKIPPED:
        return CASE_NOT_BUILT if test.not_built is not None else CASE_NOT_RUN
    return CASE_PASSED


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuMemory:
    """One GPU's row of memory.json as the report sees it (memory.py's GpuMemory is what the monitor
    writes; this is what any folder, however broken, reads back as)."""

    index: int
    name: str | None = None
    uuid: str | None = None
    total_mib: Number | None = None
    used_before_mib: Number | None = None
    peak_used_mib: Number | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CellInfo:
    """The cell as env.json records it (None: not recorded, e.g. a folder without env.json)."""

    id: str
    gpu: str | None = None
    gpus: int | None = None  # per host
    hosts: int | None = None  # None: recorded before cells spanned hosts (one host), or not recorded
    torch: str | None = None
    transformers: str | None = None
    matrix: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SuiteInfo:
    """What the suite recorded once per run (record_testsuite_property)."""

    ep_families_declared: tuple[str, ...] | None = None
    ep_families_covered: tuple[str, ...] | None = None
    ep_families_not_covered: tuple[tuple[str, str], ...] = ()  # (model_type, reason), as the suite listed them
    transformers_version: str | None = None

    @classmethod
    def of(cls, properties: dict[str, str]) -> SuiteInfo:
        def names(key: str) -> tuple[str, ...] | None:
            value = properties.get(key)
            return None if value is None else tuple(name.strip() for name in value.split(",") if name.strip())

        return cls(
            ep_families_declared=names(EP_FAMILIES_DECLARED),
            ep_families_covered=names(EP_FAMILIES_COVERED),
            ep_families_not_covered=_reasons(properties.get(EP_FAMILIES_NOT_COVERED)),
            transformers_version=properties.get(TRANSFORMERS_VERSION),
        )


def _reasons(value: str | None) -> tuple[tuple[str, str], ...]:
    """The not-covered families' reasons: a JSON object of strings; anything else (it is untrusted) reads as none."""
    if not value:
        return ()
    try:
        parsed = json.loads(value)
    except ValueError:
        return ()
    if not isinstance(parsed, dict):
        return ()
    return tuple(sorted((name, reason) for name, reason in parsed.items() if isinstance(reason, str)))


class _Tally:
    """A count per kind, its fields all ints: their total, and the sum of two (a run's, from its cells')."""

    __slots__: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return sum(getattr(self, name) for name in self.__slots__)

    def __add__(self, other):
        return type(self)(**{name: getattr(self, name) + getattr(other, name) for name in self.__slots__})


@dataclass(frozen=True, slots=True, kw_only=True)
class Counts(_Tally):
    passed: int = 0
    failed: int = 0
    errored: int = 0
    skipped: int = 0
    xfailed: int = 0
    flaky: int = 0

    @classmethod
    def of(cls, tests: Iterable[TestResult]) -> Counts:
        tally = dict.fromkeys(cls.__slots__, 0)
        for test in tests:
            tally[test.outcome.value] += 1
        return cls(**tally)


# CaseCounts' fields, in the order of contract.CASE_CLASSES.
_CASE_FIELDS = {CASE_NEW_RED: "new_red", CASE_KNOWN_PRESENT: "known_present", CASE_FIXED_UPSTREAM: "fixed_upstream",
                CASE_NOT_BUILT: "not_built", CASE_NOT_RUN: "not_run", CASE_PASSED: "passed"}


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseCounts(_Tally):
    """How many cases of each class (case_class): a cell's, or a run's (their sum)."""

    new_red: int = 0
    known_present: int = 0
    fixed_upstream: int = 0
    not_built: int = 0
    not_run: int = 0
    passed: int = 0

    def by_class(self) -> tuple[tuple[str, int], ...]:
        """(class, count) for every class, in the order of contract.CASE_CLASSES."""
        return tuple((case, getattr(self, name)) for case, name in _CASE_FIELDS.items())

    def to_json(self) -> dict[str, int]:
        return dict(self.by_class())

    @classmethod
    def from_json(cls, document: object) -> CaseCounts:
        """Counts keyed by class, as `to_json` writes them; ValueError for anything else (a class missing counts 0)."""
        if not isinstance(document, dict) or not set(document) <= set(_CASE_FIELDS):
            raise ValueError(f"the case counts must be an object keyed by {', '.join(_CASE_FIELDS)}")
        counts = {name: document.get(case, 0) for case, name in _CASE_FIELDS.items()}
        if not all(type(count) is int and count >= 0 for count in counts.values()):
            raise ValueError("each case count must be a whole number, 0 or more")
        return cls(**counts)

    @classmethod
    def of(cls, tests: Iterable[TestResult]) -> CaseCounts:
        tally = dict.fromkeys(_CASE_FIELDS.values(), 0)
        for test in tests:
            tally[_CASE_FIELDS[case_class(test)]] += 1
        return cls(**tally)


@dataclass(frozen=True, slots=True, kw_only=True)
class NotRun:
    """A cell's cases skipped because its host had too few GPUs or ranks, read from their typed properties:
    how many, the world sizes they needed and what the host had (None where no usable number was recorded)."""

    cases: int = 0
    smallest_world: int | None = None
    largest_world: int | None = None
    host_ranks: int | None = None
    host_rank_unit: str | None = None  # one of contract.RANK_UNITS

    @classmethod
    def of(cls, tests: Iterable[TestResult]) -> NotRun:
        skipped = [test for test in tests if test.not_run_for_ranks]
        needed = [test.needs_world_size for test in skipped if test.needs_world_size is not None]
        # Every case of a cell sees the same host; the first that recorded it speaks for them.
        host = next((test for test in skipped if test.host_ranks is not None), None)
        return cls(
            cases=len(skipped),
            smallest_world=min(needed, default=None),
            largest_world=max(needed, default=None),
            host_ranks=host.host_ranks if host else None,
            host_rank_unit=next((test.host_rank_unit for test in skipped if test.host_rank_unit), None),
        )


def nothing_distributed_ran(tests: Iterable[TestResult]) -> bool:
    """Some case was skipped for too few GPUs or ranks and none launched on two ranks or more: the host ran only
    what it could, which is not what a cell is for (the status NOT_RUN; `harness run` decides it with this too)."""
    any_not_run = False
    for test in tests:
        if test.ran_distributed:
            return False
        any_not_run = any_not_run or test.not_run_for_ranks
    return any_not_run


@dataclass(frozen=True, slots=True, kw_only=True)
class CellResult:
    info: CellInfo
    status: CellStatus
    reason: str | None = None  # why errored, or why failed when no test says so
    error_kind: str | None = None  # why errored, as data: one of contract.ERROR_KINDS (None: not said)
    tests: tuple[TestResult, ...] = ()
    suite: SuiteInfo = SuiteInfo()
    memory: tuple[GpuMemory, ...] = ()
    memory_note: str | None = None  # why there are no GPU numbers
    duration_s: Number | None = None
    # env.json's start -> end in seconds, as recorded (negative where end came first; None: either one missing or
    # not a time with its offset, as for a cell that never ended). What a report shows of it is its own choice.
    wall_s: float | None = None
    recorded_gpus: int = 0  # entries of env.json's gpus: the GPUs it used (none: a cpu cell, an engine's, an old one)
    versions: tuple[tuple[str, str | None], ...] = ()
    exit_code: int | None = None
    git_sha: str | None = None  # the commit that ran
    git_dirty: bool | None = None  # tracked files differed from git_sha's commit
    trigger_sha: str | None = None  # the commit the workflow run was started for
    host: str | None = None
    runner: str | None = None
    driver: str | None = None
    # `harness run [--matrix M] --cell ID`, rebuilt from typed fields by the reader (records.reproduce), never a
    # command read from the folder; "" where the cell's id is not one harness builds (nothing to paste)
    reproduce: str = ""
    pytest_args: tuple[str, ...] | None = None  # the run's own (None: a folder written before env.json had them)
    log_tail: str | None = None  # end of pytest.log, kept for errored cells
    problems: tuple[Problem, ...] = ()
    folder: str = ""
    counts: Counts = field(init=False, compare=False)  # from `tests`
    case_counts: CaseCounts = field(init=False, compare=False)  # from `tests`: their classes (case_class)
    failing_tests: tuple[TestResult, ...] = field(init=False, compare=False, repr=False)
    not_run: NotRun = field(init=False, compare=False)  # from `tests`: what the host could not run
    ran_families: tuple[str, ...] = field(init=False, compare=False)  # families with a distributed case that ran

    def __post_init__(self) -> None:
        object.__setattr__(self, "counts", Counts.of(self.tests))
        object.__setattr__(self, "case_counts", CaseCounts.of(self.tests))
        object.__setattr__(self, "failing_tests", tuple(test for test in self.tests if test.outcome.is_failing))
        object.__setattr__(self, "not_run", NotRun.of(self.tests))
        families = {test.family for test in self.tests if test.family and test.ran_distributed}
        object.__setattr__(self, "ran_families", tuple(sorted(families)))

    @property
    def id(self) -> str:
        return self.info.id

    def installed(self, package: str) -> str | None:
        """The release of `package` the cell ran: env.json's versions, else its cell record's (torch, transformers)."""
        recorded = dict(self.versions).get(package)
        return recorded or {"torch": self.info.torch, "transformers": self.info.transformers}.get(package)

    def reproduce_command(self) -> str:
        """`harness run ... --cell ID -- ARGS`: the run's own pytest arguments, with this cell's new reds (its failing
        tests but those fixed upstream) added to their -k (`-k '(X) and (a or b)'`, or `-k 'a or b'` where the run had
        none). Every part is a checked word, shell-quoted; "" where there is no command (`reproduce` is "")."""
        if not self.reproduce:
            return ""
        names = sorted({_k_name(test.name) for test in self.failing_tests if case_class(test) == CASE_NEW_RED})
        selection = " or ".join(names)
        if not names or len(names) > _K_NAMES or not all(name and len(name) <= _K_NAME_CHARS for name in names):
            selection = ""  # too many, too long or not -k words: the run's own selection, whole
        if self.pytest_args is None:  # written before pytest_args (or they were not plain words): the cell whole
            return f"{self.reproduce} -- -k {shlex.quote(selection)}" if selection else self.reproduce
        args = with_selection(self.pytest_args, selection) if selection else list(self.pytest_args)
        return f"{self.reproduce} -- {shlex.join(args)}" if args else self.reproduce


@dataclass(frozen=True, slots=True)
class ResultSet:
    cells: tuple[CellResult, ...]

    @property
    def counts(self) -> Counts:
        total = Counts()
        for cell in self.cells:
            total = total + cell.counts
        return total

    @property
    def case_counts(self) -> CaseCounts:
        total = CaseCounts()
        for cell in self.cells:
            total = total + cell.case_counts
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


def natural_key(text: str) -> tuple[str | int, ...]:
    """Sort `torch2.9.0` before `torch2.11.0` and `2gpu` before `8gpu`."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def with_selection(pytest_args: Iterable[str], selection: str) -> list[str]:
    """`pytest_args` selecting only `selection` among what they selected: their last -k (the one pytest obeys)
    becomes `(X) and (selection)`; without one, `-k selection` is added."""
    args = list(pytest_args)
    for index in reversed(range(len(args))):
        if args[index] == "-k" and index + 1 < len(args):
            args[index + 1] = f"({args[index + 1]}) and ({selection})"
            return args
        if args[index].startswith("-k") and args[index] != "-k":  # -kEXPRESSION
            args[index] = f"-k({args[index][2:]}) and ({selection})"
            return args
    return [*args, "-k", selection]


def _k_name(test_name: str) -> str:
    """A `-k` term for one test: its full name where the grammar allows it, else the function; "" where neither is
    a -k word (a name is the tested code's to choose: nothing else goes into a command to paste)."""
    if _K_IDENT.match(test_name) and test_name not in _K_KEYWORDS:
        return test_name
    function = test_name.split("[", 1)[0]
    return function if _K_IDENT.match(function) and function not in _K_KEYWORDS else ""


def _only(values: set[str | None]) -> str | None:
    values.discard(None)
    return values.pop() if len(values) == 1 else None
