"""Training trends since the night before: each training case's final step tonight against last night's, from the
curves a digest keeps (harness.results.digest: CellDigest.training, keyed by cell key and test key). A case whose
final-step loss, or that loss's gap to the whole model's, moved beyond its dtype's threshold is listed with both
nights' values, as is a case new or gone in a cell both nights ran; the rest are counted. Values are the reader's
(results.training): a number that is not finite is its label, compared as a label, never computed with."""

from __future__ import annotations

from dataclasses import dataclass

from harness.contract import CASE_DTYPE
from harness.results.digest import Digest, cell_key, test_key
from harness.results.model import ResultSet, TestResult, natural_key
from harness.results.training import TrainingCurve
from harness.results.values import Labelled, Number, finite

# Relative change of a final-step loss beyond which a case is listed: 1e-3 (0.1%). The models are tiny and
# deterministic: the same code on the same versions gives the same loss bit for bit, and a torch or transformers that
# floated changes a float32 loss by rounding only. float32 rounds at 6e-8 relative; even a few hundred roundings
# compounding over the suite's 3 steps stay near 1e-5 (an estimate from the unit, not a measurement), and 1e-3 is a
# hundred times that while still far below what a change to the model, the loss or the optimizer does. Above it, the
# code changed. The gap |sharded - whole| / |whole| is already a fraction of the loss: it is listed when it moves by
# more than the same 1e-3 (two gaps of ~1e-7 compared with each other would call rounding a change).
THRESHOLD = 1e-3
# A case that trained in a 16-bit dtype rounds at that dtype's unit (2**-8 bfloat16, 2**-11 float16): four of them.
DTYPE_THRESHOLDS = {"bfloat16": 4 * 2**-8, "float16": 4 * 2**-11}

LOSS = "loss"
GAP = "gap"
STEPS = "steps"
NEW_CELL = "not in the night before's results"
GONE_CELL = "not in tonight's results"
NO_TESTS_TONIGHT = "no tests tonight"
NO_TESTS_BEFORE = "no tests the night before"


@dataclass(frozen=True, slots=True, kw_only=True)
class FinalStep:
    """A curve's last step: the sharded run's loss and the whole model's (None: not recorded)."""

    step: int
    loss: Number | None
    whole_loss: Number | None

    @classmethod
    def of(cls, curve: TrainingCurve) -> FinalStep:
        if not curve.steps:
            return cls(step=0, loss=None, whole_loss=None)
        return cls(step=curve.steps, loss=curve.losses[-1], whole_loss=curve.whole_losses[-1])

    @property
    def gap(self) -> float | None:
        """|sharded - whole| / |whole|, where both are finite and the whole model's loss is not zero."""
        loss, whole = finite(self.loss), finite(self.whole_loss)
        if loss is None or whole is None or whole == 0.0:
            return None
        return abs(loss - whole) / abs(whole)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingTrend:
    """One training case listed: moved (`moved` says what: steps, loss, gap), new (`before` None) or gone (`after`
    None)."""

    cell_id: str
    test_id: str
    before: FinalStep | None
    after: FinalStep | None
    moved: tuple[str, ...] = ()
    threshold: float = THRESHOLD

    @property
    def kind(self) -> str:
        return "new" if self.before is None else "gone" if self.after is None else "moved"

    @property
    def loss_change(self) -> float | None:
        """Tonight's final-step loss against last night's, relative (0.01: 1% higher); None where not computable."""
        if self.before is None or self.after is None:
            return None
        before, after = finite(self.before.loss), finite(self.after.loss)
        if before is None or after is None or before == 0.0:
            return None
        return (after - before) / abs(before)


@dataclass(frozen=True, slots=True, kw_only=True)
class CellNotCompared:
    """A cell whose training cases only one night can tell: new or gone (or renamed: its versions floated), or
    without tests on one night (it errored). The comparison with the baseline says why; this counts the cases."""

    cell_id: str
    cases: int  # training cases of the night that has them
    why: str  # one of NEW_CELL, GONE_CELL, NO_TESTS_TONIGHT, NO_TESTS_BEFORE


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingTrends:
    compared: int  # cases with a curve on both nights, in a cell both nights ran
    trends: tuple[TrainingTrend, ...]  # moved, new or gone; by cell, then test
    cells_not_compared: tuple[CellNotCompared, ...] = ()
    threshold: float = THRESHOLD
    dtype_thresholds: tuple[tuple[str, float], ...] = tuple(DTYPE_THRESHOLDS.items())

    def count(self, kind: str) -> int:
        return sum(1 for trend in self.trends if trend.kind == kind)


