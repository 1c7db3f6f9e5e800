"""One bisect probe: run a selection of tests on one set of package versions, through `run.run_cell`
(so the probe gets the cached per-cell environment and leaves an ordinary results folder), and
reduce what pytest said to a verdict.

Probes run with `--runxfail`: a known upstream bug is an xfail in the suite, and a bisect that is
looking for where it began must see it fail.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.bisect.search import Probe, RunOutcome, verdict_of
from harness.cell.preflight import environment_spec, prepare_environment
from harness.contract import ERROR_ENVIRONMENT
from harness.envs.build import Environment, plan_environment
from harness.plan.cells import Cell
from harness.results import CellResult, CellStatus, Outcome, load_results
from harness.run import command as run
from harness.run.plan import Host

# Environment messages worth showing while a probe runs; everything else stays in the probe's folder.
SHOWN = ("building environment", "waiting for another")
OUTCOMES = {
    Outcome.PASSED: "passed",
    Outcome.FAILED: "failed",
    Outcome.ERRORED: "failed",
    Outcome.SKIPPED: "skipped",
    Outcome.XFAILED: "failed",
    Outcome.FLAKY: "flaky",
}
PrepareEnvironment = Callable[[Cell, Path, Callable[[str], None]], Environment]


def run_outcome(cell: CellResult) -> RunOutcome:
    """What one results folder says about the selection."""
    reason = cell.reason or ""
    if cell.status is CellStatus.ERRORED and cell.error_kind == ERROR_ENVIRONMENT:
        # The kind decides; the words lose run.py's "environment: " only to read well after "cannot install: ".
        return RunOutcome(outcomes={}, install_error=reason.removeprefix("environment: ") or "the install failed")
    if cell.exit_code == 5:
        return RunOutcome(outcomes={}, nothing_selected=True)
    outcomes = {test.test_id: OUTCOMES[test.outcome] for test in cell.tests}
    failing = [test for test in cell.tests if OUTCOMES[test.outcome] == "failed"]
    skipped = [test for test in cell.tests if test.outcome is Outcome.SKIPPED]
    failure = (failing[0].name, failing[0].message or failing[0].outcome.value) if failing else None
    broke = cell.status is CellStatus.ERRORED and not failing
    return RunOutcome(
        outcomes=outcomes,
        failure=failure,
        skip_reason=skipped[0].message if skipped else None,
        error=(reason or "the cell errored") if broke else None,
    )


def slug(versions: Mapping[str, str]) -> str:
    return "-".join(
        f"{package}{re.sub(r'[^A-Za-z0-9.+_-]', '_', version)}" for package, version in sorted(versions.items())
    )


@dataclasses.dataclass(kw_only=True)
class CellProber:
    """Runs the selection on one cell shape with some of its packages replaced."""

    cell: Cell
    host: Host
    results_root: Path
    env_dir: Path
    pytest_args: list[str]
    project: Path  # the tested repository: the suite and results resolve from it
    matrix_reference: str = "local"
    import_path: Path | None = None  # this harness, for a built environment that lacks it
    runs: int = 1
    log: Callable[[str], None] = print
    prepare: PrepareEnvironment = prepare_environment
    only: tuple[str, ...] = ()  # once the search knows which tests it follows: their node ids

    def narrow(self, tests: Sequence[str]) -> None:
        self.only = tuple(tests)

    def __call__(
        self,
        versions: Mapping[str, str],
        label: str,
        prepare: PrepareEnvironment | None = None,
        built: Callable[[Cell], bool] | None = None,
        pins: Mapping[str, str] | None = None,
    ) -> Probe:
        """`pins`: the cell's torch / transformers for this probe (default: those in `versions`)."""
        started = time.monotonic()
        if pins is None:
            pins = {k: v for k, v in versions.items() if k in ("torch", "transformers")}
        pinned: dict[str, Any] = dict(pins)  # torch and transformers, as the cell's fields of those names
        cell = dataclasses.replace(self.cell, reruns=0, **pinned)
        if self.only:  # test ids replace the suite (pytest would run the whole suite beside them)
            cell = dataclasses.replace(cell, suite=self.only)
        will_build = (built or self._will_build)(cell)
        outcomes, folders = [], []
        for index in range(1, self.runs + 1):
            root = self.results_root / slug(versions)
            root = root / f"run{index}" if self.runs > 1 else root
            done = run.run_cell(
                cell,
                host=self.host,
                results_root=root,
                env_dir=self.env_dir,
                pytest_args=[*self.pytest_args, "--runxfail"],
                log=self._quiet,
                project=self.project,
                matrix_reference=self.matrix_reference,
                import_path=self.import_path,
                prepare_environment=prepare or self.prepare,
            )
            folders.append(str(done.folder))
            outcomes.append(run_outcome(load_results([done.folder]).cells[0]))
            if outcomes[-1].install_error or outcomes[-1].nothing_selected:
                break  # another run cannot say more
        verdict, note, failure = verdict_of(outcomes)
        return Probe(
            versions=dict(versions),
            label=label,
            verdict=verdict,
            note=note,
            failure=failure,
            nothing_selected=any(o.nothing_selected for o in outcomes),
            outcomes=dict(outcomes[0].outcomes),
            duration_s=time.monotonic() - started,
            environments_built=int(will_build),
            folders=tuple(folders),
        )

    def _will_build(self, cell: Cell) -> bool:
        try:
            return plan_environment(environment_spec(cell), self.env_dir)[0] == "build"
        except Exception:
            return False  # the probe's own run reports why the environment is unusable

    def _quiet(self, line: str) -> None:
        if line.lstrip().startswith(SHOWN):
            self.log(f"    {line.strip()}")
