"""Render a `ResultSet` as a PR comment, a job summary, a terminal table or one HTML file.

Pure functions over the results model: `build_report` gathers what every rendering shows (failures
grouped across cells, skip reasons, flaky tests, metrics, reproduce commands, the baseline diff);
the templates in reports/ turn it into text. Everything a test wrote passes through one of the
escaping filters below before it reaches Markdown, HTML or a terminal.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import jinja2
import markupsafe

from harness.errors import ConfigError
from harness.results import (
    DIGEST_TAG,
    CellResult,
    CellStatus,
    Comparison,
    Counts,
    Digest,
    Outcome,
    ResultSet,
    TestResult,
    compare,
    digest,
    encode_digest,
    load_baseline,
    load_results,
    natural_key,
    paused_gc,
)

FORMATS = ("pr-comment", "summary", "terminal", "html")
REPORTS_DIR = Path(__file__).resolve().parent.parent / "reports"
COMMENT_MARKER = "<!-- harness-report -->"  # first line of the comment; the next run edits that comment
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
    def error(self) -> float | None:
        return self.test.grad_error

    @property
    def bound(self) -> float | None:
        return self.test.grad_bound

    @property
    def routing_margin(self) -> float | None:
        return self.test.routing_margin

    @property
    def peak_allocated_mib(self) -> float | None:
        return self.test.peak_allocated_mib

    @property
    def ratio(self) -> float | None:
        return _ratio(self.test)

    @property
    def margin_left(self) -> float | None:
        """Share of the bound still unused: 0.9 is far from it, below 0 is over it."""
        return None if self.ratio is None else 1.0 - self.ratio

    @property
    def exceeded(self) -> bool:
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
            if test.grad_error is not None or test.grad_bound is not None or test.routing_margin is not None:
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
    if test.grad_error is None or not test.grad_bound or test.grad_bound <= 0:
        return None
    return test.grad_error / test.grad_bound


def _closeness(test: TestResult) -> tuple[float, float, float]:
    """Order by error/bound; without a bound by the error; then by the smallest routing margin."""
    ratio = _ratio(test)
    return (
        ratio if ratio is not None else -math.inf,
        test.grad_error if test.grad_error is not None else -math.inf,
        -test.routing_margin if test.routing_margin is not None else -math.inf,
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
    while head and measure(head) + measure(note) + measure(tail) > limit:
        head = head[: int(len(head) * 0.9)]
    return head[: head.rfind("\n") + 1] + note + tail


def render_template(template: str, **values: object) -> str:
    """Any template under reports/ with the same filters and escaping as the reports (e.g. triage.md.j2)."""
    return _environment().get_template(template).render(**values)


def _render(template: str, report: Report, limits: Limits, **extra: object) -> str:
    return _environment().get_template(template).render(report=report, limits=limits, **extra)


@cache
def _environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(REPORTS_DIR),
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
# Escaping: nothing a test writes may add markup, break a table or ping a user

# C0/C1 controls (ANSI escapes start with one) and bidirectional overrides that reorder what is shown.
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>|~&!#])")
_ZERO_WIDTH_SPACE = "&#8203;"  # after '@', so `@team` in a message is text, not a mention


def clean_block(text: str | None, max_lines: int | None = None) -> str:
    """Multi-line text without control characters, keeping at most the last `max_lines` lines."""
    lines = _CONTROL.sub("", (text or "").replace("\r\n", "\n").replace("\t", "    ")).split("\n")
    if max_lines is not None and len(lines) > max_lines:
        lines = lines[-max_lines:]
    return "\n".join(lines)


def one_line(text: object, max_chars: int = 300) -> str:
    flat = " ".join(_CONTROL.sub(" ", "" if text is None else str(text)).split())
    return flat if len(flat) <= max_chars else flat[: max_chars - 1] + "…"


def markdown_text(text: object, max_chars: int = 300) -> str:
    """Inline Markdown (table cells, list items): every character that could start markup is escaped."""
    escaped = _MARKDOWN_SPECIAL.sub(r"\\\1", one_line(text, max_chars))
    return escaped.replace("@", "@" + _ZERO_WIDTH_SPACE) or "—"


def code_span(text: object, max_chars: int = 300, *, table: bool = False) -> str:
    """An inline code span whose delimiter is longer than any backtick run inside it."""
    content = one_line(text, max_chars)
    if not content:
        return "—"
    if table:  # GitHub splits table cells on '|' even inside code spans, unless escaped
        content = content.replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", content)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if content.startswith("`") or content.endswith("`") else ""
    return f"{ticks}{pad}{content}{pad}{ticks}"


def html_text(text: object, max_chars: int = 300) -> str:
    """Text inside raw HTML in Markdown (a <summary>): escaped, one line, no mentions. GitHub does not
    read Markdown there; '[' is encoded all the same, so no renderer can see a link in it."""
    escaped = str(markupsafe.escape(one_line(text, max_chars))).replace("[", "&#91;")
    return escaped.replace("@", "@" + _ZERO_WIDTH_SPACE)


def fence_for(text: str | None) -> str:
    """A code fence longer than any backtick run in `text`, so the text cannot close it."""
    longest = max((len(run) for run in re.findall(r"`+", text or "")), default=0)
    return "`" * max(3, longest + 1)


# ---------------------------------------------------------------------------------------------
# Numbers


def gib(mib: float | None) -> str:
    return "?" if mib is None else f"{mib / 1024:.1f}"


def mib_or_gib(mib: float | None) -> str:
    if mib is None:
        return "—"
    return f"{mib:.0f} MiB" if mib < 1024 else f"{mib / 1024:.1f} GiB"


def memory_per_gpu(cell: CellResult) -> str:
    """`12.3 / 12.1 GiB`: peak used per GPU, in index order."""
    if not cell.memory:
        return "—"
    return " / ".join(gib(gpu.peak_used_mib) for gpu in cell.memory) + " GiB"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{seconds:.1f}s" if seconds < 10 else f"{secs}s"


def scientific(value: float | None) -> str:
    return "—" if value is None else f"{value:.2e}"


def significant(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}"


def pad(text: str, width: int, right: bool = False) -> str:
    return text.rjust(width) if right else text.ljust(width)


def percent(fraction: float | None) -> str:
    return "—" if fraction is None else f"{fraction * 100:.0f}%"


def plural(count: int, word: str) -> str:
    return f"{count:,} {word if count == 1 else word + 's'}"


def short_sha(sha: str | None) -> str:
    return (sha or "")[:12]


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
    peaks = [gpu.peak_used_mib for gpu in cell.memory if gpu.peak_used_mib is not None]
    if len(cell.memory) <= 4 or not peaks:
        return memory_per_gpu(cell).replace("—", "-")
    return f"{gib(min(peaks))}-{gib(max(peaks))} GiB on {len(cell.memory)} GPUs"


# ---------------------------------------------------------------------------------------------
# HTML plots: geometry here, markup in reports/_plot.svg.j2


@dataclass(frozen=True, slots=True, kw_only=True)
class Rect:
    x: float
    y: float
    width: float
    height: float
    kind: str
    title: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Dot:
    x: float
    y: float
    kind: str
    title: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    x1: float
    y1: float
    x2: float
    y2: float
    kind: str
    title: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Label:
    x: float
    y: float
    text: str
    anchor: str = "start"
    kind: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Plot:
    title: str
    caption: str
    width: float
    height: float
    rects: tuple[Rect, ...] = ()
    dots: tuple[Dot, ...] = ()
    rules: tuple[Rule, ...] = ()
    labels: tuple[Label, ...] = ()


_LABEL_WIDTH = 330.0
_PLOT_WIDTH = 480.0
_AXIS_TOP = 28.0
_BAR = 10.0
_ROW_GAP = 3.0
_GROUP_GAP = 12.0
GRADIENT_PLOT_CASES = 60


def html_plots(report: Report) -> tuple[Plot, ...]:
    plots = (memory_plot(report.cells), gradient_plot(report.metrics[:GRADIENT_PLOT_CASES]))
    return tuple(plot for plot in plots if plot is not None)


def memory_plot(cells: Iterable[CellResult]) -> Plot | None:
    cells = tuple(cells)
    largest = max((value for cell in cells for gpu in cell.memory
                   for value in (gpu.total_mib, gpu.peak_used_mib) if value), default=0.0)
    if not largest:
        return None
    scale = _PLOT_WIDTH / largest
    rects, labels, y = [], [], _AXIS_TOP
    for cell in cells:
        labels.append(Label(x=_LABEL_WIDTH - 8, y=y + _BAR, text=one_line(cell.id, 60), anchor="end"))
        if not cell.memory:
            labels.append(Label(x=_LABEL_WIDTH, y=y + _BAR, text=cell.memory_note or "no GPU memory recorded",
                                kind="muted"))
            y += _BAR + _ROW_GAP
        for gpu in cell.memory:
            name = f"{cell.id} GPU {gpu.index}" + (f" ({gpu.name})" if gpu.name else "")
            if gpu.total_mib:
                rects.append(Rect(x=_LABEL_WIDTH, y=y, width=gpu.total_mib * scale, height=_BAR,
                                  kind="capacity", title=f"{name}: {gib(gpu.total_mib)} GiB in total"))
            if gpu.peak_used_mib is not None:
                rects.append(Rect(
                    x=_LABEL_WIDTH, y=y, width=gpu.peak_used_mib * scale, height=_BAR, kind="peak",
                    title=f"{name}: peak {gib(gpu.peak_used_mib)} GiB, {gib(gpu.used_before_mib)} GiB before",
                ))
            labels.append(Label(x=_LABEL_WIDTH + _PLOT_WIDTH + 8, y=y + _BAR,
                                text=f"GPU {gpu.index}: {gib(gpu.peak_used_mib)} GiB", kind="value"))
            y += _BAR + _ROW_GAP
        y += _GROUP_GAP
    ticks = _linear_ticks(largest / 1024)
    tick_xs = [_LABEL_WIDTH + tick * 1024 * scale for tick in ticks]
    rules = [Rule(x1=x, y1=_AXIS_TOP - 6, x2=x, y2=y - _GROUP_GAP, kind="grid") for x in tick_xs]
    labels.extend(Label(x=rule.x1, y=_AXIS_TOP - 10, text=f"{tick:g} GiB", anchor="middle", kind="axis")
                  for rule, tick in zip(rules, ticks, strict=True))
    return Plot(title="Peak memory per GPU",
                caption="Dark: peak used during the cell; light: the GPU's total.",
                width=_LABEL_WIDTH + _PLOT_WIDTH + 130, height=y, rects=tuple(rects), rules=tuple(rules),
                labels=tuple(labels))


def gradient_plot(cases: Iterable[CaseMetrics]) -> Plot | None:
    cases = tuple(case for case in cases if any(point.error is not None for point in case.points))
    values = [value for case in cases for point in case.points
              for value in (point.error, point.bound) if value is not None and value > 0]
    if not values:
        return None
    low, high = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))
    high = max(high, low + 1)

    def x_of(value: float) -> float:
        return _LABEL_WIDTH + (math.log10(value) - low) / (high - low) * _PLOT_WIDTH

    dots, rules, labels, y = [], [], [], _AXIS_TOP
    row = _BAR + 2 * _ROW_GAP
    bottom = _AXIS_TOP + row * len(cases)
    for exponent in range(low, high + 1):  # the grid first, so bounds and dots are drawn over it
        x = x_of(10.0**exponent)
        rules.append(Rule(x1=x, y1=_AXIS_TOP - 6, x2=x, y2=bottom, kind="grid"))
        labels.append(Label(x=x, y=_AXIS_TOP - 10, text=f"1e{exponent}", anchor="middle", kind="axis"))
    for case in cases:
        labels.append(Label(x=_LABEL_WIDTH - 8, y=y + _BAR, text=one_line(case.case, 60), anchor="end"))
        for bound in sorted({point.bound for point in case.points if point.bound and point.bound > 0}):
            rules.append(Rule(x1=x_of(bound), y1=y - 1, x2=x_of(bound), y2=y + _BAR + 1, kind="bound",
                              title=f"bound {scientific(bound)}"))
        for point in case.points:
            if point.error is None:
                continue
            at_zero = point.error <= 0
            dots.append(Dot(
                x=_LABEL_WIDTH if at_zero else x_of(point.error), y=y + _BAR / 2,
                kind="over" if point.exceeded else ("zero" if at_zero else "within"),
                title=f"{point.cell_id}: error {scientific(point.error)}, bound {scientific(point.bound)}",
            ))
        y += row
    return Plot(title="Largest gradient error against its bound",
                caption="One dot per cell (red: over the bound); the bar is the bound; log scale. "
                        f"The {len(cases)} cases closest to their bound.",
                width=_LABEL_WIDTH + _PLOT_WIDTH + 40, height=y + _ROW_GAP, dots=tuple(dots),
                rules=tuple(rules), labels=tuple(labels))


def _linear_ticks(largest: float) -> list[float]:
    """About five round steps from 0 to `largest`."""
    raw = largest / 5
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(factor * magnitude for factor in (1, 2, 5, 10) if factor * magnitude >= raw)
    return [index * step for index in range(int(largest // step) + 1)]


# ---------------------------------------------------------------------------------------------
# CLI


def command(args) -> int:
    """`harness report`: read the results, render one format, write it to a file or stdout."""
    result_set = load_results(args.results)
    baseline = load_baseline(args.baseline) if args.baseline else None
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
