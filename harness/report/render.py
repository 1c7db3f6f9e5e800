"""Render a `ResultSet` as a PR comment, a job summary, a terminal table or one HTML file.

`harness.report.model.build_report` gathers what every rendering shows; the templates in reports/ turn
it into text, fitted to each target's size limit. Everything a test wrote passes through one of the
escaping filters of `harness.report.filters` before it reaches Markdown, HTML or a terminal, the nightly
issue included (`render_nightly`); `harness.report.plots` lays out the HTML report's plots.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from harness import contract
from harness.contract import COMMENT_LIMIT, COMMENT_MARKER
from harness.errors import ConfigError
from harness.history.rule import METRIC_BY_NAME
from harness.history.trend import Regression as HistoryRegression
from harness.project import DEFAULT_RESULTS, find_project_root, results_path
from harness.report.cost import RunCost
from harness.report.filters import (
    compact_memory,
    duration,
    one_line,
)
from harness.report.links import RunLinks, links_from
from harness.report.listing import listed
from harness.report.model import Report, against_last_night, build_report, shown_status
from harness.report.plots import html_plots, loss_plot
from harness.report.templates import environment as _environment
from harness.report.terminal import COLUMNS, wants_color
from harness.results import (
    DIGEST_TAG,
    BaselineUnreadable,
    CaseCounts,
    CellResult,
    CellStatus,
    Digest,
    Regression,
    ReleaseChange,
    ResultSet,
    encode_digest,
    load_baseline,
    load_results,
    paused_gc,
)
from harness.results.nightly_records import CaseRecord, ReleaseRecord

FORMATS = ("pr-comment", "summary", "terminal", "html")
SUMMARY_LIMIT_BYTES = 1_000_000  # GitHub's step summary takes 1 MiB
DIGEST_MAX_CHARS = 16_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """How much of each section a rendering shows; the rest is counted, not shown."""

    cells: int
    failures: int  # failures listed in all (listing.listed)
    failures_per_cell: int  # and in any one cell
    excerpt_lines: int  # 0: no excerpts
    flaky: int
    metrics: int
    skip_reasons: int  # reasons listed of the cases not built, and of those not run
    cases: int  # cases listed of each class a rendering lists one by one (known, fixed upstream, expected failures)
    changes: int  # test ids per list in the baseline section
    log_lines: int
    text_chars: int  # longest message, reason or name shown


# One self-contained page: every cell's row, and bounded lists (a night of 300,000 failures rendered 44 MB whole).
HTML_LIMITS = Limits(cells=10**9, failures=2_000, failures_per_cell=200, excerpt_lines=30, flaky=2_000,
                     metrics=2_000, skip_reasons=500, cases=2_000, changes=2_000, log_lines=10**9, text_chars=2_000)
# Tried in order until the text fits; each step keeps the verdict, the table and the failures' names.
COMMENT_LADDER = (
    Limits(cells=300, failures=30, failures_per_cell=10, excerpt_lines=30, flaky=30, metrics=25, skip_reasons=20,
           cases=30, changes=20, log_lines=30, text_chars=300),
    Limits(cells=300, failures=15, failures_per_cell=5, excerpt_lines=12, flaky=15, metrics=15, skip_reasons=10,
           cases=15, changes=10, log_lines=12, text_chars=200),
    Limits(cells=300, failures=8, failures_per_cell=3, excerpt_lines=0, flaky=10, metrics=10, skip_reasons=5,
           cases=10, changes=5, log_lines=0, text_chars=160),
    Limits(cells=60, failures=3, failures_per_cell=1, excerpt_lines=0, flaky=5, metrics=0, skip_reasons=3, cases=5,
           changes=3, log_lines=0, text_chars=60),
)
SUMMARY_LADDER = (
    Limits(cells=5_000, failures=300, failures_per_cell=30, excerpt_lines=30, flaky=300, metrics=300,
           skip_reasons=200, cases=300, changes=200, log_lines=30, text_chars=500),
    *COMMENT_LADDER,
)
TERMINAL_LIMITS = Limits(cells=10**9, failures=50, failures_per_cell=10, excerpt_lines=0, flaky=50, metrics=0,
                         skip_reasons=20, cases=50, changes=20, log_lines=0, text_chars=160)
# The nightly issue's list of regressions, and the triage table in it and in the job summary: every new red is in
# triage.json.
NIGHTLY_LISTED = 300
NIGHTLY_LISTED_PER_CELL = 30
# The creeping tests the issue lists (the trend page has them all, with plots).
NIGHTLY_CREEPING_LISTED = 50
# The known-bugs entries fixed upstream the issue names (triage.json has every case).
NIGHTLY_ENTRIES_LISTED = 50


# ---------------------------------------------------------------------------------------------
# Rendering


def render(
    result_set: ResultSet, fmt: str, *, baseline: Digest | ResultSet | None = None,
    sha: str | None = None, matrix_name: str | None = None, color: bool = False,
    links: RunLinks | None = None, red_baseline: ResultSet | None = None,
) -> str:
    """The text of one format; the run loop uses `render(result_set, "terminal", color=...)`. `color`
    (terminal only) adds ANSI colours: pass `terminal.wants_color(stream)`."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown report format {fmt!r}; expected one of {', '.join(FORMATS)}")
    with paused_gc():
        report = build_report(result_set, baseline=baseline, sha=sha, matrix_name=matrix_name, links=links,
                              red_baseline=red_baseline)
        return _render_format(report, fmt, color=color)


