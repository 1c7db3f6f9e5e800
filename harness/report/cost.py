"""What a run cost and how long its cells waited, per cell and in all, as PyTorch's HUD counts them: GPU-hours are
the GPUs a cell used x its wall time (env.json's start -> end), its wait the queue time of the job that ran it (the
jobs API's created_at -> started_at, from `RunLinks`).

Every figure comes from untrusted input (a results folder a pull request's code wrote, an API payload): a time that
is missing, malformed, negative or longer than MAX_SPAN_S is unknown, never 0 and never summed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from harness.plan.cells import CPU
from harness.report.links import RunLinks
from harness.results import CellResult
from harness.results.values import LARGEST_WORLD

MAX_SPAN_S = 7 * 24 * 3600  # no job of GitHub Actions runs or waits this long (its limits are 5 days and 24 hours)


@dataclass(frozen=True, slots=True, kw_only=True)
class CellCost:
    cell_id: str
    gpus: int | None  # GPUs it held; 0 for a cpu cell; None: not recorded
    wall_s: float | None  # None: unknown (no end recorded, or not plausible)
    wait_s: float | None  # its job's queue time; None: unknown (no job timings, or not plausible)

    @property
    def gpu_hours(self) -> float | None:
        """A cpu cell costs 0 GPU-hours, a known figure: it sums into the total instead of making it partial, and
        its wall time still shows beside it."""
        if self.gpus is None or self.wall_s is None:
            return None
        return self.gpus * self.wall_s / 3600

    @property
    def timed(self) -> bool:
        return self.gpu_hours is not None and self.wait_s is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCost:
    cells: tuple[CellCost, ...]
    waits_known: bool  # the report had job timings at all (GitHub Actions, with `harness gh run-links`)

    @property
    def gpu_hours(self) -> float:
        """The known cells' sum; `without_gpu_hours` says how many it leaves out."""
        return sum(cost.gpu_hours for cost in self.cells if cost.gpu_hours is not None)

    @property
    def without_gpu_hours(self) -> int:
        return sum(cost.gpu_hours is None for cost in self.cells)

    @property
    def longest_wait_s(self) -> float | None:
        return max((cost.wait_s for cost in self.cells if cost.wait_s is not None), default=None)

    @property
    def without_timings(self) -> int:
        """Cells missing their GPU-hours or, where the report has job timings, their wait."""
        return sum(cost.gpu_hours is None or (self.waits_known and cost.wait_s is None) for cost in self.cells)


def run_cost(cells: Iterable[CellResult], links: RunLinks | None) -> RunCost:
    costs = []
    for cell in cells:
        timing = links.timing(cell.id) if links is not None else None
        costs.append(CellCost(cell_id=cell.id, gpus=_gpus(cell), wall_s=plausible_span(cell.wall_s),
                              wait_s=plausible_span(timing.queued_s) if timing is not None else None))
    return RunCost(cells=tuple(costs), waits_known=links is not None and bool(links.timings))


def plausible_span(seconds: float | None) -> float | None:
    """A recorded duration from 0 to MAX_SPAN_S; anything else (end before start, a year) is unknown."""
    return seconds if seconds is not None and 0 <= seconds <= MAX_SPAN_S else None


def _gpus(cell: CellResult) -> int | None:
    """The GPUs env.json lists; where it lists none, a cpu cell has 0 and a cell an engine ran on other hosts the
    GPUs it asked for (gpus per host x hosts, which its engine gave it); else not known."""
    if cell.recorded_gpus:
        return cell.recorded_gpus
    if cell.info.gpu == CPU:
        return 0
    per_host, hosts = cell.info.gpus, cell.info.hosts or 1
    if per_host is None or not 0 < per_host * hosts <= LARGEST_WORLD:
        return None
    return per_host * hosts
