"""Nightly triage: each new red since the previous night gets a class, and the real failures get a
bisect plan (last night's versions good, tonight's bad) for a job on the same runner shape.

A red is classified by structure: what harness and the suite recorded as data, never a failure's words. Classes:
  flaky               passed on a rerun in the same job (pytest-rerunfailures), or when the bisect ran it again
  known upstream bug  a covered case of the suite's known-bugs table that passed: it failed carrying the table's
                      KNOWN_BUG_FIXED property naming the entries (contract.KNOWN_BUG_FIXED), the release view's
                      "fixed upstream" (results.case_class)
  infrastructure      a typed event of harness's own: env.json's error_kind of the machine or the job (an install
                      failure, busy GPUs, a lost host, an interruption), for the cell or the test it stopped; the
                      ranks fixture's lost host (contract.LAUNCH_FAILED); or, for a crash or hang, the bisect's
                      evidence that the same failure shows on the last good build on the same runner shape
  real failure        anything else; bisected. An OOM under the code under test is a memory regression, a watchdog
                      or gloo timeout a hang of the code under test: real, whatever they say.
A failure's words (its exception and `E` lines, the frames and source lines of any traceback left out) only label a
red: `labels` gives "looks like an OOM" beside the class, as a field of the record, never the class.

Only a real failure is bisected: a case fixed upstream is a known upstream bug, and a case still failing as its
known-bugs entry says (an xfail) or not built (a skip) is never a red. triage.json carries, beside the reds, the
night's release view: the releases new since last night (results.compare.new_releases), tonight's cases by class,
and the cases fixed upstream and not built.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from harness import contract
from harness.results import CellResult, Outcome, ResultSet, TestResult, case_class, natural_key
from harness.results.compare import RELEASE_PACKAGES, new_reds, new_releases
from harness.results.labels import LABELS, failure_text, label_text
from harness.results.nightly_records import (
    BisectJob,
    BisectRecord,
    CaseRecord,
    ReleaseRecord,
    TriageRecord,
    TriageRed,
)

__all__ = ["LABELS", "Red", "Triage", "Verdict", "bisect_plan", "case_records", "classify_cell", "classify_test",
           "failure_text", "label_of", "label_text", "load_bisects", "triage", "triage_record", "with_bisects"]


class Triage(str, enum.Enum):
    KNOWN_UPSTREAM = contract.TRIAGE_KNOWN_UPSTREAM
    FLAKY = contract.TRIAGE_FLAKY
    INFRASTRUCTURE = contract.TRIAGE_INFRASTRUCTURE
    REAL = contract.TRIAGE_REAL


def label_of(cell: CellResult, test: TestResult | None) -> str | None:
    """The label of a red: a failing test's words (failure_text), or an errored cell's reason. A case the known-bugs
    property names as fixed upstream has none: its words are the suite's own XPASS message."""
    if test is not None and test.known_bug_fixed:
        return None
    return label_text(failure_text(test) if test is not None else cell.reason or "")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Red:
    """One new red of tonight: a failing test, or a cell that errored without one."""

    cell_id: str
    test_id: str | None  # None: the cell itself errored
    test_name: str | None
    message: str
    triage: Triage
    cause: str  # why this class: the typed event, the property, or why it is real
    label: str | None = None  # what its words look like (LABELS): shown beside the class, never deciding it
    good: Mapping[str, str] | None = None  # last night's versions, where the test passed
    bad: Mapping[str, str] | None = None  # tonight's
    crash: bool = False  # a typed crash, hang or timeout: infrastructure if the last good build shows it too

    def record(self) -> TriageRed:
        """The red as triage.json has it, before any bisect answered."""
        return TriageRed(cell=self.cell_id, test=self.test_id, name=self.test_name, message=self.message,
                         triage_class=self.triage.value, cause=self.cause, label=self.label,
                         good=dict(self.good) if self.good else None, bad=dict(self.bad) if self.bad else None,
                         crash=self.crash)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A red's class, why (the typed event or property it rests on), and whether it is a typed crash or hang."""

    triage: Triage
    cause: str
    crash: bool = False


CRASH_CAUSE = "a crash or a hang: real unless the last good build shows it too"
NO_EVENT = "no typed infrastructure event"

