"""The nightly's GitHub side: which earlier run kept results to compare with, and the one regression
issue (opened when something regressed, updated each red night, closed on a green one)."""

from __future__ import annotations

import json
import os
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.contract import CASE_FIXED_UPSTREAM, TRIAGE_FLAKY, TRIAGE_KNOWN_UPSTREAM
from harness.errors import ConfigError
from harness.github.actions_io import read_text, write_outputs
from harness.github.api import GitHub
from harness.github.comments import fit_body, upsert_comment

if TYPE_CHECKING:
    from harness.results import ResultSet
    from harness.results.nightly_records import TriageRecord

NIGHTLY_MARKER = "<!-- harness-nightly -->"


def previous_run_command(gh: GitHub, args: Any) -> int:
    """The newest finished run of this workflow on the branch, other than this one, that kept results."""
    current = os.environ.get("GITHUB_RUN_ID", "")
    branch = args.branch or str((gh.get(f"/repos/{gh.repo}") or {}).get("default_branch") or "main")
    runs = gh.get(gh.repo_path(f"actions/workflows/{urllib.parse.quote(args.workflow)}/runs"),
                  branch=branch, status="completed", per_page=20)
    for run in (runs or {}).get("workflow_runs", []):
        if str(run.get("id")) == current or run.get("conclusion") not in ("success", "failure"):
            continue
        artifacts = gh.paginate(gh.repo_path(f"actions/runs/{run['id']}/artifacts"), key="artifacts")
        kept = [a for a in artifacts if not a.get("expired")]
        if any(str(a.get("name")).startswith(args.artifact_prefix) for a in kept):
            write_outputs({"run_id": str(run["id"]), "sha": str(run.get("head_sha") or "")})
            print(f"previous run {run['id']} ({run.get('head_sha')}, {run.get('conclusion')})")
            return 0
    write_outputs({"run_id": "", "sha": ""})
    print(f"no earlier run of {args.workflow} on {branch} kept {args.artifact_prefix}* artifacts")
    return 0


def find_open_issue(gh: GitHub, label: str, author: str) -> dict | None:
    # The label filter of the issues list is exact and has no search-index delay.
    for issue in gh.paginate(gh.repo_path("issues"), state="open", labels=label):
        ours = (issue.get("user") or {}).get("login") == author
        if ours and "pull_request" not in issue and str(issue.get("body") or "").startswith(NIGHTLY_MARKER):
            return issue
    return None


TRIAGE_JSON_BYTES = 16 * 1024 * 1024


def read_triage(path: str | Path) -> TriageRecord:
    """`harness triage -o FILE` as its record (harness.results.nightly_records.TriageRecord). Read as input: a bad
    file is one line naming it, exit 2."""
    from harness.results.nightly_records import TriageRecord

    text = read_text(path, "triage")
    if len(text) > TRIAGE_JSON_BYTES:
        raise ConfigError(f"triage {path}: larger than {TRIAGE_JSON_BYTES // (1024 * 1024)} MiB")
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise ConfigError(f"triage {path}: not the JSON `harness triage -o` writes: {error}") from None
    try:
        return TriageRecord.from_json(document)
    except ValueError as error:
        raise ConfigError(f"triage {path}: {error}") from None


# Triage's classes the issue does not list as regressions: a flaky red passed on a rerun (as nightly_regressions has
# it), and a known upstream bug is a case fixed upstream, no red: the issue names its entries to close.
NOT_REGRESSIONS = (TRIAGE_FLAKY, TRIAGE_KNOWN_UPSTREAM)


def triage_regressions(record: TriageRecord) -> tuple:
    """The new reds of triage.json as the issue lists them: a test's class, or an errored cell's message and class,
    each with its label and its bisect's line."""
    from harness.results import Regression

    found = []
    for red in record.reds:
        if red.triage_class in NOT_REGRESSIONS:
            continue
        if red.test is None:
            found.append(Regression(cell_id=red.cell, kind="errored", text=red.message,
                                    triage_class=red.triage_class, label=red.label, bisect=red.bisect))
        else:
            found.append(Regression(cell_id=red.cell, kind="failing", test_id=red.test, text=red.triage_class,
                                    triage_class=red.triage_class, label=red.label, bisect=red.bisect))
    return tuple(found)


