"""The report's view model: what every rendering of a `ResultSet` shows, gathered once.

Pure functions over the results model: `build_report` groups failures across cells and collects skip
reasons, flaky tests, metrics (worst first), known upstream bugs, coverage, reproduce commands, the
baseline diff and what the run cost (`harness.report.cost`). `harness.report.render` turns a `Report` into
text through reports/; `harness.report.plots` lays out its plots. Both import this module and neither imports
the other.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from harness.contract import KNOWN_BUG_PREFIX
from harness.report.cost import RunCost, run_cost
from harness.report.links import RunLinks
from harness.report.listing import Listed, listed
from harness.report.red_classes import ClassifiedRed, RedClass, RedKey, classify_reds
from harness.results import (
    CellResult,
    CellStatus,
    Comparison,
    Counts,
    Digest,
    Labelled,
    Number,
    Outcome,
    ResultSet,
    TestResult,
    TrainingCurve,
    compare,
    digest,
    finite,
    natural_key,
)
from harness.results.training_trends import TrainingTrends, training_trends


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureGroup:
    """One test failing the same way, in one or more cells."""

    test_id: str
    outcome: Outcome
    message: str
    excerpt: str | None
    attempts: int  # most attempts any of its cells made
    cells: tuple[str, ...]
    training: TrainingCurve | None = None  # a training case's per-step loss and gradient norm (its first cell's)


@dataclass(frozen=True, slots=True, kw_only=True)
class SkipGroup:
    reason: str
    outcome: Outcome  # skipped or xfailed
    tests: int
    cells: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class FlakyTest:
    test_id: str
    cell_id: str
    attempts: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricPoint:
    """One case's measurements in one cell."""

    cell_id: str
    test: TestResult

    @property
    def error(self) -> Number | None:
        return self.test.grad_error

    @property
    def bound(self) -> Number | None:
        return self.test.grad_bound

    @property
    def routing_margin(self) -> Number | None:
        return self.test.routing_margin

    @property
    def logits_difference(self) -> Number | None:
        return self.test.logits_difference

    @property
    def logits_atol(self) -> Number | None:
        return self.test.logits_atol

    @property
    def peak_allocated_mib(self) -> Number | None:
        return self.test.peak_allocated_mib

    @property
    def logits_over(self) -> bool:
        difference, atol = self.logits_difference, finite(self.logits_atol)
        if isinstance(difference, Labelled):
            return not difference.tiny
        return difference is not None and atol is not None and difference > atol

    @property
    def ratio(self) -> float | None:
        return _ratio(self.test)

    @property
    def margin_left(self) -> float | None:
        """Share of the bound still unused: 0.9 is far from it, below 0 is over it."""
        return None if self.ratio is None else 1.0 - self.ratio

    @property
    def expected(self) -> bool:
        """Its test passed (or failed as expected): a metric over its bound is then what the test asserted, as a
        deliberate-bug test does, and is labelled expected, never shown as a failure."""
        return self.test.outcome in (Outcome.PASSED, Outcome.XFAILED)

    @property
    def exceeded(self) -> bool:
        # A non-finite error (inf, nan) is over any bound: the night a gradient blows up is a red one.
        if isinstance(self.error, Labelled):
            return not self.error.tiny
        return self.ratio is not None and self.ratio > 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseMetrics:
    case: str  # the test id, the same in every cell
    worst: MetricPoint  # the cell where the case came closest to (or furthest over) its bound
    measured: tuple[tuple[str, TestResult], ...]  # (cell id, test) for every cell that measured it

    @property
    def points(self) -> tuple[MetricPoint, ...]:
        return tuple(MetricPoint(cell_id=cell_id, test=test) for cell_id, test in self.measured)


@dataclass(frozen=True, slots=True, kw_only=True)
class XfailedCase:
    """An expected failure, with its reason (a known upstream bug says which)."""

    test_id: str
    cell_id: str
    reason: str

    @property
    def known_upstream_bug(self) -> bool:
        return self.reason.startswith(KNOWN_BUG_PREFIX)


@dataclass(frozen=True, slots=True, kw_only=True)
class Coverage:
    """`EP families covered: N of M (transformers X)` of one cell: M from its suite properties, N the declared
    families of which a distributed case ran in this cell (a case skipped for too few ranks covers nothing)."""

    cell_id: str
    covered: tuple[str, ...]  # declared and ran here
    declared: tuple[str, ...]
    transformers: str | None
    reasons: tuple[tuple[str, str], ...] = ()  # (model_type, why not covered), as the suite listed them
    runnable: tuple[str, ...] = ()  # the declared families the suite can build (its ep_families_covered)

    @classmethod
    def of(cls, cell: CellResult) -> Coverage:
        declared = cell.suite.ep_families_declared or ()
        ran = set(cell.ran_families)
        return cls(cell_id=cell.id, covered=tuple(name for name in declared if name in ran), declared=declared,
                   transformers=cell.suite.transformers_version, reasons=cell.suite.ep_families_not_covered,
                   runnable=cell.suite.ep_families_covered or ())

    @property
    def missing(self) -> tuple[tuple[str, str], ...]:
        """Each declared family the cell did not cover, with its reason: the suite's, else that none of its cases
        ran here (a family the suite can build), else "no reason recorded"."""
        listed = dict(self.reasons)
        return tuple(
            (name, listed.get(name) or self._unlisted_reason(name)) for name in self.declared
            if name not in self.covered
        )

    def _unlisted_reason(self, name: str) -> str:
        return "none of its distributed cases ran in this cell" if name in self.runnable else "no reason recorded"


