"""Render a `ResultSet` as a PR comment, a job summary, a terminal table or one HTML file.

Pure functions over the results model: `build_report` gathers what every rendering shows (failures
grouped across cells, skip reasons, flaky tests, metrics, reproduce commands, the baseline diff);
the templates in reports/ turn it into text. Everything a test wrote passes through one of the
escaping filters of `harness.filters` before it reaches Markdown, HTML or a terminal, the nightly
issue included (`render_nightly`); `harness.plots` lays out the HTML report's plots.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import jinja2

from harness.contract import COMMENT_MARKER, KNOWN_BUG_PREFIX
from harness.errors import ConfigError
from harness.filters import (
    clean_block,
    code_span,
    duration,
    fence_for,
    gib,
    html_text,
    markdown_text,
    memory_per_gpu,
    mib_or_gib,
    one_line,
    pad,
    percent,
    plural,
    scientific,
    short_sha,
    significant,
)
from harness.plots import html_plots
from harness.project import shipped_reports_dir
from harness.results import (
    DIGEST_TAG,
    BaselineUnreadable,
    CellResult,
    CellStatus,
    Comparison,
    Counts,
    Digest,
    Labelled,
    Number,
    Outcome,
    Regression,
    ResultSet,
    TestResult,
    compare,
    digest,
    encode_digest,
    finite,
    load_baseline,
    load_results,
    natural_key,
    paused_gc,
)

FORMATS = ("pr-comment", "summary", "terminal", "html")
COMMENT_LIMIT = 65_536  # GitHub's limit for a comment body
SUMMARY_LIMIT_BYTES = 1_000_000  # GitHub's step summary takes 1 MiB
DIGEST_MAX_CHARS = 16_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """How much of each section a rendering shows; the rest is counted, not shown."""

    cells: int
    failures: int
    excerpt_lines: int  # 0: no excerpts
    flaky: int
    metrics: int
    skip_reasons: int
    changes: int  # test ids per list in the baseline section
    log_lines: int
    text_chars: int  # longest message, reason or name shown


UNLIMITED = Limits(cells=10**9, failures=10**9, excerpt_lines=10**9, flaky=10**9, metrics=10**9,
                   skip_reasons=10**9, changes=10**9, log_lines=10**9, text_chars=2_000)
# Tried in order until the text fits; each step keeps the verdict, the table and the failures' names.
COMMENT_LADDER = (
    Limits(cells=300, failures=30, excerpt_lines=30, flaky=30, metrics=25, skip_reasons=20, changes=20,
           log_lines=30, text_chars=300),
    Limits(cells=300, failures=15, excerpt_lines=12, flaky=15, metrics=15, skip_reasons=10, changes=10,
           log_lines=12, text_chars=200),
    Limits(cells=300, failures=8, excerpt_lines=0, flaky=10, metrics=10, skip_reasons=5, changes=5,
           log_lines=0, text_chars=160),
    Limits(cells=60, failures=3, excerpt_lines=0, flaky=5, metrics=0, skip_reasons=3, changes=3,
           log_lines=0, text_chars=60),
)
SUMMARY_LADDER = (
    Limits(cells=5_000, failures=300, excerpt_lines=30, flaky=300, metrics=300, skip_reasons=200,
           changes=200, log_lines=30, text_chars=500),
    *COMMENT_LADDER,
)
TERMINAL_LIMITS = Limits(cells=10**9, failures=50, excerpt_lines=0, flaky=50, metrics=0, skip_reasons=20,
                         changes=20, log_lines=0, text_chars=160)


# ---------------------------------------------------------------------------------------------
# What every rendering shows


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureGroup:
    """One test failing the same way, in one or more cells."""

    test_id: str
    outcome: Outcome
    message: str
    excerpt: str | None
    attempts: int  # most attempts any of its cells made
    cells: tuple[str, ...]


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
    """`EP families covered: N of M (transformers X)` of one cell, from its suite properties."""

    cell_id: str
    covered: tuple[str, ...]
    declared: tuple[str, ...]
    transformers: str | None
    reasons: tuple[tuple[str, str], ...] = ()  # (model_type, why not covered), as the suite listed them

    @property
    def missing(self) -> tuple[tuple[str, str], ...]:
        """Each declared family the cell did not cover, with its reason ("no reason recorded" when none came)."""
        listed = dict(self.reasons)
        return tuple(
            (name, listed.get(name, "no reason recorded")) for name in self.declared if name not in self.covered
        )


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

    @property
    def failing_cells(self) -> int:
        return self.failed_cells + self.errored_cells


def build_report(
    result_set: ResultSet, *, baseline: Digest | ResultSet | None = None,
    sha: str | None = None, matrix_name: str | None = None,
) -> Report:
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
        sha=sha,
        sha_dirty=result_set.git_dirty and sha == result_set.git_sha,
        matrix=matrix_name,
        failures=_failure_groups(cells),
        flaky=flaky,
        skips=skips,
        metrics=metrics,
        xfailed=tuple(XfailedCase(test_id=test.test_id, cell_id=cell.id, reason=test.message or "no reason given")
                      for cell in cells for test in cell.tests if test.outcome is Outcome.XFAILED),
        coverage=tuple(
            Coverage(cell_id=cell.id, covered=cell.suite.ep_families_covered or (),
                     declared=cell.suite.ep_families_declared or (), transformers=cell.suite.transformers_version,
                     reasons=cell.suite.ep_families_not_covered)
            for cell in cells if cell.suite.ep_families_declared is not None
        ),
        reproductions=tuple(
            Reproduction(cell_id=cell.id, command=cell.reproduce_command())
            for cell in cells if cell.status is not CellStatus.PASSED
        ),
        comparison=compare(result_set, baseline) if baseline is not None else None,
        notes=tuple(Note(cell_id=cell.id, text=str(problem))
                    for cell in cells for problem in cell.problems if str(problem) != cell.reason),
        digest=digest(result_set, sha=sha, matrix=matrix_name),
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
                     cells=tuple(cell_id for cell_id, _ in found))
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


# ---------------------------------------------------------------------------------------------
# Rendering


def render(
    result_set: ResultSet, fmt: str, *, baseline: Digest | ResultSet | None = None,
    sha: str | None = None, matrix_name: str | None = None,
) -> str:
    """The text of one format; the run loop uses `render(result_set, "terminal")`."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown report format {fmt!r}; expected one of {', '.join(FORMATS)}")
    with paused_gc():
        report = build_report(result_set, baseline=baseline, sha=sha, matrix_name=matrix_name)
        return _render_format(report, fmt)


