"""`harness trend`: the history database -> an HTML page (a plot per test, regressions first) and, for the nightly
issue, the regressions as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from harness.history import METRICS, PLOTTED_TESTS, build_trend, read_history
from harness.history.rule import BASELINE_NIGHTS, CONFIRM_NIGHTS
from harness.report.templates import render_template
from harness.report.trend_plots import trend_plots

LARGEST_NIGHTS = 365


def command(args: Any) -> int:
    if not 1 <= args.nights <= LARGEST_NIGHTS:
        raise ConfigError(f"--nights {args.nights}: give 1 to {LARGEST_NIGHTS}")
    connection = read_history(args.db)  # read-only: the trend never writes the artifact
    try:
        trend = build_trend(connection, args.nights)
    finally:
        connection.close()
    _write(args.html, render_page(trend))
    if args.json:
        _write(args.json, json.dumps(trend.as_json(), indent=2, allow_nan=False) + "\n")
    print(f"trend over {len(trend.nights)} nights: {len(trend.regressions)} regressions, "
          f"{len(trend.plotted)} tests plotted")
    return 0


def render_page(trend) -> str:
    night_names = tuple(night.night for night in trend.nights)
    rows = [(series, trend_plots(series, night_names)) for series in trend.plotted]
    return render_template("trend.html.j2", trend=trend, rows=rows, metrics=METRICS, plotted_cap=PLOTTED_TESTS,
                           baseline_nights=BASELINE_NIGHTS, confirm_nights=CONFIRM_NIGHTS)


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"cannot write {path}: {error.strerror or error}") from None