def _render_format(report: Report, fmt: str, *, color: bool = False) -> str:
    if fmt == "pr-comment":
        return _render_pr_comment(report)
    if fmt == "summary":
        return _fit(lambda limits, shortened: _render("summary.md.j2", report, limits, shortened=shortened),
                    SUMMARY_LADDER, _utf8_length, SUMMARY_LIMIT_BYTES, unit="bytes")
    if fmt == "terminal":  # the verdict last, where a terminal leaves it in view; no blank lines on top
        return _render("terminal.txt.j2", report, TERMINAL_LIMITS, table=terminal_table(report.cells),
                       color=color).lstrip("\n")
    return _render("report.html.j2", report, HTML_LIMITS, plots=html_plots(report), loss_plot=loss_plot)


def _render_pr_comment(report: Report) -> str:
    payload = encode_digest(report.digest, DIGEST_MAX_CHARS)
    return _fit(
        lambda limits, shortened: _render("pr-comment.md.j2", report, limits, shortened=shortened,
                                          comment_limit=contract.COMMENT_LIMIT, marker=COMMENT_MARKER,
                                          digest_tag=DIGEST_TAG,
                                          digest=payload),
        COMMENT_LADDER, _github_length, COMMENT_LIMIT, unit="characters", keep_from=f"<!-- {DIGEST_TAG} ",
    )


def _github_length(text: str) -> int:
    # Counted in UTF-16 units: never less than GitHub's count, whichever unit it uses.
    return len(text.encode("utf-16-le")) // 2


def _utf8_length(text: str) -> int:
    return len(text.encode("utf-8"))


def _fit(render_at: Callable[[Limits, bool], str], ladder: tuple[Limits, ...],
         measure: Callable[[str], int], limit: int, *, unit: str, keep_from: str | None = None) -> str:
    """The first rendering on the ladder that fits; past the last step, cut the text itself, keeping
    what follows `keep_from` (the digest) whole. `render_at(limits, shortened)`: shortened is True from the
    second step on, so the note that something was cut to fit shows only when something was (the first
    step's limits are the report's ordinary length)."""
    for step, limits in enumerate(ladder):
        text = render_at(limits, step > 0)
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


def _render(template: str, report: Report, limits: Limits, **extra: object) -> str:
    return _environment().get_template(template).render(report=report, limits=limits, **extra)


def render_nightly(kind: str, *, marker: str, sha: str, run_url: str | None, regressions: Iterable[Regression] = (),
                   matrix: str = "", against: str = "", report: str = "", triage: str = "",
                   cost: RunCost | None = None, creeping: Iterable[HistoryRegression] = (),
                   releases: Iterable[ReleaseChange | ReleaseRecord] = (), cases: CaseCounts | None = None,
                   fixed_upstream: Iterable[CaseRecord] = ()) -> str:
    """The nightly issue's body (kind "issue") or a comment on it ("again", "green"), escaped like every
    other rendering of results; the regressions listed at most NIGHTLY_LISTED_PER_CELL per cell and NIGHTLY_LISTED
    in all, the rest counted. `cost`: the night's, on the issue's head line. `creeping`: the history's regressions
    (tests still passing whose memory or time rose over their baseline), listed in their own section of the body,
    as many per cell and NIGHTLY_CREEPING_LISTED in all. The body opens with the release view: `releases` (new since
    last night), then the new reds, then tonight's `cases` by class and the known-bugs entries `fixed_upstream` cases
    say to close."""
    shown = listed(tuple(regressions), lambda regression: (regression.cell_id,), per_cell=NIGHTLY_LISTED_PER_CELL,
                   total=NIGHTLY_LISTED)
    creeps = listed(tuple(creeping), lambda regression: (regression.cell,), per_cell=NIGHTLY_LISTED_PER_CELL,
                    total=NIGHTLY_CREEPING_LISTED)
    close = sorted({key for case in fixed_upstream for key in case.keys})
    return _environment().get_template("nightly-issue.md.j2").render(
        kind=kind, marker=marker, sha=sha, run_url=run_url, regressions=shown.shown, more=shown.left_out,
        matrix=matrix, against=against, report=report, triage=triage, cost=cost, creeping=creeps.shown,
        creeping_more=creeps.left_out, metrics=METRIC_BY_NAME, releases=against_last_night(releases),
        cases=cases, close=close[:NIGHTLY_ENTRIES_LISTED], close_more=max(len(close) - NIGHTLY_ENTRIES_LISTED, 0))


