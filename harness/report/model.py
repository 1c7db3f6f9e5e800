"""The report's view model: what every rendering of a `ResultSet` shows, gathered once.

Pure functions over the results model: `build_report` sorts every case into its class (results.case_class) and
never mixes them: the new reds (the only red, grouped across cells), the cases a known-bugs entry still explains and
those fixed upstream (with the entries' keys and the cell's releases), the cases not built and not run (by reason);
beside them flaky tests, plain expected failures, metrics (worst first; `Report.metrics_news` and
`metrics_settled` split them as the Markdown lists them), coverage, reproduce commands, the baseline
diff and what the run cost (`harness.report.cost`). A cell whose only failures are fixed upstream is not red
(`shown_status`), whatever env.json's status says. `harness.report.render` turns a `Report` into
text through reports/; `harness.report.plots` lays out its plots. Both import this module and neither imports
the other.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from harness.contract import (
    CASE_FIXED_UPSTREAM,
    CASE_KNOWN_PRESENT,
    CASE_NEW_RED,
    CASE_NOT_BUILT,
    CASE_NOT_RUN,
    CASE_PASSED,
    PLANTED_DEFECT,
)
from harness.report.cost import RunCost, run_cost
from harness.report.links import RunLinks
from harness.report.listing import Listed, listed
from harness.report.red_classes import ClassifiedRed, RedClass, RedKey, classify_reds
from harness.results import (
    CaseCounts,
    CellResult,
    CellStatus,
    Comparison,
    Counts,
    Digest,
    Labelled,
    Number,
    Outcome,
    ReleaseChange,
    ResultSet,
    TestResult,
    TrainingCurve,
    case_class,
    compare,
    digest,
    finite,
    natural_key,
    nothing_distributed_ran,
)
from harness.results.nightly_records import ReleaseRecord
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
    """Skipped cases of one reason: not run (the skip's reason) or not built (the suite's, contract.NOT_BUILT)."""

    reason: str
    tests: int
    cells: tuple[str, ...]


def reason_groups(found: Iterable[tuple[str, str]]) -> tuple[SkipGroup, ...]:
    """(cell id, reason) pairs grouped by reason, the most cases first."""
    return tuple(SkipGroup(reason=reason, tests=count, cells=cells) for reason, count, cells in counted(found))


K = TypeVar("K", str, tuple[str, ...])  # a skip's reason, or the known-bugs entries a case names


def counted(found: Iterable[tuple[str, K]]) -> list[tuple[K, int, tuple[str, ...]]]:
    """(cell id, key) pairs as (key, cases, cells), the most cases first, then by key."""
    cells_of: dict[K, list[str]] = {}
    for cell_id, key in found:
        cells_of.setdefault(key, []).append(cell_id)
    groups = [(key, len(cell_ids), tuple(dict.fromkeys(cell_ids))) for key, cell_ids in cells_of.items()]
    return sorted(groups, key=lambda group: (-group[1], group[0]))


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


# What a metrics row is news as, most telling first (`metric_news`): a new red, a case fixed upstream, a case that
# passed; the rest is settled (`SETTLED_AS`).
NEWS_NEW_RED, NEWS_FIXED_UPSTREAM, NEWS_PASSED, SETTLED = 0, 1, 2, 3


def metric_news(test: TestResult) -> int:
    """How telling a measured case is in one cell: new red, fixed upstream, passed, or SETTLED (a known bug still
    present, a planted defect, a plain expected failure, a case not built or not run), from its class
    (results.case_class) and its typed properties only."""
    case = case_class(test)
    if case == CASE_NEW_RED:
        return NEWS_NEW_RED
    if case == CASE_FIXED_UPSTREAM:
        return NEWS_FIXED_UPSTREAM
    if case == CASE_PASSED and test.outcome is not Outcome.XFAILED and test.property_value(PLANTED_DEFECT) is None:
        return NEWS_PASSED
    return SETTLED


def settled_as(test: TestResult) -> str:
    """Why a settled measured case is no news, in a word the metrics tables show."""
    case = case_class(test)
    if case == CASE_KNOWN_PRESENT:
        return "known bug"
    if case == CASE_NOT_BUILT:
        return "not built"
    if case == CASE_NOT_RUN:
        return "not run"
    if test.property_value(PLANTED_DEFECT) is not None:
        return "planted defect"
    return "expected failure"


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseMetrics:
    case: str  # the test id, the same in every cell
    # The cell shown: of the case's most telling cells (metric_news: where it is a new red, else fixed upstream, else
    # passed, else any), the one where it came closest to (or furthest over) its bound.
    worst: MetricPoint
    measured: tuple[tuple[str, TestResult], ...]  # (cell id, test) for every cell that measured it

    @property
    def points(self) -> tuple[MetricPoint, ...]:
        return tuple(MetricPoint(cell_id=cell_id, test=test) for cell_id, test in self.measured)

    @property
    def news(self) -> int:
        """metric_news of the cell shown."""
        return metric_news(self.worst.test)

    @property
    def settled_as(self) -> str | None:
        """Why the row is no news (settled_as), None for news."""
        return settled_as(self.worst.test) if self.news == SETTLED else None


@dataclass(frozen=True, slots=True, kw_only=True)
class XfailedCase:
    """An expected failure no known-bugs entry names (a plain xfail mark), with its reason: it failed as its test
    expects, so it passed."""

    test_id: str
    cell_id: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class KnownBugCase:
    """A case a known-bugs entry names: still present (it failed as the entry says) or fixed upstream (it passed:
    close the entry's range), with the entries' keys and the releases its cell ran."""

    test_id: str
    cell_id: str
    keys: tuple[str, ...]
    transformers: str | None
    torch: str | None

    @classmethod
    def of(cls, cell: CellResult, test: TestResult, keys: tuple[str, ...]) -> KnownBugCase:
        return cls(test_id=test.test_id, cell_id=cell.id, keys=keys, transformers=cell.installed("transformers"),
                   torch=cell.installed("torch"))


@dataclass(frozen=True, slots=True, kw_only=True)
class KnownBugGroup:
    """The cases one set of known-bugs entries names, in the cells they ran in."""

    keys: tuple[str, ...]
    cases: int
    cells: tuple[str, ...]


def known_bug_groups(cases: Iterable[KnownBugCase]) -> tuple[KnownBugGroup, ...]:
    return tuple(KnownBugGroup(keys=keys, cases=count, cells=cells)
                 for keys, count, cells in counted((case.cell_id, case.keys) for case in cases))


@dataclass(frozen=True, slots=True, kw_only=True)
class Classified:
    """The cases the renderings list apart from the new reds (`FailureGroup`s): known, fixed upstream, not built and
    not run, and among the passed ones the flaky tests and the plain expected failures."""

    flaky: tuple[FlakyTest, ...]
    known_present: tuple[KnownBugCase, ...]
    fixed_upstream: tuple[KnownBugCase, ...]
    not_built: tuple[SkipGroup, ...]
    not_run: tuple[SkipGroup, ...]
    xfailed: tuple[XfailedCase, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Coverage:
    """`EP families covered: N of M (transformers X)` of one cell: M from its suite properties, N the declared
    families of which a distributed case ran in this cell (a case skipped, for too few ranks or as not built, covers
    nothing)."""

    cell_id: str
    covered: tuple[str, ...]  # declared and ran here
    declared: tuple[str, ...]
    transformers: str | None
    reasons: tuple[tuple[str, str], ...] = ()  # (model_type, why not covered), as the suite listed them
    runnable: tuple[str, ...] = ()  # the declared families the suite can build (its ep_families_covered)
    not_built: tuple[tuple[str, str], ...] = ()  # (model_type, why), for families with a case the suite did not build

    @classmethod
    def of(cls, cell: CellResult) -> Coverage:
        declared = cell.suite.ep_families_declared or ()
        ran = set(cell.ran_families)
        not_built = {test.family: test.not_built for test in cell.tests  # a not-built case says why
                     if test.family and test.not_built is not None and case_class(test) == CASE_NOT_BUILT}
        return cls(cell_id=cell.id, covered=tuple(name for name in declared if name in ran), declared=declared,
                   transformers=cell.suite.transformers_version, reasons=cell.suite.ep_families_not_covered,
                   runnable=cell.suite.ep_families_covered or (), not_built=tuple(sorted(not_built.items())))

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
        """A not-built case is a skip: a family none of whose cases ran is not covered, and one of its not-built
        cases, where it has one, says why."""
        not_built = dict(self.not_built)
        if name in not_built:
            return f"not built: {not_built[name] or 'no reason recorded'}"
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
    case_counts: CaseCounts  # every case by its class
    failures: tuple[FailureGroup, ...]  # the new reds: the only red
    known_present: tuple[KnownBugCase, ...]
    fixed_upstream: tuple[KnownBugCase, ...]
    not_built_reasons: tuple[SkipGroup, ...]  # the most cases first
    not_run_reasons: tuple[SkipGroup, ...]  # the skips' reasons, the most cases first
    flaky: tuple[FlakyTest, ...]
    xfailed: tuple[XfailedCase, ...]  # plain xfail marks: no known-bugs entry names them
    metrics: tuple[CaseMetrics, ...]  # worst first
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
    def known_present_by_entries(self) -> tuple[KnownBugGroup, ...]:
        """The known cases still present, one group per set of known-bugs entries, the most cases first: what a
        terminal lists (the HTML and the comments list every case)."""
        return known_bug_groups(self.known_present)

    @property
    def cells_with_cases_not_run(self) -> tuple[CellResult, ...]:
        """Cells that ran nothing distributed, and cells where some cases could not run for too few GPUs or ranks."""
        return tuple(cell for cell in self.cells if shown_status(cell) is CellStatus.NOT_RUN or cell.not_run.cases)

    def status_of(self, cell: CellResult) -> CellStatus:
        """The status a rendering shows for the cell (`shown_status`)."""
        return shown_status(cell)

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

    @property
    def metrics_news(self) -> tuple[CaseMetrics, ...]:
        """The metrics rows that are news, as the Markdown leads with them: new reds, then cases fixed upstream, then
        those that passed; each group closest to its bound first."""
        return tuple(sorted((case for case in self.metrics if case.news != SETTLED), key=lambda case: case.news))

    @property
    def metrics_settled(self) -> tuple[CaseMetrics, ...]:
        """The rest, closest to its bound first: known bugs still present, planted defects, plain expected failures,
        cases not built or not run."""
        return tuple(case for case in self.metrics if case.news == SETTLED)

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
    classified, metrics = _tally_tests(cells)
    statuses = Counter(shown_status(cell) for cell in cells)
    return Report(
        cells=cells,
        counts=result_set.counts,
        failed_cells=statuses[CellStatus.FAILED],
        errored_cells=statuses[CellStatus.ERRORED],
        not_run_cells=statuses[CellStatus.NOT_RUN],
        sha=sha,
        sha_dirty=result_set.git_dirty and sha == result_set.git_sha,
        matrix=matrix_name,
        case_counts=result_set.case_counts,
        failures=_failure_groups(cells),
        known_present=classified.known_present,
        fixed_upstream=classified.fixed_upstream,
        not_built_reasons=classified.not_built,
        not_run_reasons=classified.not_run,
        flaky=classified.flaky,
        xfailed=classified.xfailed,
        metrics=metrics,
        coverage=tuple(Coverage.of(cell) for cell in cells if cell.suite.ep_families_declared is not None),
        # A cell that ran nothing distributed has nothing to reproduce here: it needs a larger host; nor one whose only
        # failures are fixed upstream: its red is the known-bugs table's; nor one whose id harness would not build.
        reproductions=tuple(
            Reproduction(cell_id=cell.id, command=cell.reproduce_command())
            for cell in cells if shown_status(cell) in (CellStatus.FAILED, CellStatus.ERRORED) and cell.reproduce
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


def against_last_night(releases: Iterable[ReleaseChange | ReleaseRecord]) -> tuple[ReleaseChange | ReleaseRecord, ...]:
    """The releases new since last night as the triage table and the nightly issue open with them: none where the
    night before has no results, as there is nothing to be new against."""
    found = tuple(releases)
    return found if any(release.before for release in found) else ()


def shown_status(cell: CellResult) -> CellStatus:
    """The cell's status as every rendering shows it: env.json's, but for a failed cell whose only failing tests are
    fixed upstream. Those passed; what is red is the known-bugs table's range, so the cell reads as the rest of its
    cases do: not run where nothing distributed ran, else passed."""
    if cell.status is not CellStatus.FAILED or not cell.failing_tests or cell.case_counts.new_red:
        return cell.status
    return CellStatus.NOT_RUN if nothing_distributed_ran(cell.tests) else CellStatus.PASSED


def _failure_groups(cells: Iterable[CellResult]) -> tuple[FailureGroup, ...]:
    """The new reds, each test failing one way grouped across the cells it failed in."""
    grouped: dict[tuple[str, Outcome, str], list] = {}
    for cell in cells:
        for test in cell.failing_tests:
            if case_class(test) != CASE_NEW_RED:
                continue
            key = (test.test_id, test.outcome, test.message or "no message")
            grouped.setdefault(key, []).append((cell.id, test))
    groups = [
        FailureGroup(test_id=test_id, outcome=outcome, message=message, excerpt=found[0][1].excerpt,
                     attempts=max(test.attempts for _, test in found),
                     cells=tuple(cell_id for cell_id, _ in found), training=found[0][1].training)
        for (test_id, outcome, message), found in grouped.items()
    ]
    return tuple(sorted(groups, key=lambda group: (natural_key(group.test_id), group.message)))


def _tally_tests(cells: Iterable[CellResult]) -> tuple[Classified, tuple[CaseMetrics, ...]]:
    """The cases of each class but new red and passed, and the metrics, in one pass over every test (a nightly set
    holds 200,000)."""
    flaky, known, fixed, xfailed = [], [], [], []
    not_built: list[tuple[str, str]] = []  # (cell id, reason)
    not_run: list[tuple[str, str]] = []
    measured: dict[str, list[tuple[str, TestResult]]] = {}
    for cell in cells:
        cell_id = cell.id
        for test in cell.tests:
            outcome = test.outcome
            if outcome is Outcome.FLAKY:
                flaky.append(FlakyTest(test_id=test.test_id, cell_id=cell_id, attempts=test.attempts))
            elif outcome is not Outcome.PASSED:
                case = case_class(test)
                if case == CASE_KNOWN_PRESENT:
                    known.append(KnownBugCase.of(cell, test, test.known_bug))
                elif case == CASE_FIXED_UPSTREAM:
                    fixed.append(KnownBugCase.of(cell, test, test.known_bug_fixed))
                elif case == CASE_NOT_BUILT:
                    not_built.append((cell_id, test.not_built or "no reason recorded"))
                elif case == CASE_NOT_RUN:
                    not_run.append((cell_id, test.message or "no reason given"))
                elif outcome is Outcome.XFAILED:
                    xfailed.append(XfailedCase(test_id=test.test_id, cell_id=cell_id,
                                               reason=test.message or "no reason given"))
            if test.has_metrics:
                measured.setdefault(test.test_id, []).append((cell_id, test))
    cases = []
    for case_id, found in measured.items():
        worst_cell, worst_test = max(found, key=lambda entry: (-metric_news(entry[1]), _closeness(entry[1])))
        cases.append(CaseMetrics(case=case_id, worst=MetricPoint(cell_id=worst_cell, test=worst_test),
                                 measured=tuple(found)))
    classified = Classified(flaky=tuple(flaky), known_present=tuple(known), fixed_upstream=tuple(fixed),
                            not_built=reason_groups(not_built), not_run=reason_groups(not_run),
                            xfailed=tuple(xfailed))
    return classified, tuple(sorted(cases, key=lambda case: (_sort_desc(_closeness(case.worst.test)),
                                                            natural_key(case.case))))


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
