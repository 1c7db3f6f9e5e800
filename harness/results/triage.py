"""Nightly triage: each new red since the previous night gets a class, and the real failures get a
bisect plan (last night's versions good, tonight's bad) for a job on the same runner shape.

A red is classified from what it is, never from a test's source: a failing test from its exception and
the `E` lines of its failure (the frames and source lines of any traceback among them left out), an
errored cell from env.json's typed `error_kind`. Classes, first match wins:
  known upstream bug  a strict xfail of the known-bugs table that passed ("fixed upstream"), or a
                      failure that says it is one
  flaky               passed on a rerun in the same job (pytest-rerunfailures, or the bisect's rerun)
  infrastructure      the machine, not the code: one of INFRASTRUCTURE's patterns, or a cell's error kind
                      that is the machine's (install, busy GPUs, an interrupt)
  real failure        anything else; bisected. A crash (a signal, a device assert, an illegal memory access:
                      how an indexing bug upstream shows on CUDA), a hang or a timeout is real, and becomes
                      infrastructure only when the bisect finds it on the last good build too.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from harness import contract
from harness.results import CellResult, Outcome, ResultSet, TestResult
from harness.results.compare import new_reds
from harness.results.nightly_records import BisectJob, BisectRecord, TriageRed


class Triage(str, enum.Enum):
    KNOWN_UPSTREAM = contract.TRIAGE_KNOWN_UPSTREAM
    FLAKY = contract.TRIAGE_FLAKY
    INFRASTRUCTURE = contract.TRIAGE_INFRASTRUCTURE
    REAL = contract.TRIAGE_REAL


@dataclasses.dataclass(frozen=True)
class Pattern:
    name: str
    regex: re.Pattern


def _pattern(name: str, *alternatives: str) -> Pattern:
    return Pattern(name, re.compile("|".join(f"(?:{a})" for a in alternatives), re.M))


# The suite's known-bugs table writes these (tests/gpu/known_bugs.py): a strict xfail's reason, and its XPASS.
KNOWN_UPSTREAM = _pattern(
    Triage.KNOWN_UPSTREAM.value, re.escape(contract.KNOWN_BUG_PREFIX), re.escape(contract.FIXED_UPSTREAM)
)

# A crash: real (an upstream bug can show so), unless the last good build crashes too. Tested in test_triage.py.
CRASH = _pattern(
    "a crash or a device assert",
    r"\b(?:killed|exited) by signal SIG[A-Z]+",  # the rank launchers
    r"exited with (?:exit)?code -\d+\b",
    r"Signal \d+ \(SIG[A-Z]+\) received",
    r"device-side assert triggered",
    r"an illegal memory access was encountered",
)
CRASH_CAUSE = "a crash or a device assert: real unless the last good build shows it too"

# What a broken machine, network or runner says. One row per cause; each has a test in test_triage.py.
INFRASTRUCTURE = (
    _pattern(
        "NCCL or gloo timeout",
        r"Watchdog caught collective operation timeout",
        r"\b(?:NCCL|[Gg]loo)\b[^\n]*\b(?:[Tt]imed out|[Tt]imeout)\b",
        r"DistStoreError: [^\n]*[Tt]imed out",
    ),
    _pattern(
        "communicator error",
        r"\bNCCL error\b",
        r"\bnccl(?:Internal|UnhandledCuda|System|Remote|Invalid\w*)Error\b",
        r"NCCL communicator was aborted",
        r"\bgloo\b[^\n]*(?:Connection (?:reset|closed) by peer|Read error)",
        r"\[enforce fail at [^\]]*gloo",
    ),
    _pattern(
        "CUDA error",
        r"\bCUDA error\b",
        r"\bcudaError\w+",
        r"\bCUBLAS_STATUS_\w+",
        r"\bCUDNN_STATUS_\w+",
    ),
    _pattern("out of memory", r"CUDA out of memory", r"\bOutOfMemoryError\b", r"\bout of memory\b"),
    _pattern(
        "install failure",
        r"No matching distribution found",
        r"ResolutionImpossible",
        r"Failed to (?:download|build|prepare distributions)",
    ),
    _pattern(
        "runner lost",
        r"runner has received a shutdown signal",
        r"lost communication with the server",
        r"The self-hosted runner: .* lost",
    ),
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Red:
    """One new red of tonight: a failing test, or a cell that errored without one."""

    cell_id: str
    test_id: str | None  # None: the cell itself errored
    test_name: str | None
    message: str
    triage: Triage
    cause: str  # the matching pattern, or why it is real
    good: Mapping[str, str] | None = None  # last night's versions, where the test passed
    bad: Mapping[str, str] | None = None  # tonight's
    crash: bool = False  # a crash, hang or timeout: infrastructure if the last good build shows it too

    def record(self) -> TriageRed:
        """The red as triage.json has it, before any bisect answered."""
        return TriageRed(cell=self.cell_id, test=self.test_id, name=self.test_name, message=self.message,
                         triage_class=self.triage.value, cause=self.cause, good=dict(self.good) if self.good else None,
                         bad=dict(self.bad) if self.bad else None, crash=self.crash)


def classify_text(text: str) -> tuple[Triage, str] | None:
    """The class a failure's own words say it is, or None when nothing matches (a real failure). `text` is
    what failure_text gives: the exception and the E lines, never source."""
    if KNOWN_UPSTREAM.regex.search(text):
        return Triage.KNOWN_UPSTREAM, KNOWN_UPSTREAM.name
    if CRASH.regex.search(text):
        return Triage.REAL, CRASH_CAUSE
    for pattern in INFRASTRUCTURE:
        if pattern.regex.search(text):
            return Triage.INFRASTRUCTURE, pattern.name
    return None


_E_LINE = re.compile(r"^E(?:\s+|$)")
_FRAME = re.compile(r'^\s*File "[^"]*", line \d+')
_MARKERS = re.compile(r"^[\s^~]+$")  # the carets under a traceback's source line


def failure_text(test: TestResult) -> str:
    """What a failure says: its message (the exception) and the E lines of its excerpt, leaving out the test's
    source (every line pytest does not mark E) and, inside a traceback among the E lines (a rank's), each
    frame's line and the source line under it."""
    lines = [test.message or ""]
    after_frame = False
    for line in (test.excerpt or "").splitlines():
        if not _E_LINE.match(line):
            continue
        said = _E_LINE.sub("", line, count=1)
        if _FRAME.match(said):
            after_frame = True
            continue
        if after_frame or _MARKERS.match(said or " "):
            after_frame = False
            continue
        lines.append(said)
    return "\n".join(lines)


def classify_test(test: TestResult) -> tuple[Triage, str]:
    if test.outcome is Outcome.FLAKY:
        return Triage.FLAKY, f"passed on attempt {test.attempts}"
    return classify_text(failure_text(test)) or (Triage.REAL, "no infrastructure pattern matched")


# An errored cell's typed cause: its class and cause. A crash or hang is real (see the module's docstring).
CELL_CAUSES = {
    contract.ERROR_ENVIRONMENT: (Triage.INFRASTRUCTURE, "install failure"),
    contract.ERROR_BUSY_GPUS: (Triage.INFRASTRUCTURE, "GPUs busy before the cell began"),
    contract.ERROR_INTERRUPTED: (Triage.INFRASTRUCTURE, "interrupted: the job was cancelled or its runner stopped"),
    contract.ERROR_HARNESS: (Triage.INFRASTRUCTURE, "harness itself failed"),
    contract.ERROR_PYTEST: (Triage.INFRASTRUCTURE, "pytest's internal or usage error"),
    contract.ERROR_TIMEOUT: (Triage.REAL, "a hang or a timeout: real unless the last good build shows it too"),
    contract.ERROR_SIGNAL: (Triage.REAL, CRASH_CAUSE),
    contract.ERROR_NO_JUNIT: (Triage.REAL, "pytest ended without a junit.xml"),
    contract.ERROR_COLLECTION: (Triage.REAL, "the suite does not collect"),
    contract.ERROR_NO_TESTS: (Triage.REAL, "no tests collected"),
}
CRASH_KINDS = (contract.ERROR_TIMEOUT, contract.ERROR_SIGNAL, contract.ERROR_NO_JUNIT)


def classify_cell(cell: CellResult) -> tuple[Triage, str]:
    """A cell that errored without a failing test, from env.json's error_kind."""
    if cell.error_kind in CELL_CAUSES:
        return CELL_CAUSES[cell.error_kind]
    return Triage.INFRASTRUCTURE, "no typed cause: the run did not finish writing its folder (a lost runner)"


def versions_of(cell: CellResult) -> dict[str, str]:
    return {"torch": cell.info.torch or "", "transformers": cell.info.transformers or ""}


def triage(tonight: ResultSet, baseline: ResultSet | None) -> list[Red]:
    """Every red of tonight that was not red the night before (`compare.new_reds`, the one rule), classified."""
    reds = []
    for new in new_reds(tonight, baseline):
        cell, before, test = new.cell, new.before, new.test
        if test is None:  # the cell errored without a failing test
            triage_class, cause = classify_cell(cell)
            good = bad = None
            if triage_class is Triage.REAL and before is not None and versions_of(before) != versions_of(cell):
                good, bad = versions_of(before), versions_of(cell)  # a hang or crash is bisected too
            reds.append(
                Red(
                    cell_id=cell.id,
                    test_id=None,
                    test_name=None,
                    message=cell.reason or "errored",
                    triage=triage_class,
                    cause=cause,
                    good=good,
                    bad=bad,
                    crash=cell.error_kind in CRASH_KINDS,
                )
            )
            continue
        triage_class, cause = classify_test(test)
        good = bad = None
        if triage_class is Triage.REAL:
            if new.was is Outcome.PASSED and versions_of(before) != versions_of(cell):
                good, bad = versions_of(before), versions_of(cell)
            elif new.was is Outcome.PASSED:
                cause = "same torch and transformers as the night before: a change in this repository"
            else:
                cause = "no passing result the night before to bisect from"
        reds.append(
            Red(
                cell_id=cell.id,
                test_id=test.test_id,
                test_name=test.name,
                message=test.message or test.outcome.value,
                triage=triage_class,
                cause=cause,
                good=good,
                bad=bad,
                crash=cause == CRASH_CAUSE,
            )
        )
    return reds


def bisect_plan(
    reds: Iterable[Red], labels: Mapping[str, Sequence[str]], gpu_of: Mapping[str, str]
) -> list[BisectJob]:
    """One bisect job per cell with real failures: `strategy.matrix.include` entries. `labels`: each GPU type's
    runner labels (runners.yaml, which the command reads); `gpu_of`: each cell's GPU type."""
    jobs: dict[str, tuple[Red, list[str | None]]] = {}
    for red in reds:
        if red.good is None or red.bad is None:
            continue
        # None: the whole cell errored (a hang): the bisect runs its suite
        jobs.setdefault(red.cell_id, (red, []))[1].append(red.test_id)
    return [
        BisectJob(
            cell=first.cell_id,
            runs_on=list(labels.get(gpu_of[first.cell_id], ())),
            good=",".join(f"{k}={v}" for k, v in sorted(first.good.items())),
            bad=",".join(f"{k}={v}" for k, v in sorted(first.bad.items())),
            # A JSON list, never words: a test id may hold spaces (`test[a b]`), and the job reads it NUL-separated.
            tests=json.dumps([] if None in tests else tests),
        )
        for first, tests in jobs.values()
    ]


def with_bisects(reds: Sequence[Red], bisects: Mapping[str, BisectRecord]) -> list[TriageRed]:
    """Each red as triage.json has it, with its cell's bisect answer; a bisect whose bad end passed again means the
    red did not reproduce on the same runner shape: flaky."""
    rows = []
    for red in reds:
        row = red.record()
        answer = bisects.get(red.cell_id) if red.good else None
        if answer is not None:
            row = dataclasses.replace(row, bisect=answer.said())
            if answer.same_verdict == contract.VERDICT_PASS:
                row = dataclasses.replace(row, triage_class=Triage.FLAKY.value,
                                          cause="passed when the bisect job ran it again")
            elif answer.same_verdict == contract.VERDICT_FAIL and red.crash:
                row = dataclasses.replace(row, triage_class=Triage.INFRASTRUCTURE.value,
                                          cause="crashes on the last good build too")
        rows.append(row)
    return rows


def load_bisects(folder: str | Path | None) -> dict[str, BisectRecord]:
    """The bisect jobs' --json files, by cell id; a missing or broken file is a bisect that said nothing."""
    found: dict[str, BisectRecord] = {}
    for path in sorted(Path(folder).rglob(contract.BISECT_JSON_GLOB)) if folder and Path(folder).is_dir() else []:
        try:
            record = BisectRecord.from_json(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, RecursionError):
            continue
        found[record.cell] = record
    return found