# ---------------------------------------------------------------------------------------------
# Terminal table: widths are computed here, the template only pads


@dataclass(frozen=True, slots=True, kw_only=True)
class TerminalRow:
    status: str  # passed | failed | errored | not_run: the colour and the row's first word ("NOT RUN")
    cell_id: str
    values: tuple[str, ...]  # under TerminalTable.header


@dataclass(frozen=True, slots=True, kw_only=True)
class TerminalTable:
    """Each cell is two lines, so every line fits `terminal.COLUMNS`: the status and the cell id (ids are
    30-odd characters), then its numbers under one header."""

    header: tuple[str, ...]
    rows: tuple[TerminalRow, ...]
    widths: tuple[int, ...]
    right_aligned: tuple[bool, ...]


_TERMINAL_HEADER = ("pass", "fail", "skip", "xfail", "flaky", "err", "peak memory/GPU", "time")


def terminal_table(cells: Iterable[CellResult]) -> TerminalTable:
    rows = []
    for cell in cells:
        counts = cell.counts
        known = bool(cell.tests) or cell.status is not CellStatus.ERRORED
        numbers = [f"{value:,}" if known else "-" for value in (
            counts.passed, counts.failed, counts.skipped, counts.xfailed, counts.flaky, counts.errored)]
        status = shown_status(cell).value
        texts = (compact_memory(cell), duration(cell.duration_s))
        rows.append(TerminalRow(status=status, cell_id=one_line(cell.id, COLUMNS - len(status) - 1),
                                values=(*numbers, *(text.replace("—", "-") for text in texts))))
    widths = tuple(max(len(row[column]) for row in (_TERMINAL_HEADER, *(row.values for row in rows)))
                   for column in range(len(_TERMINAL_HEADER)))
    right_aligned = (True, True, True, True, True, True, False, True)
    return TerminalTable(header=_TERMINAL_HEADER, rows=tuple(rows), widths=widths, right_aligned=right_aligned)


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


# What `-o FILE` means without --format: the extension says it; Markdown could be either Markdown format.
FORMAT_BY_EXTENSION = {".html": "html", ".htm": "html", ".txt": "terminal", ".log": "terminal"}


def output_format(requested: str | None, output: str | None) -> str:
    if requested:
        return requested
    if not output:
        return "terminal"
    extension = Path(output).suffix.lower()
    if extension in FORMAT_BY_EXTENSION:
        return FORMAT_BY_EXTENSION[extension]
    raise ConfigError(f"-o {output}: cannot tell the format from {extension or 'a name without an extension'}; "
                      f"pass --format {'|'.join(FORMATS)}")


def results_folders(values: list[str]) -> list[Path]:
    """RESULTS as `harness run --results` takes its folder: none given is the project's results/, a relative path
    is taken from the project root; one that is no folder says where it was looked for. A relative path that is a
    folder from the working directory (a name completed from a subfolder: `cd results && harness report x`) is
    that folder, as a matrix path is."""
    project = find_project_root()
    folders = []
    for value in values or [DEFAULT_RESULTS]:
        typed = Path(value).expanduser()
        folder = typed.absolute() if values and typed.is_dir() else results_path(value, project.path)
        if not folder.is_dir() and not typed.is_absolute():
            raise ConfigError(f"results path {value} is not a folder: looked for {folder}, resolving against the "
                              f"project root {project.path} ({project.found_as}), as harness run --results does")
        folders.append(folder)
    return folders


def command(args) -> int:
    """`harness report`: read the results, render one format, write it to a file or stdout."""
    fmt = output_format(args.format, args.output)
    result_set = load_results(results_folders(args.results))
    baseline = read_baseline(args.baseline) if args.baseline else None
    color = fmt == "terminal" and not args.output and wants_color(sys.stdout)
    links = links_from(os.environ, args.links)
    red_baseline = load_results([args.classify_against]) if args.classify_against else None
    text = render(result_set, fmt, baseline=baseline, sha=args.sha, matrix_name=args.matrix_name, color=color,
                  links=links, red_baseline=red_baseline)
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
