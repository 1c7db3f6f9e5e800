"""Geometry of the trend page's plots (the markup is reports/_plot.svg.j2's, as for the report): one small plot
per metric of a test over the last nights; a night the test did not pass is a red dot, and a crept metric shows
the threshold it crossed as a dashed line."""

from __future__ import annotations

from collections.abc import Callable

from harness.history import Creep, Night
from harness.history.query import TestSeries
from harness.report.filters import duration, mib_or_gib, significant
from harness.report.plots import Dot, Label, Plot, Rule

_WIDTH = 300.0
_HEIGHT = 90.0
_LEFT = 52.0  # room for the axis numbers
_RIGHT = 8.0
_TOP = 10.0
_BOTTOM = 14.0

# (results column, title, how a value reads)
_PANELS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("peak_mib", "peak memory", mib_or_gib),
    ("time_s", "time", duration),
    ("error_over_bound", "error / bound", lambda value: significant(value)),
)


def trend_plots(series: TestSeries, nights: tuple[str, ...]) -> tuple[Plot, ...]:
    creeps = {creep.metric: creep for creep in series.creeps}
    plots = (_plot(series.nights, nights, column, title, shown, creeps.get(column)) for column, title, shown in _PANELS)
    return tuple(plot for plot in plots if plot is not None)


def _plot(points: tuple[Night, ...], nights: tuple[str, ...], column: str, title: str,
          shown: Callable[[float], str], creep: Creep | None) -> Plot | None:
    values = [night.values.get(column) for night in points]
    present = [value for value in values if value is not None]
    if not present:
        return None
    top = max(present + ([creep.threshold] if creep else []))
    top = top * 1.1 if top > 0 else 1.0
    step = (_WIDTH - _LEFT - _RIGHT) / max(len(points) - 1, 1)

    def x(index: int) -> float:
        return _LEFT + index * step

    def y(value: float) -> float:
        return _TOP + (_HEIGHT - _TOP - _BOTTOM) * (1.0 - value / top)

    rules = [Rule(x1=_LEFT, y1=y(0.0), x2=_WIDTH - _RIGHT, y2=y(0.0), kind="grid")]
    if creep is not None:
        rules.append(Rule(x1=_LEFT, y1=y(creep.threshold), x2=_WIDTH - _RIGHT, y2=y(creep.threshold),
                          kind="threshold", title=f"threshold {shown(creep.threshold)} (baseline "
                                                  f"{shown(creep.baseline)})"))
    dots = []
    previous: tuple[float, float] | None = None
    for index, (night, value) in enumerate(zip(points, values, strict=True)):
        if value is None:
            previous = None
            continue
        here = (x(index), y(value))
        if previous is not None:
            rules.append(Rule(x1=previous[0], y1=previous[1], x2=here[0], y2=here[1], kind="series"))
        passed = night.outcome == "passed"
        dots.append(Dot(x=here[0], y=here[1], kind="pass" if passed else "red",
                        title=f"{nights[index]}: {shown(value)} ({night.outcome})"))
        previous = here
    labels = [Label(x=_LEFT - 4, y=y(top / 1.1) + 4, text=shown(top / 1.1), anchor="end", kind="axis"),
              Label(x=_LEFT - 4, y=y(0.0) + 4, text=shown(0.0), anchor="end", kind="axis")]
    last = present[-1]
    caption = f"last {shown(last)}" + (f", over its baseline {shown(creep.baseline)}" if creep else "")
    return Plot(title=title, caption=caption, width=_WIDTH, height=_HEIGHT, rules=tuple(rules), dots=tuple(dots),
                labels=tuple(labels))
