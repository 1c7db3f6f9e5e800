"""The plan's values: a runner type (`Runner`) and how an engine submits to it (`Submit`, parsed here from
runners.yaml's `submit:`), one job (`Cell`) and a loaded matrix (`Matrix`), with the constants they name.

Frozen dataclasses that every stage after the plan reads; nothing here reads a file."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from harness.plan.files import positive_int
from harness.project import ProjectRoot

AXES = ("gpu", "gpus", "torch", "transformers")
# Axes a matrix may leave out, and the value a cell then has: `hosts` makes a cell H hosts x `gpus` each.
OPTIONAL_AXES = {"hosts": 1}
ENGINES = ("local", "slurm", "jobset")
SUBMIT_KEYS = {"partition", "account", "time", "sbatch_args", "segment", "container_image", "image",
               "namespace", "gpu_resource", "results_claim"}
CPU = "cpu"
# A job's timeout is the cell's pytest budget plus this much for checkout and building its environment.
JOB_SETUP_MINUTES = 20


@dataclasses.dataclass(frozen=True, kw_only=True)
class Runner:
    """A GPU type: where its jobs land and how many devices (or CPU ranks) one runner offers."""

    name: str
    labels: tuple[str, ...]
    gpus: int
    nvml_name: str | None = None
    ranks: int = 0
    # A fresh machine or container for every job, nothing kept: only then may a pull request's cell run there.
    ephemeral: bool = False
    engine: str = "local"  # what a cell's hosts are started by: local (this host), slurm, jobset
    hosts: int = 1  # the most hosts one cell may span
    submit: Submit | None = None  # what the engine needs (partition, account, image, ...)

    @property
    def is_cpu(self) -> bool:
        return self.gpus == 0

    @property
    def capacity(self) -> int:
        return self.ranks if self.is_cpu else self.gpus


@dataclasses.dataclass(frozen=True, kw_only=True)
class Submit:
    """How an engine submits a cell (runners.yaml `submit:`); Slurm: partition, account, time, sbatch_args,
    segment; pyxis: container_image; JobSet: image, namespace, gpu_resource, results_claim (a PVC mounted
    where the results folder is, so host 0 writes junit.xml there as on a shared file system)."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None
    sbatch_args: tuple[str, ...] = ()
    segment: int | None = None
    container_image: str | None = None
    image: str | None = None
    namespace: str | None = None
    gpu_resource: str = "nvidia.com/gpu"
    results_claim: str | None = None


def parse_submit(entry: Any, where: str) -> Submit | None:
    """A runner's `submit:` mapping as a `Submit`; None when the runner has none."""
    if entry is None:
        return None
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected a mapping (partition, account, time, sbatch_args, ...)")
    unknown = set(entry) - SUBMIT_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r} (known: {', '.join(sorted(SUBMIT_KEYS))})")
    for key, value in entry.items():
        if key == "sbatch_args":
            if not isinstance(value, list) or not all(isinstance(v, str) and v.startswith("--") for v in value):
                raise ConfigError(f"{where}.sbatch_args: expected a list of --options, got {value!r}")
        elif key == "segment":
            positive_int(value, f"{where}.segment")
        elif not isinstance(value, str) or not value or any(ch.isspace() for ch in value):
            raise ConfigError(f"{where}.{key}: expected a word without spaces, got {value!r}")
    return Submit(**{**entry, "sbatch_args": tuple(entry.get("sbatch_args", ()))})


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cell:
    """One job: a GPU type and count crossed with a torch and a transformers release."""

    gpu: str
    gpus: int
    torch: str
    transformers: str
    matrix: str
    labels: tuple[str, ...]
    timeout_minutes: float  # pytest's budget for the whole cell; the job adds JOB_SETUP_MINUTES
    reruns: int
    suite: tuple[str, ...]
    test_timeout_seconds: int = 600
    # What the cell's environment installs besides the suite's packages (pip arguments, from the project root).
    install: tuple[str, ...] = ()
    hosts: int = 1  # a cell spans `hosts` hosts of `gpus` each: world hosts x gpus
    engine: str = "local"
    submit: Submit | None = None
    cpu_ranks: bool = False  # its runner has no GPUs (a runner type other than `cpu` may be CPU-only too)

    @property
    def is_cpu(self) -> bool:
        return self.gpu == CPU or self.cpu_ranks

    @property
    def world_size(self) -> int:
        return self.hosts * self.gpus

    @property
    def id(self) -> str:
        unit = "rank" if self.is_cpu else "gpu"
        shape = f"{self.hosts}x{self.gpus}" if self.hosts > 1 else f"{self.gpus}"
        return f"{self.gpu}-{shape}{unit}-torch{self.torch}-tf{self.transformers}"

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, **{k: list(v) if isinstance(v, tuple) else v
                                  for k, v in dataclasses.asdict(self).items()}}

    def to_github(self) -> dict[str, Any]:
        """One entry of ``strategy.matrix.include``."""
        return {"id": self.id, "gpu": self.gpu, "gpus": self.gpus, "torch": self.torch,
                "transformers": self.transformers, "matrix": self.matrix, "runs_on": list(self.labels),
                "timeout_minutes": math.ceil(self.timeout_minutes) + JOB_SETUP_MINUTES, "reruns": self.reruns}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Matrix:
    name: str
    path: Path
    description: str
    cells: tuple[Cell, ...]
    project: ProjectRoot  # the cells' suite and install paths are relative to it
    reference: str  # what `--matrix` takes to find this matrix again from the project root

    @property
    def root(self) -> Path:
        return self.project.path
