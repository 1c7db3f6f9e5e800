"""`harness gh run-links`: each cell's job and results artifact in this workflow run, and when each job was queued,
started and completed (its wait and the report's cost), read through the API before the report job downloads any
artifact (the step that renders holds no token)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from harness.github.api import GitHub
from harness.report.links import JOB_TIMES
from harness.results import utc_moment


def run_links_command(gh: GitHub, args: Any) -> int:
    """A cell job's name ends with its cell id (`gpu-tests / <id>` when called); its artifact is PREFIX<id>. Only
    URLs of this run are kept. With --matrix, each packed cell gets its pack's job and artifact: which pack a cell
    is in is packed again from the matrix (the plan's data), not read from a job's name."""
    run_id = os.environ.get("GITHUB_RUN_ID", "")
    if not run_id.isdigit():
        raise ConfigError(f"GITHUB_RUN_ID {run_id!r} is not a run id; run-links runs inside the workflow run")
    server = (os.environ.get("GITHUB_SERVER_URL") or "https://github.com").rstrip("/")
    run = f"{server}/{gh.repo}/actions/runs/{run_id}"
    jobs: dict[str, str] = {}
    timings: dict[str, dict[str, str]] = {}
    for job in gh.paginate(gh.repo_path(f"actions/runs/{run_id}/jobs"), key="jobs", filter="latest"):
        url, name = job.get("html_url"), str(job.get("name") or "")
        if isinstance(url, str) and url.startswith(f"{run}/"):
            key = name.rsplit(" / ", 1)[-1]
            jobs[key] = url
            timings[key] = job_times(job)
    artifacts: dict[str, str] = {}
    for artifact in gh.paginate(gh.repo_path(f"actions/runs/{run_id}/artifacts"), key="artifacts"):
        name = str(artifact.get("name") or "")
        if name.startswith(args.artifact_prefix) and not artifact.get("expired") and str(artifact.get("id")).isdigit():
            artifacts[name[len(args.artifact_prefix):]] = f"{run}/artifacts/{artifact['id']}"
    if args.matrix:  # a packed cell ran in its pack's job (and waited as it did), its folder is in the pack's artifact
        for cell_id, pack_id in packed_cells(args.matrix).items():
            by_cell: tuple[dict[str, Any], ...] = (jobs, artifacts, timings)
            for found in by_cell:
                if pack_id in found:
                    found[cell_id] = found[pack_id]
    links = {"jobs": jobs, "artifacts": artifacts, "timings": timings}
    Path(args.output).write_text(json.dumps(links, indent=2) + "\n")
    print(f"{len(jobs)} jobs and {len(artifacts)} {args.artifact_prefix}* artifacts of run {run_id}")
    return 0


def job_times(job: dict) -> dict[str, str]:
    """The job's times that are ISO 8601 with an offset, rewritten in UTC; any other value (the API's null for a job
    not started yet, or anything malformed) is left out, not passed on."""
    moments = {key: utc_moment(job.get(key)) for key in JOB_TIMES}
    return {key: moment.isoformat() for key, moment in moments.items() if moment is not None}


def packed_cells(matrix_argument: str) -> dict[str, str]:
    """Each packed cell's id -> its pack's id (the job's name and artifact's suffix), from the matrix."""
    # Late: `harness gh` runs from a checkout with nothing installed, and a matrix needs yaml (only with --matrix).
    from harness.plan.matrix import load_matrix
    from harness.plan.packing import members, plan_jobs
    from harness.plan.runners import load_runners

    matrix = load_matrix(matrix_argument)
    return members(plan_jobs(matrix.cells, load_runners(matrix.root, beside=matrix.path.parent)))
