"""Engines: what starts, watches and cancels a cell's hosts, one module each behind the `Engine` protocol
(base.py): `local` runs pytest here, as a child of `harness run` (local.py); `slurm` submits one job to a
login node's Slurm (slurm.py); `jobset` renders a Kubernetes JobSet and drives kubectl (jobset.py). An engine
across hosts makes the cell's TLS credentials (credentials.py), starts `harness host` on each (host.py) and
merges what each host sampled (hostmemory.py); every engine leaves the same results folder as a local cell.

Each engine owns its settings type (`SlurmSettings`, `JobSetSettings`), read from runners.yaml's `submit:`,
which the plan keeps as written; `check_settings` reads every cell's before a run or a matrix starts anything.
`REGISTRY` maps runners.yaml's `engine:` to its engine; the plan validates the names against
harness.plan.matrix.ENGINES (the plan imports nothing of engines; a test keeps the two the same)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from harness.engines.base import Engine, EngineCause, Interrupted, JobFields, Launch, Ran, interruptible
from harness.engines.jobset import JobSetEngine
from harness.engines.local import LocalEngine
from harness.engines.slurm import SlurmEngine
from harness.plan.cells import Cell

__all__ = ["REGISTRY", "Engine", "EngineCause", "Interrupted", "JobFields", "Launch", "Ran", "check_settings", "engine",
           "interruptible"]

REGISTRY: Mapping[str, Engine] = {each.name: each for each in (LocalEngine(), SlurmEngine(), JobSetEngine())}


def engine(name: str) -> Engine:
    """The engine named by a cell's `engine` (runners.yaml's, checked when the matrix was read)."""
    return REGISTRY[name]


def check_settings(cells: Iterable[Cell]) -> None:
    """Each cell's engine reads its settings from the cell's `submit:`: a `ConfigError` naming the runners.yaml
    and key for the first one it refuses."""
    for cell in cells:
        engine(cell.engine).settings(cell.submit)
