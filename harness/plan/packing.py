"""Packing: which cells of a runner type that packs (runners.yaml `pack: true`) share one host, and so one job.

Pure: first-fit decreasing by GPU count (CPU ranks for a cpu type) into hosts of the runner's size. A `Pack`'s
id is built here, once, from the runner's name and the pack's place in the order; nothing parses it back: the
workflow hands it to `harness run --job`, which packs the same matrix again and looks the id up.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from harness.errors import ConfigError
from harness.plan.cells import JOB_SETUP_MINUTES, Cell, Runner


@dataclasses.dataclass(frozen=True, kw_only=True)
class Pack:
    """Cells one host runs at once: together they ask for no more than the host's `capacity`."""

    id: str  # the job's name and artifact's suffix: `<runner>-pack<k>`
    runner: str
    capacity: int  # GPUs (CPU ranks for a cpu type) of one host
    cells: tuple[Cell, ...]  # biggest first, as placed

    @property
    def timeout_minutes(self) -> float:
        """The members run at once: the job lasts as long as its longest member."""
        return max(cell.timeout_minutes for cell in self.cells)

    def to_github(self) -> dict[str, Any]:
        """One entry of ``strategy.matrix.include``: the job of every member, `cells` naming them."""
        first = self.cells[0]
        return {"id": self.id, "gpu": self.runner, "gpus": sum(cell.gpus for cell in self.cells),
                "matrix": first.matrix, "runs_on": list(first.labels),
                "timeout_minutes": math.ceil(self.timeout_minutes) + JOB_SETUP_MINUTES,
                "reruns": max(cell.reruns for cell in self.cells), "cells": [cell.id for cell in self.cells]}


Job = Cell | Pack  # what one workflow job runs


def first_fit_decreasing(cells: Sequence[Cell], capacity: int, *, runner: str) -> list[Pack]:
    """Cells into hosts of `capacity`: biggest first (ties keep the given order), each into the first host
    with room for it, else a new one. A cell bigger than a host is an error, as in expansion."""
    bins: list[list[Cell]] = []
    for cell in sorted(cells, key=lambda cell: -cell.gpus):
        if cell.gpus > capacity:
            unit = "CPU ranks" if cell.is_cpu else "GPUs"
            raise ConfigError(f"{cell.id}: needs {cell.gpus} {unit}, one {runner} host has {capacity}")
        room = next((members for members in bins if sum(c.gpus for c in members) + cell.gpus <= capacity), None)
        if room is None:
            bins.append(room := [])
        room.append(cell)
    return [Pack(id=f"{runner}-pack{k}", runner=runner, capacity=capacity, cells=tuple(members))
            for k, members in enumerate(bins, start=1)]


def plan_jobs(cells: Iterable[Cell], runners: Mapping[str, Runner]) -> list[Job]:
    """One job per cell, except that the cells of each runner type that packs share jobs: its packs, where the
    type's first cell stood. Every pack is a job, even a pack of one: its id is what `harness run --job` finds."""
    cells = list(cells)
    packing = {name: runner for name, runner in runners.items() if runner.pack}
    packs = {name: first_fit_decreasing([cell for cell in cells if cell.gpu == name], runner.capacity, runner=name)
             for name, runner in packing.items()}
    jobs: list[Job] = []
    for cell in cells:
        if cell.gpu not in packing:
            jobs.append(cell)
        elif cell.gpu in packs:
            jobs.extend(packs.pop(cell.gpu))
    return jobs


def job_cells(jobs: Iterable[Job], job_id: str, where: str) -> list[Cell]:
    """The cells of the job named `job_id` (a pack's id, or a cell's that is not packed)."""
    for job in jobs:
        if job.id == job_id:
            return list(job.cells) if isinstance(job, Pack) else [job]
    raise ConfigError(f"{where}: no job {job_id!r} (a pack's id from `harness matrix --format github`, "
                      "or an unpacked cell's id)")


def members(jobs: Iterable[Job]) -> dict[str, str]:
    """Each packed cell's id -> its pack's id: whose job and artifact a packed cell's are."""
    return {cell.id: job.id for job in jobs if isinstance(job, Pack) for cell in job.cells}
