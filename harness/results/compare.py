"""Comparison of a result set with a baseline digest: what changed per cell, and what of that is a
nightly regression (worse than the night before). `night_before` is the one rule for which cell of the
night before a cell of tonight is compared with: triage (and through its output, the nightly issue) uses it."""

from __future__ import annotations

from dataclasses import dataclass

from harness.results.digest import CellDigest, Digest, cell_key, test_key
from harness.results.model import CellResult, CellStatus, Outcome, ResultSet, natural_key
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
    memory = []
    for gpu in cell.memory:
        if gpu.index >= len(before.peak_used_mib):
            continue
        old, new = before.peak_used_mib[gpu.index], finite(gpu.peak_used_mib)
        if old is None or new is None:
            continue
        if abs(new - old) >= change_mib and abs(new - old) >= change_fraction * max(old, 1.0):
            memory.append(MemoryChange(gpu_index=gpu.index, before_mib=old, after_mib=new))
    return CellChange(
        cell_id=cell.id,
        status_before=before.status,
        status_after=cell.status,
        new_failures=tuple(sorted(new_failures, key=natural_key)),
        fixed=tuple(sorted(fixed, key=natural_key)),
        newly_skipped=tuple(sorted(newly_skipped, key=natural_key)),
        memory=tuple(memory),
        incomplete=tuple(incomplete),
        tests_compared=comparable,
    )


# ---------------------------------------------------------------------------------------------
# Nightly regressions


@dataclass(frozen=True, slots=True, kw_only=True)
class Regression:
    """One thing worse than the night before. `kind`: errored (the cell broke; `text` says why), failing
    (`test_id` failed, `text` is its outcome), or memory (`memory` grew past both limits)."""

    cell_id: str
    kind: str
    test_id: str | None = None
    text: str | None = None
    no_result_before: bool = False  # the cell had no tests the night before: every failure is new
    memory: MemoryChange | None = None


def nightly_regressions(
    result_set: ResultSet,
    baseline: Digest,
    *,
    memory_mib: float,
    memory_percent: float,
) -> tuple[Regression, ...]:
    """What got worse since the previous night: tests failing that did not fail then, cells that
    newly errored, and GPU peak memory that grew by more than both limits."""
    cells = {cell.id: cell for cell in result_set.cells}
    comparison = compare(
        result_set, baseline, memory_change_mib=memory_mib, memory_change_fraction=memory_percent / 100
    )
    found: list[Regression] = []
    for change in comparison.cells:
        cell = cells.get(change.cell_id)
        if cell is None:  # a cell of the night before that did not run tonight
            continue
        if cell.status is CellStatus.ERRORED:
            if change.status_before is not CellStatus.ERRORED:
                found.append(Regression(cell_id=cell.id, kind="errored", text=cell.reason))
            continue
        outcomes = {test_key(test.test_id): test.outcome.value for test in cell.failing_tests}
        if change.tests_compared:
            new_failures, no_result = change.new_failures, False
        else:  # no tests the night before (a new or errored cell): every failure tonight is new
            new_failures, no_result = sorted(outcomes, key=natural_key), True
        found.extend(
            Regression(
                cell_id=cell.id, kind="failing", test_id=test_id, text=outcomes[test_id], no_result_before=no_result
            )
            for test_id in new_failures
        )
        found.extend(
            Regression(cell_id=cell.id, kind="memory", memory=gpu)
            for gpu in change.memory
            if gpu.after_mib > gpu.before_mib
        )
    return tuple(found)


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


def _shape(cell: CellResult) -> tuple[str | None, int | None, int]:
    # A cell recorded before cells spanned hosts ran on one.
    return cell.info.gpu, cell.info.gpus, cell.info.hosts or 1
