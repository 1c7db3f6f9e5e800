"""Which runners a pull request's cell may run on.

A pull request's code runs as the runner's user, so it can write anything that user can: on a runner that
persists between jobs, that includes the cached environments (and uv's cache) that later trusted runs
import from. No check inside that user can tell an honest file from a planted one that came with a
re-recorded manifest. So the rule is structural: a pull request's cell runs only on a runner type that
runners.yaml declares `ephemeral: true` (a fresh machine or container for every job, nothing kept), and
`harness matrix --pull-request` refuses a plan that would put one anywhere else.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from harness.errors import ConfigError
from harness.plan.cells import Cell, Runner


def refuse_persistent_runners(cells: Iterable[Cell], runners: Mapping[str, Runner], source: str) -> None:
    """ConfigError naming the first GPU type of `cells` whose runners persist between jobs."""
    for gpu in dict.fromkeys(cell.gpu for cell in cells):
        runner = runners.get(gpu)
        if runner is None or not runner.ephemeral:
            raise ConfigError(
                f"{source}: gpu {gpu!r}: runners.yaml does not declare its runners ephemeral: true, so a pull "
                "request's cell there could leave code in the environments that later trusted runs use; "
                "declare ephemeral: true only for runners that start fresh for every job")