@dataclass(frozen=True, slots=True, kw_only=True)
class Reproduction:
    cell_id: str
    command: str  # `harness run --matrix M --cell 'ID' -- -k '...'`


@dataclass(frozen=True, slots=True, kw_only=True)
class Note:
    cell_id: str
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    cells: tuple[CellResult, ...]
    counts: Counts
    failed_cells: int
    errored_cells: int
    not_run_cells: int  # nothing failed in them, but nothing distributed ran either
    sha: str | None
    sha_dirty: bool  # some cell ran with local changes on top of sha
    matrix: str | None
    failures: tuple[FailureGroup, ...]
    flaky: tuple[FlakyTest, ...]
    skips: tuple[SkipGroup, ...]
    metrics: tuple[CaseMetrics, ...]  # worst first
    xfailed: tuple[XfailedCase, ...]
    coverage: tuple[Coverage, ...]
    reproductions: tuple[Reproduction, ...]
    comparison: Comparison | None
    notes: tuple[Note, ...]
    digest: Digest
    cost: RunCost  # GPU-hours, wall time and wait per cell and in all
    links: RunLinks | None = None  # where the run, each cell's job and artifact are (GitHub Actions only)
    red_classes: Mapping[RedKey, ClassifiedRed] | None = None  # against the baseline nightly, when one was given
    red_baseline_sha: str | None = None  # the commit of the nightly the classes were judged against
    # Training cases' final steps against the baseline's curves (a results folder's digest carries them; a comment's
    # does not): what moved beyond its threshold, new or gone.
    training_trends: TrainingTrends | None = None

    @property
    def failing_cells(self) -> int:
        return self.failed_cells + self.errored_cells

    @property
    def cells_with_cases_not_run(self) -> tuple[CellResult, ...]:
        """Cells that ran nothing distributed, and cells where some cases could not run for too few GPUs or ranks."""
        return tuple(cell for cell in self.cells if cell.status is CellStatus.NOT_RUN or cell.not_run.cases)

    def red_class(self, cell_id: str, test_id: str | None) -> RedClass | None:
        found = self.red_classes.get((cell_id, test_id)) if self.red_classes is not None else None
        return found.red_class if found is not None else None

    def red_label(self, cell_id: str, test_id: str | None) -> str | None:
        """What the red's words look like, shown beside its class (None: nothing, or no baseline to classify by)."""
        found = self.red_classes.get((cell_id, test_id)) if self.red_classes is not None else None
        return found.label if found is not None else None

    @property
    def red_tally(self) -> tuple[tuple[RedClass, int], ...]:
        """How many reds of each class, in the order of `RedClass`; empty without a baseline."""
        if not self.red_classes:
            return ()
        counts = Counter(red.red_class for red in self.red_classes.values())
        return tuple((red_class, counts[red_class]) for red_class in RedClass if counts[red_class])

    def listed_failures(self, per_cell: int, total: int) -> Listed[FailureGroup]:
        """The failure groups a rendering lists: at most `per_cell` of any cell's and `total` in all (a rendering's
        Limits); the rest are counted."""
        return listed(self.failures, lambda group: group.cells, per_cell=per_cell, total=total)


