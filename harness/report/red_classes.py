"""Each red of a pull request's run, classified against the baseline (main's last nightly), with the
same rules as nightly triage: `harness.results.triage.triage` says which reds are new and classifies those;
a red it leaves out was already red on the baseline. Nothing here is a rule of its own."""

from __future__ import annotations

import enum
from collections.abc import Mapping

from harness.results import CellStatus, Outcome, ResultSet
from harness.results.triage import Triage, triage


class RedClass(str, enum.Enum):
    NEW = "new"
    ALREADY_RED = "already red on the baseline"
    FLAKY = "flaky"
    KNOWN_UPSTREAM = "known upstream bug"
    INFRASTRUCTURE = "infrastructure"


_FROM_TRIAGE = {
    Triage.REAL: RedClass.NEW,
    Triage.FLAKY: RedClass.FLAKY,
    Triage.KNOWN_UPSTREAM: RedClass.KNOWN_UPSTREAM,
    Triage.INFRASTRUCTURE: RedClass.INFRASTRUCTURE,
}

RedKey = tuple[str, "str | None"]  # (cell id, test id); None: the cell errored without a failing test


def classify_reds(results: ResultSet, baseline: ResultSet) -> Mapping[RedKey, RedClass]:
    """Every failing, erroring or flaky test (and every cell that errored without one) of `results`."""
    new = {(red.cell_id, red.test_id): _FROM_TRIAGE[red.triage] for red in triage(results, baseline)}
    classes: dict[RedKey, RedClass] = {}
    for cell in results.cells:
        reds = [test.test_id for test in cell.tests if test.outcome.is_failing or test.outcome is Outcome.FLAKY]
        if cell.status is CellStatus.ERRORED and not cell.failing_tests:
            reds.append(None)
        for test_id in reds:
            classes[(cell.id, test_id)] = new.get((cell.id, test_id), RedClass.ALREADY_RED)
    return classes