def training_trends(result_set: ResultSet, baseline: Digest) -> TrainingTrends | None:
    """Tonight's training cases against the baseline's curves; None where the baseline carries none (a comment's
    digest) or neither night has a training case."""
    carried = {key: cell.training for key, cell in baseline.cells.items() if cell.training is not None}
    tonight = {cell_key(cell.id): (cell, _cases(cell.tests)) for cell in result_set.cells}
    if not carried or not (any(cases for _, cases in tonight.values()) or any(carried.values())):
        return None
    compared = 0
    trends: list[TrainingTrend] = []
    not_compared: list[CellNotCompared] = []
    for key, (cell, cases) in tonight.items():
        curves_before = carried.get(key)
        if curves_before is None:
            # A complete digest without the cell: new (a cell the digest holds without curves is not carried).
            if cases and key not in baseline.cells and baseline.complete:
                not_compared.append(CellNotCompared(cell_id=cell.id, cases=len(cases), why=NEW_CELL))
            continue
        # A night without tests (the cell errored) says nothing of its training cases: not every one is new or gone.
        if not cell.tests or not baseline.cells[key].counts.total:
            if cases or curves_before:
                not_compared.append(CellNotCompared(cell_id=cell.id, cases=len(cases or curves_before),
                                                    why=NO_TESTS_BEFORE if cell.tests else NO_TESTS_TONIGHT))
            continue
        for case_key, test in cases.items():
            assert test.training is not None  # _cases keeps the tests with a curve
            before = curves_before.get(case_key)
            if before is None:
                trends.append(TrainingTrend(cell_id=cell.id, test_id=test.test_id, before=None,
                                            after=FinalStep.of(test.training)))
                continue
            compared += 1
            trend = _trend(cell.id, test, before)
            if trend.moved:
                trends.append(trend)
        trends.extend(TrainingTrend(cell_id=cell.id, test_id=case_key, before=FinalStep.of(curve), after=None)
                      for case_key, curve in curves_before.items() if case_key not in cases)
    not_compared.extend(CellNotCompared(cell_id=key, cases=len(curves), why=GONE_CELL)
                        for key, curves in carried.items() if key not in tonight and curves)
    return TrainingTrends(
        compared=compared,
        trends=tuple(sorted(trends, key=lambda trend: (natural_key(trend.cell_id), natural_key(trend.test_id)))),
        cells_not_compared=tuple(sorted(not_compared, key=lambda cell: natural_key(cell.cell_id))),
    )


def threshold_of(test: TestResult) -> float:
    """The case's threshold: its recorded dtype's, else float32's (a case that does not say is held to the
    tightest)."""
    return DTYPE_THRESHOLDS.get(test.property_value(CASE_DTYPE) or "", THRESHOLD)


def _cases(tests: tuple[TestResult, ...]) -> dict[str, TestResult]:
    return {test_key(test.test_id): test for test in tests if test.training is not None}


def _trend(cell_id: str, test: TestResult, curve_before: TrainingCurve) -> TrainingTrend:
    assert test.training is not None  # a case of _cases
    before, after = FinalStep.of(curve_before), FinalStep.of(test.training)
    threshold = threshold_of(test)
    moved = []
    if before.step != after.step:
        moved.append(STEPS)
    if _value_moved(before.loss, after.loss, threshold):
        moved.append(LOSS)
    if _gap_moved(before.gap, after.gap, threshold):
        moved.append(GAP)
    return TrainingTrend(cell_id=cell_id, test_id=test.test_id, before=before, after=after, moved=tuple(moved),
                         threshold=threshold)


def _value_moved(before: Number | None, after: Number | None, threshold: float) -> bool:
    """Moved by more than `threshold` relative to `before`; a value that appeared, vanished or changed its label
    (nan, inf) moved too."""
    if before is None or after is None:
        return (before is None) is not (after is None)
    if isinstance(before, Labelled) or isinstance(after, Labelled):
        if isinstance(before, Labelled) and isinstance(after, Labelled):
            return not (before.tiny and after.tiny) and before.label != after.label
        return True
    if before == after:
        return False
    return before == 0.0 or abs(after - before) > threshold * abs(before)


def _gap_moved(before: float | None, after: float | None, threshold: float) -> bool:
    if before is None or after is None:
        return (before is None) is not (after is None)
    return before != after and abs(after - before) > threshold