def build_report(
    result_set: ResultSet, *, baseline: Digest | ResultSet | None = None,
    sha: str | None = None, matrix_name: str | None = None,
    links: RunLinks | None = None, red_baseline: ResultSet | None = None,
) -> Report:
    """`baseline`: the previous run of this matrix (deltas); `red_baseline`: main's last nightly, which each
    red is classified against (new, already red there, flaky, known upstream, infrastructure)."""
    if isinstance(baseline, ResultSet):
        baseline = digest(baseline)
    cells = result_set.cells
    sha = sha or result_set.git_sha
    matrix_name = matrix_name or result_set.matrix
    flaky, skips, metrics = _tally_tests(cells)
    return Report(
        cells=cells,
        counts=result_set.counts,
        failed_cells=len(result_set.cells_with(CellStatus.FAILED)),
        errored_cells=len(result_set.cells_with(CellStatus.ERRORED)),
        not_run_cells=len(result_set.cells_with(CellStatus.NOT_RUN)),
        sha=sha,
        sha_dirty=result_set.git_dirty and sha == result_set.git_sha,
        matrix=matrix_name,
        failures=_failure_groups(cells),
        flaky=flaky,
        skips=skips,
        metrics=metrics,
        xfailed=tuple(XfailedCase(test_id=test.test_id, cell_id=cell.id, reason=test.message or "no reason given")
                      for cell in cells for test in cell.tests if test.outcome is Outcome.XFAILED),
        coverage=tuple(Coverage.of(cell) for cell in cells if cell.suite.ep_families_declared is not None),
        # A cell that ran nothing distributed has nothing to reproduce here: it needs a larger host.
        reproductions=tuple(
            Reproduction(cell_id=cell.id, command=cell.reproduce_command())
            for cell in cells if cell.status in (CellStatus.FAILED, CellStatus.ERRORED)
        ),
        comparison=compare(result_set, baseline) if baseline is not None else None,
        notes=tuple(Note(cell_id=cell.id, text=str(problem))
                    for cell in cells for problem in cell.problems if str(problem) != cell.reason),
        digest=digest(result_set, sha=sha, matrix=matrix_name),
        cost=run_cost(cells, links),
        links=links,
        red_classes=classify_reds(result_set, red_baseline) if red_baseline is not None else None,
        red_baseline_sha=red_baseline.git_sha if red_baseline is not None else None,
        training_trends=training_trends(result_set, baseline) if baseline is not None else None,
    )


def _failure_groups(cells: Iterable[CellResult]) -> tuple[FailureGroup, ...]:
    grouped: dict[tuple[str, Outcome, str], list] = {}
    for cell in cells:
        for test in cell.failing_tests:
            key = (test.test_id, test.outcome, test.message or "no message")
            grouped.setdefault(key, []).append((cell.id, test))
    groups = [
        FailureGroup(test_id=test_id, outcome=outcome, message=message, excerpt=found[0][1].excerpt,
                     attempts=max(test.attempts for _, test in found),
                     cells=tuple(cell_id for cell_id, _ in found), training=found[0][1].training)
        for (test_id, outcome, message), found in grouped.items()
    ]
    return tuple(sorted(groups, key=lambda group: (natural_key(group.test_id), group.message)))


def _tally_tests(
    cells: Iterable[CellResult],
) -> tuple[tuple[FlakyTest, ...], tuple[SkipGroup, ...], tuple[CaseMetrics, ...]]:
    """Flaky tests, skip reasons and metrics, in one pass over every test (a nightly set holds 200,000)."""
    flaky = []
    skipped: dict[tuple[Outcome, str], list[str]] = {}
    measured: dict[str, list[tuple[str, TestResult]]] = {}
    for cell in cells:
        cell_id = cell.id
        for test in cell.tests:
            outcome = test.outcome
            if outcome is Outcome.FLAKY:
                flaky.append(FlakyTest(test_id=test.test_id, cell_id=cell_id, attempts=test.attempts))
            elif outcome is Outcome.SKIPPED or outcome is Outcome.XFAILED:
                skipped.setdefault((outcome, test.message or "no reason given"), []).append(cell_id)
            if test.has_metrics:
                measured.setdefault(test.test_id, []).append((cell_id, test))
    skips = [
        SkipGroup(reason=reason, outcome=outcome, tests=len(cell_ids), cells=tuple(dict.fromkeys(cell_ids)))
        for (outcome, reason), cell_ids in skipped.items()
    ]
    cases = []
    for case, found in measured.items():
        worst_cell, worst_test = max(found, key=lambda entry: _closeness(entry[1]))
        cases.append(CaseMetrics(case=case, worst=MetricPoint(cell_id=worst_cell, test=worst_test),
                                 measured=tuple(found)))
    return (
        tuple(flaky),
        tuple(sorted(skips, key=lambda group: (-group.tests, group.outcome.value, group.reason))),
        tuple(sorted(cases, key=lambda case: (_sort_desc(_closeness(case.worst.test)), natural_key(case.case)))),
    )


def _ratio(test: TestResult) -> float | None:
    error, bound = finite(test.grad_error), finite(test.grad_bound)
    if error is None or not bound or bound <= 0:
        return None
    return error / bound


def _closeness(test: TestResult) -> tuple[float, float, float]:
    """Order by error/bound; without a bound by the error; then by the smallest routing margin. A
    labelled (non-finite) error comes first of all."""
    if isinstance(test.grad_error, Labelled) and not test.grad_error.tiny:
        return (math.inf, math.inf, math.inf)
    ratio = _ratio(test)
    error, margin = finite(test.grad_error), finite(test.routing_margin)
    return (
        ratio if ratio is not None else -math.inf,
        error if error is not None else -math.inf,
        -margin if margin is not None else -math.inf,
    )


def _sort_desc(key: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(-value for value in key)