# An errored cell's typed cause (env.json's error_kind): its verdict. A crash or hang is real (the module's docstring).
CELL_CAUSES = {
    contract.ERROR_ENVIRONMENT: Verdict(Triage.INFRASTRUCTURE, "install failure"),
    contract.ERROR_BUSY_GPUS: Verdict(Triage.INFRASTRUCTURE, "GPUs busy before the cell began"),
    contract.ERROR_INTERRUPTED: Verdict(Triage.INFRASTRUCTURE, "interrupted: the job was cancelled or its runner "
                                        "stopped"),
    contract.ERROR_HOST_LOST: Verdict(Triage.INFRASTRUCTURE, "a host of the cell was lost"),
    contract.ERROR_SIGNALLED_HARNESS: Verdict(Triage.REAL, "the tested code sent harness SIGTERM or SIGINT: not an "
                                              "interruption"),
    contract.ERROR_HARNESS: Verdict(Triage.INFRASTRUCTURE, "harness itself failed"),
    contract.ERROR_PYTEST: Verdict(Triage.REAL, "pytest's internal or usage error, or an exit the tested code chose"),
    contract.ERROR_TIMEOUT: Verdict(Triage.REAL, f"a hang or a timeout: {CRASH_CAUSE}", crash=True),
    contract.ERROR_SIGNAL: Verdict(Triage.REAL, f"pytest killed by a signal: {CRASH_CAUSE}", crash=True),
    contract.ERROR_NO_JUNIT: Verdict(Triage.REAL, f"pytest ended without a junit.xml: {CRASH_CAUSE}", crash=True),
    contract.ERROR_ENGINE: Verdict(Triage.REAL, f"the engine ended the job without a typed cause: {CRASH_CAUSE}",
                                   crash=True),
    contract.ERROR_COLLECTION: Verdict(Triage.REAL, "the suite does not collect"),
    contract.ERROR_NO_TESTS: Verdict(Triage.REAL, "no tests collected"),
}
# No error_kind: harness never finished writing the folder (killed outright), which no typed event explains.
UNTYPED_CELL = Verdict(Triage.REAL, f"no typed cause: the run did not finish writing its folder; {CRASH_CAUSE}",
                       crash=True)
# How the ranks fixture saw a launch fail (contract.LAUNCH_FAILED).
LAUNCH_CAUSES = {
    contract.LAUNCH_HOST_LOST: Verdict(Triage.INFRASTRUCTURE, "a host of the cell was lost during the test"),
    contract.LAUNCH_RANK_DIED: Verdict(Triage.REAL, f"a rank died without a result: {CRASH_CAUSE}", crash=True),
    contract.LAUNCH_TIMED_OUT: Verdict(Triage.REAL, f"ranks still ran at the launch's deadline: {CRASH_CAUSE}",
                                       crash=True),
}


def classify_test(test: TestResult, cell: CellResult | None = None) -> Verdict:
    """A failing or flaky test, from its outcome and typed properties, and (for the test the cell stopped in) its
    cell's error_kind; its words decide nothing."""
    if test.outcome is Outcome.FLAKY:
        return Verdict(Triage.FLAKY, f"passed on attempt {test.attempts}")
    if case_class(test) == contract.CASE_FIXED_UPSTREAM:
        keys = ", ".join(test.known_bug_fixed)
        return Verdict(Triage.KNOWN_UPSTREAM, f"passed though known-bugs entry {keys} covers it: "
                       f"{contract.FIXED_UPSTREAM}")
    if test.launch_failed in LAUNCH_CAUSES:
        return LAUNCH_CAUSES[test.launch_failed]
    if test.stopped and cell is not None:  # the test pytest was running when the cell stopped: the cell's why
        return classify_cell(cell)
    return Verdict(Triage.REAL, NO_EVENT)


def classify_cell(cell: CellResult) -> Verdict:
    """A cell that errored, from env.json's error_kind."""
    return CELL_CAUSES.get(cell.error_kind or "", UNTYPED_CELL)


def versions_of(cell: CellResult) -> dict[str, str]:
    return {"torch": cell.info.torch or "", "transformers": cell.info.transformers or ""}


def triage(tonight: ResultSet, baseline: ResultSet | None) -> list[Red]:
    """Every red of tonight that was not red the night before (`compare.new_reds`, the one rule), classified."""
    reds = []
    for new in new_reds(tonight, baseline):
        cell, before, test = new.cell, new.before, new.test
        if test is None:  # the cell errored without a failing test
            verdict, label = classify_cell(cell), label_of(cell, None)
            good = bad = None
            if verdict.triage is Triage.REAL and before is not None and versions_of(before) != versions_of(cell):
                good, bad = versions_of(before), versions_of(cell)  # a hang or crash is bisected too
            reds.append(Red(cell_id=cell.id, test_id=None, test_name=None, message=cell.reason or "errored",
                            triage=verdict.triage, cause=verdict.cause, label=label, good=good, bad=bad,
                            crash=verdict.crash))
            continue
        verdict = classify_test(test, cell)
        cause, good, bad = verdict.cause, None, None
        if verdict.triage is Triage.REAL:
            # A result the night before (new.was) means a cell the night before.
            if new.was is Outcome.PASSED and before is not None and versions_of(before) != versions_of(cell):
                good, bad = versions_of(before), versions_of(cell)
            elif new.was is Outcome.PASSED:
                cause = f"{cause}; same torch and transformers as the night before: a change in this repository"
            else:
                cause = f"{cause}; no passing result the night before to bisect from"
        reds.append(Red(cell_id=cell.id, test_id=test.test_id, test_name=test.name,
                        message=test.message or test.outcome.value, triage=verdict.triage, cause=cause,
                        label=label_of(cell, test), good=good, bad=bad, crash=verdict.crash))
    return reds


