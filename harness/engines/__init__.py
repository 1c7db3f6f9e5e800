"""Engines: what starts, watches and cancels a cell's hosts, one module each behind the `Engine` protocol
(base.py): `local` runs pytest here, as a child of `harness run` (local.py); `slurm` submits one job to a
login node's Slurm (slurm.py); `jobset` renders a Kubernetes JobSet and drives kubectl (jobset.py). An engine
across hosts starts `harness host` on each (host.py) and merges what each host sampled (hostmemory.py); every
engine leaves the same results folder as a local cell.

`REGISTRY` maps runners.yaml's `engine:` to its engine; the plan validates the names against
harness.plan.matrix.ENGINES (the plan imports nothing of engines; a test keeps the two the same)."""

from __future__ import annotations

from collections.abc import Mapping

from harness.engines.base import Engine, Interrupted, JobFields, Launch, Ran
from harness.engines.jobset import JobSetEngine
from harness.engines.local import LocalEngine
from harness.engines.slurm import SlurmEngine

__all__ = ["REGISTRY", "Engine", "Interrupted", "JobFields", "Launch", "Ran", "engine"]

REGISTRY: Mapping[str, Engine] = {each.name: each for each in (LocalEngine(), SlurmEngine(), JobSetEngine())}


def engine(name: str) -> Engine:
    """The engine named by a cell's `engine` (runners.yaml's, checked when the matrix was read)."""
    return REGISTRY[name]
