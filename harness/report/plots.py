"""Geometry of the HTML report's plots (SVG markup is in reports/_plot.svg.j2): peak memory per GPU, the
largest gradient error against its bound, and a failing training case's loss per step. Labelled values (inf,
nan) never reach the arithmetic.

The memory and gradient plots are laid out twice (`html_plots`): wide, each row's label left of its bars, and
narrow, the label on a line above them, NARROW_WIDTH across. An SVG shrinks with the page, and its 11 px text
with it: the page shows the wide one only where it fits unshrunk (report.html.j2's WIDE_FROM), so every label
reads at 11 px from an 800 px window up."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.report.filters import gib, one_line, scientific
from harness.results import CellResult, TrainingCurve, finite

if TYPE_CHECKING:
    from harness.report.model import CaseMetrics, Report


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


_PLOT_WIDTH = 640.0
_LABEL_CHARS = 56  # a row label's longest; longer ones lose their middle (see plot_label)
# The narrow layout's width: unshrunk in an 800 px window (the page's 14 px padding each side and a scrollbar
# leave 757 px). Its label lines are the width less the left margin, which keeps a centred tick label whole.
NARROW_WIDTH = 740.0
_NARROW_LEFT = 20.0
_NARROW_LABEL_CHARS = 100
_LABEL_LINE = 15.0  # a narrow plot's row label, on its line above the bars
_VALUE_ROOM = 130.0  # right of the memory bars: "GPU 7: 141.0 GiB"
_DOT_ROOM = 40.0  # right of the gradient plot's axis: a labelled error's dot and the last tick's label
_CHAR_WIDTH = 6.7  # px per character of the 11px monospace row labels (report.html.j2 sets the font)
_AXIS_TOP = 28.0
_BAR = 10.0
_ROW_GAP = 3.0
_GROUP_GAP = 12.0
GRADIENT_PLOT_CASES = 60


def plot_label(text: object, max_chars: int = _LABEL_CHARS) -> str:
    """A row label that keeps what tells rows apart: a long test id loses its middle, not its parameters."""
    flat = one_line(text, 10_000)
    if len(flat) <= max_chars:
        return flat
    head = max_chars // 3
    return flat[:head] + "…" + flat[len(flat) - (max_chars - head - 1) :]


def _label_width(labels: Iterable[str]) -> float:
    """Room left of the plot for the longest row label, so none is cut at the edge."""
    return max((len(label) for label in labels), default=0) * _CHAR_WIDTH + 16


def html_plots(report: Report) -> tuple[tuple[Plot, Plot], ...]:
    """Each plot (wide, narrow)."""
    cases = report.metrics[:GRADIENT_PLOT_CASES]
    plots = ((memory_plot(report.cells), memory_plot(report.cells, narrow=True)),
             (gradient_plot(cases), gradient_plot(cases, narrow=True)))
    return tuple((wide, narrow) for wide, narrow in plots if wide is not None and narrow is not None)


def memory_plot(cells: Iterable[CellResult], *, narrow: bool = False) -> Plot | None:
    cells = tuple(cells)
    largest = max(
        (
            value
            for cell in cells
            for gpu in cell.memory
            for value in (finite(gpu.total_mib), finite(gpu.peak_used_mib))
            if value
        ),
        default=0.0,
    )
    if not largest:
        return None
    if narrow:
        left, bars = _NARROW_LEFT, NARROW_WIDTH - _NARROW_LEFT - _VALUE_ROOM
    else:
        left, bars = _label_width(plot_label(cell.id) for cell in cells), _PLOT_WIDTH
    scale = bars / largest
    rects, labels, y = [], [], _AXIS_TOP
    for cell in cells:
        if narrow:
            labels.append(Label(x=left, y=y + _BAR, text=plot_label(cell.id, _NARROW_LABEL_CHARS), kind="row"))
            y += _LABEL_LINE
        else:
            labels.append(Label(x=left - 8, y=y + _BAR, text=plot_label(cell.id), anchor="end", kind="row"))
        if not cell.memory:
            labels.append(
                Label(x=left, y=y + _BAR, text=cell.memory_note or "no GPU memory recorded", kind="muted")
            )
            y += _BAR + _ROW_GAP
        for gpu in cell.memory:
            name = f"{cell.id} GPU {gpu.index}" + (f" ({gpu.name})" if gpu.name else "")
            total, peak = finite(gpu.total_mib), finite(gpu.peak_used_mib)
            if total and total > 0:
                rects.append(
                    Rect(
                        x=left,
                        y=y,
                        width=total * scale,
                        height=_BAR,
                        kind="capacity",
                        title=f"{name}: {gib(gpu.total_mib)} GiB in total",
                    )
                )
            if peak is not None and peak >= 0:
                rects.append(
                    Rect(
                        x=left,
                        y=y,
                        width=peak * scale,
                        height=_BAR,
                        kind="peak",
                        title=f"{name}: peak {gib(gpu.peak_used_mib)} GiB, {gib(gpu.used_before_mib)} GiB before",
                    )
                )
            labels.append(
                Label(
                    x=left + bars + 8,
                    y=y + _BAR,
                    text=f"GPU {gpu.index}: {gib(gpu.peak_used_mib)} GiB",
                    kind="value",
                )
            )
            y += _BAR + _ROW_GAP
        y += _GROUP_GAP
    ticks = _linear_ticks(largest / 1024)
    tick_xs = [left + tick * 1024 * scale for tick in ticks]
    rules = [Rule(x1=x, y1=_AXIS_TOP - 6, x2=x, y2=y - _GROUP_GAP, kind="grid") for x in tick_xs]
    labels.extend(
        Label(x=rule.x1, y=_AXIS_TOP - 10, text=f"{tick:g} GiB", anchor="middle", kind="axis")
        for rule, tick in zip(rules, ticks, strict=True)
    )
    return Plot(
        title="Peak memory per GPU",
        caption="Dark: peak used during the cell; light: the GPU's total.",
        width=left + bars + _VALUE_ROOM,
        height=y,
        rects=tuple(rects),
        rules=tuple(rules),
        labels=tuple(labels),
    )


def gradient_plot(cases: Iterable[CaseMetrics], *, narrow: bool = False) -> Plot | None:
    cases = tuple(case for case in cases if any(point.error is not None for point in case.points))
    values = [
        value
        for case in cases
        for point in case.points
        for value in (finite(point.error), finite(point.bound))
        if value is not None and value > 0
    ]
    if not values:
        return None
    # Labelled values (inf, nan, out of range) sit at the axis' right end; the model's range keeps
    # every finite value's log10 within a few hundred.
    low, high = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))
    high = max(high, low + 1)
    if narrow:
        left, bars = _NARROW_LEFT, NARROW_WIDTH - _NARROW_LEFT - _DOT_ROOM
    else:
        left, bars = _label_width(plot_label(case.case) for case in cases), _PLOT_WIDTH

    def x_of(value: float) -> float:
        return left + (math.log10(value) - low) / (high - low) * bars

    dots, rules, labels, y = [], [], [], _AXIS_TOP
    row = _BAR + 2 * _ROW_GAP + (_LABEL_LINE if narrow else 0.0)
    bottom = _AXIS_TOP + row * len(cases)
    for exponent in range(low, high + 1):  # the grid first, so bounds and dots are drawn over it
        x = x_of(10.0**exponent)
        rules.append(Rule(x1=x, y1=_AXIS_TOP - 6, x2=x, y2=bottom, kind="grid"))
        labels.append(Label(x=x, y=_AXIS_TOP - 10, text=f"1e{exponent}", anchor="middle", kind="axis"))
    for case in cases:
        if narrow:
            labels.append(Label(x=left, y=y + _BAR, text=plot_label(case.case, _NARROW_LABEL_CHARS), kind="row"))
            y += _LABEL_LINE
        else:
            labels.append(Label(x=left - 8, y=y + _BAR, text=plot_label(case.case), anchor="end", kind="row"))
        bounds = {finite(point.bound) for point in case.points}
        for bound in sorted(bound for bound in bounds if bound and bound > 0):
            rules.append(
                Rule(
                    x1=x_of(bound),
                    y1=y - 1,
                    x2=x_of(bound),
                    y2=y + _BAR + 1,
                    kind="bound",
                    title=f"bound {scientific(bound)}",
                )
            )
        for point in case.points:
            if point.error is None:
                continue
            error = finite(point.error)
            at_zero = error is not None and error <= 0
            x = left + bars if error is None else (left if at_zero else x_of(error))
            dots.append(
                Dot(
                    x=x,
                    y=y + _BAR / 2,
                    kind=("expected" if point.expected else "over") if point.exceeded
                    else ("zero" if at_zero else "within"),
                    title=f"{point.cell_id}: error {scientific(point.error)}, bound {scientific(point.bound)}",
                )
            )
        y += row - (_LABEL_LINE if narrow else 0.0)
    return Plot(
        title="Largest gradient error against its bound",
        caption="One dot per cell (red: over the bound; amber: over it in a test that expects it, a planted "
        "bug); the bar is the bound; log scale. "
        f"The {len(cases)} cases closest to their bound.",
        width=left + bars + _DOT_ROOM,
        height=y + _ROW_GAP,
        dots=tuple(dots),
        rules=tuple(rules),
        labels=tuple(labels),
    )


def _linear_ticks(largest: float) -> list[float]:
    """About five round steps from 0 to `largest`."""
    raw = largest / 5
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(factor * magnitude for factor in (1, 2, 5, 10) if factor * magnitude >= raw)
    return [index * step for index in range(int(largest // step) + 1)]


_CURVE_WIDTH = 320.0
_CURVE_HEIGHT = 140.0
_CURVE_LEFT = 64.0  # room for the loss axis' labels
_CURVE_TOP = 12.0
_CURVE_BOTTOM = 24.0  # room for the step labels


def loss_plot(curve: TrainingCurve) -> Plot | None:
    """A failing training case's loss per step: the sharded run (blue) and the whole model's (grey), one dot a
    step, a dashed rule where the run resumed from its checkpoint. None with fewer than one finite loss."""
    points = [(step, finite(sharded), finite(whole)) for step, sharded, whole, _ in curve.rows()]
    values = [value for _, sharded, whole in points for value in (sharded, whole) if value is not None]
    if not values:
        return None
    low, high = min(values), max(values)
    if high - low < 1e-12 * max(1.0, abs(high)):  # a flat curve still gets a band to sit in
        low, high = low - 0.5, high + 0.5
    span_x = max(1, len(points) - 1)

    def x_of(step: int) -> float:
        return _CURVE_LEFT + (step - 1) / span_x * _CURVE_WIDTH

    def y_of(value: float) -> float:
        return _CURVE_TOP + (high - value) / (high - low) * _CURVE_HEIGHT

    bottom = _CURVE_TOP + _CURVE_HEIGHT
    rules = [Rule(x1=_CURVE_LEFT, y1=y_of(value), x2=_CURVE_LEFT + _CURVE_WIDTH, y2=y_of(value), kind="grid")
             for value in (low, high)]
    labels = [Label(x=_CURVE_LEFT - 6, y=y_of(value) + 4, text=f"{value:.6g}", anchor="end", kind="axis")
              for value in (low, high)]
    labels += [Label(x=x_of(step), y=bottom + 16, text=str(step), anchor="middle", kind="axis")
               for step, _, _ in points]
    if curve.resumed_at is not None:
        x = (x_of(curve.resumed_at) + x_of(curve.resumed_at + 1)) / 2
        rules.append(Rule(x1=x, y1=_CURVE_TOP, x2=x, y2=bottom, kind="resumed",
                          title=f"resumed from its checkpoint after step {curve.resumed_at}"))
    dots = []
    for kind, index in (("whole", 2), ("sharded", 1)):  # the sharded run drawn last, over the whole one
        series: list[tuple[int, float]] = []
        for point in points:
            loss = point[index]
            if loss is not None:
                series.append((point[0], loss))
        for (step, value), (next_step, next_value) in itertools.pairwise(series):
            rules.append(Rule(x1=x_of(step), y1=y_of(value), x2=x_of(next_step), y2=y_of(next_value), kind=kind))
        dots += [Dot(x=x_of(step), y=y_of(value), kind=kind, title=f"step {step}: {kind} loss {value:.9g}")
                 for step, value in series]
    return Plot(title="Loss per step",
                caption="The sharded run (blue) and the whole model's (grey) on the same steps" +
                (f"; resumed after step {curve.resumed_at} (dashed)" if curve.resumed_at is not None else ""),
                width=_CURVE_LEFT + _CURVE_WIDTH + 24, height=bottom + _CURVE_BOTTOM,
                dots=tuple(dots), rules=tuple(rules), labels=tuple(labels))