def bisect_plan(
    reds: Iterable[Red], labels: Mapping[str, Sequence[str]], gpu_of: Mapping[str, str]
) -> list[BisectJob]:
    """One bisect job per cell with real failures: `strategy.matrix.include` entries. `labels`: each GPU type's
    runner labels (runners.yaml, which the command reads); `gpu_of`: each cell's GPU type. A red has versions to
    bisect between only where `triage` found it real, so no case fixed upstream, known or not built is planned."""
    # Per cell: its first red, that red's versions, and the tests to bisect.
    jobs: dict[str, tuple[Red, Mapping[str, str], Mapping[str, str], list[str | None]]] = {}
    for red in reds:
        good, bad = red.good, red.bad
        if good is None or bad is None:
            continue
        # None: the whole cell errored (a hang): the bisect runs its suite
        jobs.setdefault(red.cell_id, (red, good, bad, []))[3].append(red.test_id)
    return [
        BisectJob(
            cell=first.cell_id,
            runs_on=list(labels.get(gpu_of[first.cell_id], ())),
            good=",".join(f"{k}={v}" for k, v in sorted(good.items())),
            bad=",".join(f"{k}={v}" for k, v in sorted(bad.items())),
            # A JSON list, never words: a test id may hold spaces (`test[a b]`), and the job reads it NUL-separated.
            tests=json.dumps([] if None in tests else tests),
        )
        for first, good, bad, tests in jobs.values()
    ]


def with_bisects(reds: Sequence[Red], bisects: Mapping[str, BisectRecord]) -> list[TriageRed]:
    """Each red as triage.json has it, with its cell's bisect answer. The bisect ran on the red's runner shape: its bad
    end passing again means the red did not reproduce (flaky); its good end failing the same way (the same test, or
    the whole cell for a red without one) makes a typed crash or hang the machine's (infrastructure)."""
    rows = []
    for red in reds:
        row = red.record()
        answer = bisects.get(red.cell_id) if red.good else None
        if answer is not None:
            row = dataclasses.replace(row, bisect=answer.said())
            if answer.same_verdict == contract.VERDICT_PASS:
                row = dataclasses.replace(row, triage_class=Triage.FLAKY.value,
                                          cause="passed when the bisect job ran it again")
            elif answer.same_verdict == contract.VERDICT_FAIL and red.crash and _fails_at_good(red, answer):
                row = dataclasses.replace(row, triage_class=Triage.INFRASTRUCTURE.value,
                                          cause="the same crash or hang on the last good build, same runner shape")
        rows.append(row)
    return rows


def _fails_at_good(red: Red, answer: BisectRecord) -> bool:
    """The bisect's good end failed as this red did: the same test among those failing there (BisectRecord's typed
    list), or, for a cell that errored without a failing test, the good end of its whole suite failing too."""
    return red.test_id is None or red.test_id in answer.failing_at_good


def triage_record(tonight: ResultSet, baseline: ResultSet | None, reds: Sequence[Red],
                  bisects: Mapping[str, BisectRecord], plan: list[BisectJob]) -> TriageRecord:
    """triage.json: the night's release view, its new reds with their bisects' answers, and the bisect plan."""
    return TriageRecord(
        releases=[ReleaseRecord(package=change.package, before=list(change.before), after=list(change.after))
                  for change in new_releases(tonight, baseline)],
        cases=tonight.case_counts,
        reds=with_bisects(reds, bisects),
        fixed_upstream=case_records(tonight, contract.CASE_FIXED_UPSTREAM),
        not_built=case_records(tonight, contract.CASE_NOT_BUILT),
        bisect=plan,
    )


def case_records(tonight: ResultSet, case: str) -> list[CaseRecord]:
    """Tonight's cases of one class (contract.CASE_*), cell by cell in id order, each with the releases it ran on: a
    fixed-upstream case names the entries to close, a not-built one why it was not built."""
    rows: list[CaseRecord] = []
    for cell in sorted(tonight.cells, key=lambda found: natural_key(found.id)):
        versions = {package: release for package in RELEASE_PACKAGES if (release := cell.installed(package))}
        rows.extend(
            CaseRecord(cell=cell.id, test=test.test_id, versions=versions,
                       keys=list(test.known_bug_fixed) if case == contract.CASE_FIXED_UPSTREAM else [],
                       reason=test.not_built if case == contract.CASE_NOT_BUILT else None)
            for test in cell.tests if case_class(test) == case
        )
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