def release_view(current: ResultSet, baseline: ResultSet | None, record: TriageRecord | None) -> dict[str, Any]:
    """What the issue opens with: the releases new since last night, tonight's cases by class and the cases fixed
    upstream; triage's answer where triage.json was given (`record`), else the same rules over the results."""
    from harness.results import new_releases
    from harness.results.triage import case_records

    if record is not None and record.cases is not None:
        return {"releases": record.releases, "cases": record.cases, "fixed_upstream": record.fixed_upstream}
    return {"releases": new_releases(current, baseline), "cases": current.case_counts,
            "fixed_upstream": case_records(current, CASE_FIXED_UPSTREAM)}


TREND_JSON_BYTES = 16 * 1024 * 1024


def creeping_tests(path: str | Path) -> tuple:
    """The history's regressions, from `harness trend --json FILE`: tests still passing whose memory or time rose
    over their baseline. Read as input: a bad file is one line naming it, exit 2."""
    from harness.history.trend import regressions_from_json

    text = read_text(path, "trend")
    if len(text) > TREND_JSON_BYTES:
        raise ConfigError(f"trend {path}: larger than {TREND_JSON_BYTES // (1024 * 1024)} MiB")
    try:
        return regressions_from_json(json.loads(text))
    except (ValueError, RecursionError) as error:
        raise ConfigError(f"trend {path}: not the JSON `harness trend --json` writes: {error}") from None


def nightly_issue_command(gh: GitHub, args: Any) -> int:
    from harness.report.cost import run_cost
    from harness.report.links import links_from
    from harness.report.render import render_nightly
    from harness.results import CellStatus, load_results, nightly_regressions

    current = load_results([args.results])
    # No baseline folder: the first night, or the previous night's artifacts expired.
    baseline = load_results([args.baseline]) if args.baseline and Path(args.baseline).exists() else None
    regressions = nightly_regressions(current, baseline, memory_mib=args.memory_mib, memory_percent=args.memory_percent)
    record = read_triage(args.triage_json) if getattr(args, "triage_json", None) else None
    if record is not None:
        # The same reds (results.compare.new_reds, the one rule), each with triage's class and its bisect's word.
        regressions = (*triage_regressions(record),
                       *(regression for regression in regressions if regression.kind == "memory"))
    creeping = creeping_tests(args.trend_json) if getattr(args, "trend_json", None) else ()
    # A creep is news while every test passes: the issue stays open (or opens) to list it.
    green = all(cell.status is CellStatus.PASSED for cell in current.cells) and not creeping
    issue = find_open_issue(gh, args.label, args.author)
    sha = (args.sha or os.environ.get("GITHUB_SHA") or "unknown")[:12]
    run_id = os.environ.get("GITHUB_RUN_ID", "")
    server = os.environ.get("GITHUB_SERVER_URL", "")
    run_url = f"{server}/{gh.repo}/actions/runs/{run_id}" if server and run_id.isdigit() else None
    # One comment per night, even when the job is re-run.
    night_marker = f"<!-- harness-nightly:{run_id if run_id.isdigit() else 'local'} -->"

    if green:
        if issue is None:
            print("all green; no open regression issue")
            return 0
        upsert_comment(gh, issue["number"], render_nightly("green", marker=night_marker, sha=sha, run_url=run_url),
                       night_marker, args.author)
        gh.request("PATCH", gh.repo_path(f"issues/{issue['number']}"),
                   body={"state": "closed", "state_reason": "completed"})
        print(f"closed issue #{issue['number']}")
        return 0

    against = "the night before" if baseline is not None else "no earlier results (first night, or they expired)"
    report = read_text(args.report, "report") if args.report else ""
    # Each red's class and bisect line, as `harness triage` rendered it.
    triage = read_text(args.triage, "triage").strip() if args.triage else ""
    cost = run_cost(current.cells, links_from(os.environ, getattr(args, "links", None)))
    body = fit_body(render_nightly("issue", marker=NIGHTLY_MARKER, sha=sha, run_url=run_url, regressions=regressions,
                                   matrix=args.matrix, against=against, report=report, triage=triage, cost=cost,
                                   creeping=creeping, **release_view(current, baseline, record)))
    if issue is None:
        if not regressions and not creeping:
            print("failures persist from the night before, and no regression issue is open")
            return 0
        created = gh.request("POST", gh.repo_path("issues"), body={
            "title": f"Nightly regression: {args.matrix}", "body": body, "labels": [args.label]}).data
        print(f"opened issue #{created.get('number')}")
        return 0
    gh.request("PATCH", gh.repo_path(f"issues/{issue['number']}"), body={"body": body})
    if regressions:
        again = render_nightly("again", marker=night_marker, sha=sha, run_url=run_url, regressions=regressions)
        upsert_comment(gh, issue["number"], again, night_marker, args.author)
    print(f"updated issue #{issue['number']}")
    return 0
