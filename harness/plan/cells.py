"""The plan's values: a runner type (`Runner`) and what it hands its engine (`SubmitOptions`, runners.yaml's
`submit:` as written: each engine parses its own settings type from it), one job (`Cell`) and a loaded
matrix (`Matrix`), with the constants they name.

Frozen dataclasses that every stage after the plan reads; nothing here reads a file."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from harness.project import ProjectRoot

AXES = ("gpu", "gpus", "torch", "transformers")
# Axes a matrix may leave out, and the value a cell then has: `hosts` makes a cell H hosts x `gpus` each.
OPTIONAL_AXES = {"hosts": 1}
ENGINES = ("local", "slurm", "jobset")
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
    submit: SubmitOptions | None = None  # what the engine needs (partition, account, image, ...)
    # One host runs several of its cells at once, each on GPUs (or CPU ranks) of its own: harness.plan.packing.
    pack: bool = False

    @property
    def is_cpu(self) -> bool:
        return self.gpus == 0

    @property
    def capacity(self) -> int:
        return self.ranks if self.is_cpu else self.gpus


@dataclasses.dataclass(frozen=True, kw_only=True)
class SubmitOptions:
    """runners.yaml's `submit:` of one runner, as written: words, numbers and lists of words. The plan checks
    only that shape; the runner's engine reads its own settings from it (harness.engines: SlurmSettings,
    JobSetSettings) and names `where` (the file and key) when a setting is wrong."""

    where: str
    items: tuple[tuple[str, str | int | tuple[str, ...]], ...]

    def as_dict(self) -> dict[str, str | int | tuple[str, ...]]:
        return dict(self.items)


def parse_submit(entry: Any, where: str) -> SubmitOptions | None:
    """A runner's `submit:` mapping as `SubmitOptions`; None when the runner has none."""
    if entry is None:
        return None
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected a mapping of settings for the runner's engine")
    items = []
    for key, value in entry.items():
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = tuple(value)
        elif isinstance(value, bool) or not isinstance(value, (str, int)):
            raise ConfigError(f"{where}.{key}: expected a word, a number or a list of words, got {value!r}")
        items.append((str(key), value))
    return SubmitOptions(where=where, items=tuple(items))


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
    # A pytest marker expression choosing the suite's cases (`-m`, in place of the project's default selection);
    # None: the project's own (pyproject's addopts)
    markers: str | None = None
    # What the cell's environment installs besides the suite's packages (pip arguments, from the project root).
    install: tuple[str, ...] = ()
    hosts: int = 1  # a cell spans `hosts` hosts of `gpus` each: world hosts x gpus
    engine: str = "local"
    submit: SubmitOptions | None = None
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
        fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        fields["submit"] = None if self.submit is None else {k: list(v) if isinstance(v, tuple) else v
                                                             for k, v in self.submit.items}
        return {"id": self.id, **{k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}}

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