def _render_format(report: Report, fmt: str) -> str:
    if fmt == "pr-comment":
        return _render_pr_comment(report)
    if fmt == "summary":
        return _fit(lambda limits: _render("summary.md.j2", report, limits),
                    SUMMARY_LADDER, _utf8_length, SUMMARY_LIMIT_BYTES, unit="bytes")
    if fmt == "terminal":
        return _render("terminal.txt.j2", report, TERMINAL_LIMITS, table=terminal_table(report.cells))
    return _render("report.html.j2", report, UNLIMITED, plots=html_plots(report))


def _render_pr_comment(report: Report) -> str:
    payload = encode_digest(report.digest, DIGEST_MAX_CHARS)
    return _fit(
        lambda limits: _render("pr-comment.md.j2", report, limits,
                               marker=COMMENT_MARKER, digest_tag=DIGEST_TAG, digest=payload),
        COMMENT_LADDER, _github_length, COMMENT_LIMIT, unit="characters", keep_from=f"<!-- {DIGEST_TAG} ",
    )


def _github_length(text: str) -> int:
    # Counted in UTF-16 units: never less than GitHub's count, whichever unit it uses.
    return len(text.encode("utf-16-le")) // 2


def _utf8_length(text: str) -> int:
    return len(text.encode("utf-8"))


def _fit(render_at: Callable[[Limits], str], ladder: tuple[Limits, ...],
         measure: Callable[[str], int], limit: int, *, unit: str, keep_from: str | None = None) -> str:
    """The first rendering on the ladder that fits; past the last step, cut the text itself, keeping
    what follows `keep_from` (the digest) whole."""
    for limits in ladder:
        text = render_at(limits)
        if measure(text) <= limit:
            return text
    tail_at = text.rfind(keep_from) if keep_from else -1
    head, tail = (text[:tail_at], text[tail_at:]) if tail_at >= 0 else (text, "")
    note = _environment().get_template("cut-note.md.j2").render(limit=limit, unit=unit)
    while head and measure(head) + measure(note) + measure(tail) + _CLOSERS_MAX > limit:
        head = head[: int(len(head) * 0.9)]
    head = head[: head.rfind("\n") + 1]
    return head + _closers(head) + note + tail


_CLOSERS_MAX = 1_000  # room for the fence and </details> lines a cut may need to close


