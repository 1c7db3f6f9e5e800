"""`harness triage`: tonight's new reds classified, the bisect plan for the real ones, and the table people read."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from harness.report.listing import listed
from harness.report.templates import render_template
from harness.results import load_results
from harness.results.nightly_records import TriageRecord, TriageRed
from harness.results.triage import bisect_plan, load_bisects, triage, with_bisects

# The table lists at most so many reds per cell and in all (it goes to the job summary and the nightly issue);
# triage.json keeps every one.
LISTED = 300
LISTED_PER_CELL = 30


def render_triage(rows: Iterable[TriageRed], *, baseline: bool) -> str:
    """The triage table (reports/triage.md.j2), escaped like every rendering of results."""
    reds = tuple(rows)
    shown = listed(reds, lambda red: (red.cell,), per_cell=LISTED_PER_CELL, total=LISTED)
    return render_template("triage.md.j2", reds=shown.shown, total=len(reds), more=shown.left_out, baseline=baseline)


def command(args) -> int:
    # runners.yaml says which runner labels a GPU type's bisect job runs on; triage itself is handed the labels.
    from harness.plan.runners import load_runners

    tonight = load_results([args.results])
    baseline = load_results([args.baseline]) if args.baseline and Path(args.baseline).is_dir() else None
    reds = triage(tonight, baseline)
    runners = load_runners()
    plan = bisect_plan(
        reds,
        {name: runner.labels for name, runner in runners.items()},
        {cell.id: cell.info.gpu or "" for cell in tonight.cells},
    )
    record = TriageRecord(reds=with_bisects(reds, load_bisects(args.bisects)), bisect=plan)
    if args.output:
        Path(args.output).write_text(json.dumps(record.to_json(), indent=2) + "\n", encoding="utf-8")
    if args.github_matrix:
        Path(args.github_matrix).write_text(json.dumps(record.github_matrix(), separators=(",", ":")), encoding="utf-8")
    print(render_triage(record.reds, baseline=baseline is not None), end="")
    return 0
