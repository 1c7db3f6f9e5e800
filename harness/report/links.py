"""Links from a report to where its cells ran: the workflow run, each cell's job (its log) and artifact.

They come only from trusted places, never from a results folder (a pull request's code wrote that):
the run from the report job's own GITHUB_SERVER_URL, GITHUB_REPOSITORY, GITHUB_RUN_ID and
GITHUB_RUN_ATTEMPT, the jobs and artifacts from the file `harness gh run-links` wrote from the API
before any artifact was downloaded. Every link must be a run, job or artifact URL of that one run, so
a link can carry no markup and lead nowhere else. The same file gives each job's times (the jobs API's created_at,
started_at, completed_at), looked up for a cell the way its job link is (`RunLinks.job_key`).
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from harness.errors import ConfigError
from harness.results import seconds_between, utc_moment

_SEGMENT = r"[A-Za-z0-9_.-]+"
_RUN = re.compile(rf"^(https://{_SEGMENT}(?::\d+)?/{_SEGMENT}/{_SEGMENT}/actions/runs/\d+)$")
LINKS_MAX_BYTES = 2_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class JobTiming:
    """When a job was queued, started and completed, in UTC (None: the API gave no usable time)."""

    created_at: datetime.datetime | None = None
    started_at: datetime.datetime | None = None
    completed_at: datetime.datetime | None = None

    @property
    def queued_s(self) -> float | None:
        """How long it waited for a runner, as recorded (negative where the times disagree)."""
        return seconds_between(self.created_at, self.started_at)


JOB_TIMES = tuple(entry.name for entry in fields(JobTiming))  # the jobs API's names for them


@dataclass(frozen=True, slots=True, kw_only=True)
class RunLinks:
    run: str  # https://github.com/OWNER/NAME/actions/runs/ID (the attempt, where it is not the first)
    jobs: Mapping[str, str] = field(default_factory=dict)  # job key -> its job's page (the log)
    artifacts: Mapping[str, str] = field(default_factory=dict)  # cell id -> its results artifact
    timings: Mapping[str, JobTiming] = field(default_factory=dict)  # job key -> its times, keyed as `jobs`

    def job_key(self, cell_id: str) -> str:
        """Where `jobs` and `timings` hold the job that ran a cell: its name ends with the cell id."""
        return cell_id

    def job(self, cell_id: str) -> str | None:
        return self.jobs.get(self.job_key(cell_id))

    def timing(self, cell_id: str) -> JobTiming | None:
        return self.timings.get(self.job_key(cell_id))

    def artifact(self, cell_id: str) -> str | None:
        return self.artifacts.get(cell_id)


def run_url(environ: Mapping[str, str]) -> str | None:
    """The run's page from the variables Actions sets in every step, or None outside Actions."""
    server, repository, run_id = (environ.get(key, "") for key in
                                  ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID"))
    url = f"{server.rstrip('/')}/{repository}/actions/runs/{run_id}"
    return url if server and repository and run_id and _RUN.match(url) else None


def links_from(environ: Mapping[str, str], links_file: str | None = None) -> RunLinks | None:
    run = run_url(environ)
    if run is None:
        if links_file:
            raise ConfigError(f"--links {links_file}: needs GITHUB_SERVER_URL, GITHUB_REPOSITORY and GITHUB_RUN_ID "
                              "(the run the links belong to)")
        return None
    attempt = environ.get("GITHUB_RUN_ATTEMPT", "")
    shown = f"{run}/attempts/{attempt}" if attempt.isdigit() and int(attempt) > 1 else run
    if not links_file:
        return RunLinks(run=shown)
    jobs, artifacts, timings = read_links_file(Path(links_file), run)
    return RunLinks(run=shown, jobs=jobs, artifacts=artifacts, timings=timings)


def read_links_file(path: Path, run: str) -> tuple[dict[str, str], dict[str, str], dict[str, JobTiming]]:
    """{"jobs": {cell id: url}, "artifacts": {cell id: url}, "timings": {cell id: {time: ISO 8601}}}; a URL of any
    other run is refused, and so is a time that is not ISO 8601 with its offset (`harness gh run-links` writes only
    those). A file from before timings has none: every cell's wait is then unknown."""
    try:
        with path.open("rb") as handle:
            data = json.loads(handle.read(LINKS_MAX_BYTES + 1)[:LINKS_MAX_BYTES])
    except (OSError, ValueError) as error:
        raise ConfigError(f"--links {path}: not a readable links file: {error}") from None
    job_url = re.compile(rf"^{re.escape(run)}(?:/attempts/\d+)?/job/\d+$")
    artifact_url = re.compile(rf"^{re.escape(run)}/artifacts/\d+$")
    found = []
    for key, pattern in (("jobs", job_url), ("artifacts", artifact_url)):
        entries = data.get(key, {}) if isinstance(data, dict) else None
        if not isinstance(entries, dict):
            raise ConfigError(f"--links {path}: {key}: expected an object of cell id to URL")
        for cell_id, url in entries.items():
            if not isinstance(url, str) or not pattern.match(url):
                raise ConfigError(f"--links {path}: {key}: {str(url)[:200]!r} for {cell_id[:100]!r} is not a "
                                  f"{key[:-1]} URL of {run}")
        found.append(dict(entries))
    return found[0], found[1], _timings(path, data.get("timings", {}))


def _timings(path: Path, entries: object) -> dict[str, JobTiming]:
    if not isinstance(entries, dict) or not all(isinstance(times, dict) for times in entries.values()):
        raise ConfigError(f"--links {path}: timings: expected an object of job to its times")
    timings = {}
    for key, times in entries.items():
        moments = {}
        for name in JOB_TIMES:
            raw = times.get(name)
            moments[name] = utc_moment(raw)
            if raw is not None and moments[name] is None:
                raise ConfigError(f"--links {path}: timings: {name} {str(raw)[:60]!r} for {key[:100]!r} is not an "
                                  "ISO 8601 time with its offset")
        timings[key] = JobTiming(**moments)
    return timings