def _closers(markdown: str) -> str:
    """What closes the code fence and <details> blocks a cut left open, so the note and the digest after
    it render as themselves, not as text inside a fence."""
    fence = None
    details = 0
    for line in markdown.splitlines():
        if fence is None:
            opened = re.match(r"^(`{3,})", line)
            if opened:
                fence = opened.group(1)
            else:
                details += line.count("<details>") - line.count("</details>")
        elif line.strip() == fence:
            fence = None
    closing = f"{fence}\n" if fence else ""
    return closing + "\n</details>\n" * min(max(details, 0), 20)


def render_template(template: str, **values: object) -> str:
    """Any template under reports/ with the same filters and escaping as the reports (e.g. triage.md.j2)."""
    return _environment().get_template(template).render(**values)


def _render(template: str, report: Report, limits: Limits, **extra: object) -> str:
    return _environment().get_template(template).render(report=report, limits=limits, **extra)


def render_nightly(kind: str, *, marker: str, sha: str, run_url: str | None, regressions: Iterable[Regression] = (),
                   matrix: str = "", against: str = "", report: str = "", triage: str = "") -> str:
    """The nightly issue's body (kind "issue") or a comment on it ("again", "green"), escaped like every
    other rendering of results."""
    return _environment().get_template("nightly-issue.md.j2").render(
        kind=kind, marker=marker, sha=sha, run_url=run_url, regressions=tuple(regressions), matrix=matrix,
        against=against, report=report, triage=triage)


@cache
def _environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(shipped_reports_dir()),
        undefined=jinja2.StrictUndefined,
        # Per template file: the SVG macros need it as much as the page that imports them.
        autoescape=jinja2.select_autoescape(("html.j2", "svg.j2"), default_for_string=False),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    environment.filters.update(
        md=markdown_text, code=code_span, html_text=html_text, fence=fence_for, block=clean_block,
        one_line=one_line, terminal=one_line, memory=memory_per_gpu, gib=gib, duration=duration,
        sci=scientific, sig=significant, percent=percent, mib=mib_or_gib, plural=plural, short_sha=short_sha,
        pad=pad,
    )
    return environment


# ---------------------------------------------------------------------------------------------
# Terminal table: widths are computed here, the template only pads


@dataclass(frozen=True, slots=True, kw_only=True)
class TerminalTable:
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    widths: tuple[int, ...]
    right_aligned: tuple[bool, ...]


def terminal_table(cells: Iterable[CellResult]) -> TerminalTable:
    header = ("", "cell", "passed", "failed", "skipped", "xfail", "flaky", "errored",
              "peak memory/GPU", "time")
    rows = []
    for cell in cells:
        counts = cell.counts
        known = bool(cell.tests) or cell.status is not CellStatus.ERRORED
        numbers = [str(value) if known else "-" for value in (
            counts.passed, counts.failed, counts.skipped, counts.xfailed, counts.flaky, counts.errored)]
        rows.append((cell.status.value.upper(), one_line(cell.id, 80), *numbers,
                     _compact_memory(cell), duration(cell.duration_s).replace("—", "-")))
    widths = tuple(max(len(row[column]) for row in (header, *rows)) for column in range(len(header)))
    right_aligned = (False, False, True, True, True, True, True, True, False, True)
    return TerminalTable(header=header, rows=tuple(rows), widths=widths, right_aligned=right_aligned)


def _compact_memory(cell: CellResult) -> str:
    """Per GPU up to four GPUs; beyond, the range over them keeps the table narrow."""
    peaks = [finite(gpu.peak_used_mib) for gpu in cell.memory if finite(gpu.peak_used_mib) is not None]
    if len(cell.memory) <= 4 or not peaks:
        return memory_per_gpu(cell).replace("—", "-")
    return f"{gib(min(peaks))}-{gib(max(peaks))} GiB on {len(cell.memory)} GPUs"


# ---------------------------------------------------------------------------------------------
# CLI


def read_baseline(path: str) -> Digest | None:
    """The baseline, or None with a warning where it holds no readable digest: a previous comment that
    was cut or edited must not stop this run's comment from being written."""
    try:
        return load_baseline(path)
    except BaselineUnreadable as error:
        prefix = "::warning::" if os.environ.get("GITHUB_ACTIONS") == "true" else "harness: warning: "
        print(f"{prefix}{error}; rendering without a comparison", file=sys.stderr)
        return None


def command(args) -> int:
    """`harness report`: read the results, render one format, write it to a file or stdout."""
    result_set = load_results(args.results)
    baseline = read_baseline(args.baseline) if args.baseline else None
    text = render(result_set, args.format, baseline=baseline, sha=args.sha, matrix_name=args.matrix_name)
    if not args.output:
        sys.stdout.write(text)
        return 0
    output = Path(args.output)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"cannot write the report to {output}: {error.strerror or error}") from None
    return 0
