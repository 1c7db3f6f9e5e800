"""Comparison of a result set with a baseline digest (what changed per cell), and the one rule for what is new
since the night before: `night_before` says which cell of last night a cell of tonight is compared with, and
`new_reds` which of tonight's reds are new, and `new_releases` which torch and transformers releases tonight ran that
last night did not. Triage classifies the new reds, the PR comment's red classes come from triage, and
`nightly_regressions` (the nightly issue's list) is built on them too."""

from __future__ import annotations

from dataclasses import dataclass

from harness.contract import CASE_NEW_RED
from harness.results.digest import CellDigest, Digest, cell_digest, cell_key, test_key
from harness.results.model import (
    CellResult,
    CellStatus,
    Outcome,
    ResultSet,
    TestResult,
    case_class,
    natural_key,
)
from harness.results.values import finite

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
        return not (
            self.status_changed
            or self.new_failures
            or self.fixed
            or self.newly_skipped
            or self.memory
            or self.incomplete
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    baseline_sha: str | None
    cells: tuple[CellChange, ...]  # only cells where something changed


def compare(
    result_set: ResultSet,
    baseline: Digest,
    *,
    memory_change_mib: float = MEMORY_CHANGE_MIB,
    memory_change_fraction: float = MEMORY_CHANGE_FRACTION,
) -> Comparison:
    changes = []
    for cell in result_set.cells:
        before = baseline.cells.get(cell_key(cell.id))
        if before is None:
            if baseline.complete:
                changes.append(CellChange(cell_id=cell.id, status_before=None, status_after=cell.status))
            continue
        change = _cell_change(cell, before, memory_change_mib, memory_change_fraction)
        if not change.is_empty:
            changes.append(change)
    current = {cell_key(cell.id) for cell in result_set.cells}
    changes.extend(
        CellChange(cell_id=cell_id, status_before=before.status, status_after=None)
        for cell_id, before in baseline.cells.items()
        if cell_id not in current
    )
    return Comparison(
        baseline_sha=baseline.git_sha, cells=tuple(sorted(changes, key=lambda change: natural_key(change.cell_id)))
    )


def _cell_change(cell: CellResult, before: CellDigest, change_mib: float, change_fraction: float) -> CellChange:
    outcomes = {test_key(test.test_id): test.outcome for test in cell.tests}
    failing_now = {test_key(test.test_id) for test in cell.failing_tests}
    # A side without tests (an errored cell) has nothing to compare test by test; its status says it.
    comparable = bool(cell.tests) and before.counts.total > 0
    incomplete = []
    new_failures: set[str] = set()
    fixed: set[str] = set()
    if before.failing is None:
        incomplete.append("failing tests")
    elif comparable:
        new_failures = failing_now - before.failing
        fixed = {test_id for test_id in before.failing if outcomes.get(test_id) in (Outcome.PASSED, Outcome.FLAKY)}
    newly_skipped: set[str] = set()
    if before.skipped is None:
        incomplete.append("skipped tests")
    elif comparable:
        newly_skipped = {
            test_id
            for test_id, outcome in outcomes.items()
            if outcome is Outcome.SKIPPED and test_id not in before.skipped
        }
    return CellChange(
        cell_id=cell.id,
        status_before=before.status,
        status_after=cell.status,
        new_failures=tuple(sorted(new_failures, key=natural_key)),
        fixed=tuple(sorted(fixed, key=natural_key)),
        newly_skipped=tuple(sorted(newly_skipped, key=natural_key)),
        memory=_memory_changes(cell, before, change_mib, change_fraction),
        incomplete=tuple(incomplete),
        tests_compared=comparable,
    )


def _memory_changes(
    cell: CellResult, before: CellDigest, change_mib: float, change_fraction: float
) -> tuple[MemoryChange, ...]:
    """Each GPU whose peak moved by at least `change_mib` and `change_fraction` of what it was."""
    memory = []
    for gpu in cell.memory:
        if gpu.index >= len(before.peak_used_mib):
            continue
        old, new = before.peak_used_mib[gpu.index], finite(gpu.peak_used_mib)
        if old is None or new is None:
            continue
        if abs(new - old) >= change_mib and abs(new - old) >= change_fraction * max(old, 1.0):
            memory.append(MemoryChange(gpu_index=gpu.index, before_mib=old, after_mib=new))
    return tuple(memory)


# ---------------------------------------------------------------------------------------------
# Since the night before


@dataclass(frozen=True, slots=True, kw_only=True)
class NewRed:
    """A red of tonight that was not red the night before: a failing or flaky test, or (`test` None) a cell that
    errored without a failing test."""

    cell: CellResult
    test: TestResult | None
    before: CellResult | None  # night_before(cell): None where the night before had no cell of its shape
    was: Outcome | None = None  # the test's outcome the night before (None: it had no result)


def new_reds(tonight: ResultSet, baseline: ResultSet | None) -> tuple[NewRed, ...]:
    """Every red of tonight that was not red the night before, cell by cell in id order."""
    baseline = baseline or ResultSet(cells=())
    found: list[NewRed] = []
    for cell in sorted(tonight.cells, key=lambda c: natural_key(c.id)):
        found.extend(_new_reds_of(cell, night_before(cell, baseline)))
    return tuple(found)


def _new_reds_of(cell: CellResult, before: CellResult | None) -> list[NewRed]:
    """A test is new unless it failed or errored the night before; a cell that errored without a failing test is
    new unless that cell errored too."""
    if cell.status is CellStatus.ERRORED and not cell.failing_tests:
        new = before is None or before.status is not CellStatus.ERRORED
        return [NewRed(cell=cell, test=None, before=before)] if new else []
    outcome_before = {test.test_id: test.outcome for test in before.tests} if before else {}
    found = []
    for test in [*cell.failing_tests, *(t for t in cell.tests if t.outcome is Outcome.FLAKY)]:
        was = outcome_before.get(test.test_id)
        if was is None or not was.is_failing:
            found.append(NewRed(cell=cell, test=test, before=before, was=was))
    return found


def night_before(cell: CellResult, baseline: ResultSet) -> CellResult | None:
    """Last night's cell of the same runner shape: the same id, else (versions floated) the same GPU
    type, count and hosts with the same torch, else the same transformers. The shape is what env.json
    records, never parsed from the id."""
    same_shape = [b for b in baseline.cells if _shape(b) == _shape(cell)]
    for matches in (
        (lambda b: b.id == cell.id),
        (lambda b: b.info.torch == cell.info.torch),
        (lambda b: b.info.transformers == cell.info.transformers),
    ):
        found = sorted((b for b in same_shape if matches(b)), key=lambda b: natural_key(b.id))
        if found:
            return found[-1]
    return None


# The packages whose releases a night is read against ("New since last night: transformers A → B; torch C").
RELEASE_PACKAGES = ("transformers", "torch")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseChange:
    """One package's releases over a night's cells, as env.json recorded them: last night's and tonight's, each
    distinct release once, oldest first. `before` is empty where there are no results from the night before."""

    package: str
    before: tuple[str, ...]
    after: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return bool(self.before) and self.before != self.after


def new_releases(tonight: ResultSet, baseline: ResultSet | None) -> tuple[ReleaseChange, ...]:
    """Each of RELEASE_PACKAGES, tonight's releases against the night before's."""
    before_cells = baseline.cells if baseline is not None else ()
    return tuple(
        ReleaseChange(package=package, before=_releases(before_cells, package), after=_releases(tonight.cells, package))
        for package in RELEASE_PACKAGES
    )


def _releases(cells: tuple[CellResult, ...], package: str) -> tuple[str, ...]:
    found = {release for cell in cells if (release := cell.installed(package))}
    return tuple(sorted(found, key=natural_key))


@dataclass(frozen=True, slots=True, kw_only=True)
class Regression:
    """One thing worse than the night before. `kind`: errored (the cell broke; `text` says why), failing
    (`test_id` failed, `text` is its outcome), or memory (`memory` grew past both limits). From triage.json, a red
    also carries its class, the label its words got ("looks like an OOM") and its bisect's line, as triage wrote
    them."""

    cell_id: str
    kind: str
    test_id: str | None = None
    text: str | None = None
    no_result_before: bool = False  # the cell had no tests the night before: every failure is new
    memory: MemoryChange | None = None
    triage_class: str | None = None
    label: str | None = None
    bisect: str | None = None


def nightly_regressions(
    result_set: ResultSet,
    baseline: ResultSet | None,
    *,
    memory_mib: float,
    memory_percent: float,
) -> tuple[Regression, ...]:
    """What got worse since the previous night, by `new_reds`: tests failing that did not fail then (a flaky one
    passed in the end, and one fixed upstream is no red: no regression), cells that newly errored without one, and GPU
    peak memory that grew by more than both limits against the same night-before cell."""
    baseline = baseline or ResultSet(cells=())
    found: list[Regression] = []
    for cell in sorted(result_set.cells, key=lambda c: natural_key(c.id)):
        before = night_before(cell, baseline)
        reds = _new_reds_of(cell, before)
        if cell.status is CellStatus.ERRORED and not cell.failing_tests:
            if reds:
                found.append(Regression(cell_id=cell.id, kind="errored", text=cell.reason))
            continue
        # No tests the night before (a new or errored cell): every failure tonight is new.
        no_result = before is None or not before.tests
        failing = {test_key(red.test.test_id): red.test.outcome.value for red in reds  # every red has a test here
                   if red.test is not None and case_class(red.test) == CASE_NEW_RED}
        found.extend(
            Regression(cell_id=cell.id, kind="failing", test_id=test_id, text=failing[test_id],
                       no_result_before=no_result)
            for test_id in sorted(failing, key=natural_key)
        )
        if cell.status is not CellStatus.ERRORED and before is not None:
            grew = _memory_changes(cell, cell_digest(before), memory_mib, memory_percent / 100)
            found.extend(Regression(cell_id=cell.id, kind="memory", memory=gpu)
                         for gpu in grew if gpu.after_mib > gpu.before_mib)
    return tuple(found)


def _shape(cell: CellResult) -> tuple[str | None, int | None, int]:
    # A cell recorded before cells spanned hosts ran on one.
    return cell.info.gpu, cell.info.gpus, cell.info.hosts or 1
