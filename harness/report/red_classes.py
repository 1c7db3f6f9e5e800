"""Each red of a pull request's run, classified against the baseline (main's last nightly), with the
same rules as nightly triage: `harness.results.triage.triage` says which reds are new and classifies those;
a red it leaves out was already red on the baseline. Each also carries the label its words got ("looks like an
OOM"), shown beside its class. Nothing here is a rule of its own."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from harness.results import CellStatus, Outcome, ResultSet, TestResult
from harness.results.triage import Triage, label_of, triage


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


@dataclass(frozen=True, slots=True)
class ClassifiedRed:
    """A red's class and, beside it, what its words look like (triage.LABELS; None: nothing)."""

    red_class: RedClass
    label: str | None = None


def classify_reds(results: ResultSet, baseline: ResultSet) -> Mapping[RedKey, ClassifiedRed]:
    """Every failing, erroring or flaky test (and every cell that errored without one) of `results`."""
    new = {(red.cell_id, red.test_id): ClassifiedRed(_FROM_TRIAGE[red.triage], red.label)
           for red in triage(results, baseline)}
    classes: dict[RedKey, ClassifiedRed] = {}
    for cell in results.cells:
        reds = [test for test in cell.tests if test.outcome.is_failing or test.outcome is Outcome.FLAKY]
        keys: list[tuple[RedKey, TestResult | None]] = [((cell.id, test.test_id), test) for test in reds]
        if cell.status is CellStatus.ERRORED and not cell.failing_tests:
            keys.append(((cell.id, None), None))
        for key, test in keys:
            classes[key] = new.get(key) or ClassifiedRed(RedClass.ALREADY_RED, label_of(cell, test))
    return classes
