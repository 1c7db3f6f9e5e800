"""Links from a report to where its cells ran: the workflow run, each cell's job (its log) and artifact.

They come only from trusted places, never from a results folder (a pull request's code wrote that):
the run from the report job's own GITHUB_SERVER_URL, GITHUB_REPOSITORY, GITHUB_RUN_ID and
GITHUB_RUN_ATTEMPT, the jobs and artifacts from the file `harness gh run-links` wrote from the API
before any artifact was downloaded. Every link must be a run, job or artifact URL of that one run, so
a link can carry no markup and lead nowhere else.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import ConfigError

_SEGMENT = r"[A-Za-z0-9_.-]+"
_RUN = re.compile(rf"^(https://{_SEGMENT}(?::\d+)?/{_SEGMENT}/{_SEGMENT}/actions/runs/\d+)$")
LINKS_MAX_BYTES = 2_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class RunLinks:
    run: str  # https://github.com/OWNER/NAME/actions/runs/ID (the attempt, where it is not the first)
    jobs: Mapping[str, str] = field(default_factory=dict)  # cell id -> its job's page (the log)
    artifacts: Mapping[str, str] = field(default_factory=dict)  # cell id -> its results artifact

    def job(self, cell_id: str) -> str | None:
        return self.jobs.get(cell_id)

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
    jobs, artifacts = read_links_file(Path(links_file), run)
    return RunLinks(run=shown, jobs=jobs, artifacts=artifacts)


def read_links_file(path: Path, run: str) -> tuple[dict[str, str], dict[str, str]]:
    """{"jobs": {cell id: url}, "artifacts": {cell id: url}}; a URL of any other run is refused."""
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
    return found[0], found[1]
