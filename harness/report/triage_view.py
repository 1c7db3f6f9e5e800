"""`harness triage`: tonight's new reds classified, the bisect plan for the real ones, and the table people read,
opening with the releases new since last night and closing with tonight's cases by class."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from harness.report.listing import listed
from harness.report.model import against_last_night, reason_groups
from harness.report.templates import render_template
from harness.results import CaseCounts, ReleaseChange, load_results
from harness.results.nightly_records import CaseRecord, ReleaseRecord, TriageRed
from harness.results.triage import bisect_plan, load_bisects, triage, triage_record

# The table lists at most so many reds per cell and in all (it goes to the job summary and the nightly issue);
# triage.json keeps every one.
LISTED = 300
LISTED_PER_CELL = 30
REASONS_LISTED = 50  # the reasons cases were not built


def render_triage(rows: Iterable[TriageRed], *, baseline: bool,
                  releases: Iterable[ReleaseChange | ReleaseRecord] = (), cases: CaseCounts | None = None,
                  fixed_upstream: Iterable[CaseRecord] = (), not_built: Iterable[CaseRecord] = ()) -> str:
    """The triage table (reports/triage.md.j2), escaped like every rendering of results: `releases` new since last
    night before it; tonight's `cases` by class, the cases fixed upstream and those not built (by reason) after it."""
    reds = tuple(rows)
    shown = listed(reds, lambda red: (red.cell,), per_cell=LISTED_PER_CELL, total=LISTED)
    fixed = listed(tuple(fixed_upstream), lambda case: (case.cell,), per_cell=LISTED_PER_CELL, total=LISTED)
    reasons = reason_groups((case.cell, case.reason or "no reason recorded") for case in not_built)
    return render_template("triage.md.j2", reds=shown.shown, total=len(reds), more=shown.left_out, baseline=baseline,
                           releases=against_last_night(releases), cases=cases, fixed_upstream=fixed.shown,
                           fixed_more=fixed.left_out, not_built=reasons[:REASONS_LISTED],
                           not_built_more=max(len(reasons) - REASONS_LISTED, 0))


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
    record = triage_record(tonight, baseline, reds, load_bisects(args.bisects), plan)
    if args.output:
        Path(args.output).write_text(json.dumps(record.to_json(), indent=2) + "\n", encoding="utf-8")
    if args.github_matrix:
        Path(args.github_matrix).write_text(json.dumps(record.github_matrix(), separators=(",", ":")), encoding="utf-8")
    print(render_triage(record.reds, baseline=baseline is not None, releases=record.releases, cases=record.cases,
                        fixed_upstream=record.fixed_upstream, not_built=record.not_built), end="")
    return 0
