"""`harness bisect`: which upstream, and which release (or commit) of it, turned a selection of tests
from passing to failing (a regression) or from failing to passing (a fix).

The search is pure: `bisect(...)` takes the ordered versions and a `probe` callable that runs the
selection on one version and returns its `Probe`. The real probe (`CellProber`) runs one cell shape
through `run.run_cell`, so each version gets the cached per-cell environment (built once, reused by
later bisects and runs) and leaves its own results folder.

A version's verdict: pass (every selected test that ran passed), fail (any failed), untestable (all
skipped, or it cannot be installed: skipped over, and said), flaky (outcomes differ across runs:
the search stops rather than guess).

Verdicts are per test once the ends have run: the good end runs first, and the tests failing there
too are set aside and named (with `--runxfail`, a known upstream bug fails at both ends); a selection
that fails entirely at the good end stops after that one probe. The search then follows the tests
that fail at the bad end and not at the good one, so without `-k` it bisects exactly those.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from harness.contract import VERDICT_FAIL, VERDICT_FLAKY, VERDICT_PASS, VERDICT_UNTESTABLE
from harness.errors import ConfigError
from harness.results.nightly_records import BisectProbeRecord, BisectRecord

PACKAGES = ("torch", "transformers")
NOTE_CHARS = 140  # of a probe line's note in the terminal


class SameVerdictError(ConfigError):
    """Good and bad agree, so there is nothing to search; in the nightly, a bad end that passes again
    means the red did not reproduce."""

    def __init__(self, good: Probe, bad: Probe | None) -> None:
        note = f" ({good.note})" if good.note else ""
        if bad is None:  # found at the good end alone: the bad end was never run
            failing = ", ".join(failing_tests(good)[:10])
            message = (f"the good end fails: every selected test that ran fails at {good.label}"
                       f"{f' ({failing})' if failing else ''}{note}; deselect them, pick another --good, "
                       "or swap --good and --bad if they are the wrong way round")
        else:
            message = (f"good and bad give the same verdict: {good.label} and {bad.label} both "
                       f"{good.verdict.value}{note}")
        super().__init__(message)
        self.verdict = good.verdict
        self.failing_at_good = failing_tests(good)  # triage's evidence that a crash shows on the last good build


class Verdict(str, enum.Enum):
    PASS = VERDICT_PASS
    FAIL = VERDICT_FAIL
    UNTESTABLE = VERDICT_UNTESTABLE
    FLAKY = VERDICT_FLAKY


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunOutcome:
    """What one pytest run of the selection said, reduced to what a verdict needs."""

    outcomes: Mapping[str, str]  # test name -> passed | failed | skipped | flaky
    failure: tuple[str, str] | None = None  # (test name, first line) of the first failing test
    skip_reason: str | None = None  # first skip reason, for 'all skipped'
    error: str | None = None  # the cell broke without failing tests (crash, hang): a red of its own
    install_error: str | None = None  # the version could not be installed
    nothing_selected: bool = False  # pytest collected no tests


@dataclasses.dataclass(frozen=True, kw_only=True)
class Probe:
    versions: Mapping[str, str]  # package -> version this probe ran
    label: str  # "transformers 5.20.0", or "torch 2.13.0 + transformers 5.20.0" when both vary
    verdict: Verdict
    note: str | None = None  # the failing test and its first line, or why untestable / flaky
    failure: tuple[str, str] | None = None
    nothing_selected: bool = False
    outcomes: Mapping[str, str] = dataclasses.field(default_factory=dict)  # test -> passed | failed | skipped
    duration_s: float = 0.0
    environments_built: int = 0
    folders: tuple[str, ...] = ()

    def line(self, width: int = NOTE_CHARS) -> str:
        """One terminal line; the note is cut (the --json output and the probe's folder keep it whole)."""
        note = self.note or ""
        note = note if len(note) <= width else note[: width - 1] + "…"
        return f"  {self.label:<34} {self.verdict.value:<10} {self.duration_s:7.1f}s  {note}".rstrip()

    def record(self) -> BisectProbeRecord:
        return BisectProbeRecord(
            versions=dict(self.versions),
            label=self.label,
            verdict=self.verdict.value,
            note=self.note,
            failure=list(self.failure) if self.failure else None,
            duration_s=round(self.duration_s, 3),
            environments_built=self.environments_built,
            folders=list(self.folders),
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class BisectResult:
    """The search's answer: a boundary (first and last versions on either side), or why there is none."""

    package: str
    kind: str  # regression | fix
    versions: tuple[str, ...]  # the range searched, oldest first
    probes: tuple[Probe, ...]
    first: str | None = None  # first bad (regression) or first good (fix)
    last: str | None = None  # the version before it: last good or last bad
    test: str | None = None
    message: str | None = None
    stopped: str | None = None  # why no boundary: flaky, or untestable versions hide it
    culprit_note: str | None = None  # with both packages different: which swap said which upstream
    set_aside: tuple[str, ...] = ()  # tests failing at both ends: not what changed, left out of the search

    @property
    def found(self) -> bool:
        return self.first is not None and self.stopped is None

    @property
    def exit_code(self) -> int:
        return 0 if self.found else 1

    def line(self) -> str:
        if not self.found:
            return f"no boundary: {self.stopped}"
        first_word, other = ("first bad", "last good") if self.kind == "regression" else ("first good", "last bad")
        text = f"{first_word}: {self.package} {self.first} ({other} {self.last})"
        if self.test:
            text += f" · {self.test}"
        if self.message:
            text += f" · {self.message}"
        return text

    def set_aside_line(self) -> str | None:
        if not self.set_aside:
            return None
        shown = ", ".join(self.set_aside[:10]) + (f" and {len(self.set_aside) - 10} more" if len(self.set_aside) > 10
                                                  else "")
        return f"set aside, failing at both ends: {shown}"

    def summary(self, seconds: float) -> str:
        built = sum(probe.environments_built for probe in self.probes)
        return f"{len(self.probes)} probes, {built} environment{'' if built == 1 else 's'} built, {seconds:.1f}s"

    def record(self, seconds: float, *, cell: str, pytest_args: Sequence[str] = ()) -> BisectRecord:
        """bisect.json of this answer, for `cell` run with `pytest_args`."""
        return BisectRecord(
            cell=cell,
            pytest_args=list(pytest_args),
            package=self.package,
            kind=self.kind,
            versions=list(self.versions),
            found=self.found,
            first=self.first,
            last=self.last,
            test=self.test,
            message=self.message,
            stopped=self.stopped,
            culprit=self.culprit_note,
            set_aside=list(self.set_aside),
            line=self.line(),
            exit_code=self.exit_code,
            duration_s=round(seconds, 3),
            environments_built=sum(p.environments_built for p in self.probes),
            probes=[probe.record() for probe in self.probes],
        )


# --------------------------------------------------------------------------- verdicts


def verdict_of(runs: Sequence[RunOutcome]) -> tuple[Verdict, str | None, tuple[str, str] | None]:
    """(verdict, note, failure) of one version from its runs."""
    for run in runs:
        if run.install_error:
            return Verdict.UNTESTABLE, f"cannot install: {run.install_error}", None
        if run.nothing_selected:
            return Verdict.UNTESTABLE, "nothing selected: pytest collected no tests", None
    flaky = sorted(name for run in runs for name, outcome in run.outcomes.items() if outcome == "flaky")
    if flaky:
        return Verdict.FLAKY, f"{flaky[0]} failed, then passed on a rerun", None
    first = runs[0]
    for index, run in enumerate(runs[1:], start=2):
        differing = sorted(
            name
            for name in set(first.outcomes) | set(run.outcomes)
            if first.outcomes.get(name) != run.outcomes.get(name)
        )
        if differing or bool(first.error) != bool(run.error):
            name = differing[0] if differing else "the cell"
            said = (
                (first.outcomes.get(name, "errored"), run.outcomes.get(name, "errored"))
                if differing
                else ("errored" if first.error else "ran", "errored" if run.error else "ran")
            )
            return Verdict.FLAKY, f"{name}: {said[0]} in run 1, {said[1]} in run {index}", None
    if first.failure:
        return Verdict.FAIL, f"{first.failure[0]} · {first.failure[1]}", first.failure
    if first.error:
        return Verdict.FAIL, first.error, ("(cell)", first.error)
    ran = [name for name, outcome in first.outcomes.items() if outcome != "skipped"]
    if not ran:
        count = len(first.outcomes)
        return Verdict.UNTESTABLE, f"all {count} selected tests skipped: {first.skip_reason or 'no reason'}", None
    return Verdict.PASS, f"{len(ran)} passed", None


# --------------------------------------------------------------------------- the search


def bisect(
    package: str,
    versions: Sequence[str],
    *,
    good: str,
    bad: str,
    probe: Callable[[str], Probe],
    emit: Callable[[Probe], None] = lambda probe: None,
    narrow: Callable[[Sequence[str]], None] | None = None,
) -> BisectResult:
    """Binary search over `versions` (oldest first, `good` and `bad` at either end) for where the
    selection's verdict changes. Raises ConfigError when the ends do not disagree as claimed.
    `narrow(tests)`, once the ends have run, limits the later probes to the tests the search follows."""
    if good == bad:
        raise ConfigError(f"--good and --bad are both {package} {good}")
    if {good, bad} != {versions[0], versions[-1]}:
        raise AssertionError("good and bad must be the ends of the range")
    kind = "regression" if versions[0] == good else "fix"
    probes: list[Probe] = []
    seen: dict[int, Probe] = {}

    def run(index: int) -> Probe:
        if index not in seen:
            seen[index] = probe(versions[index])
            probes.append(seen[index])
            emit(seen[index])
        return seen[index]

    def stop(why: str) -> BisectResult:
        return BisectResult(package=package, kind=kind, versions=tuple(versions), probes=tuple(probes), stopped=why)

    # The ends first, the good one first: each must give its claimed verdict. An untestable end (below a
    # floor, not installable) is skipped over inward until a version can say.
    ends = {}
    set_aside: tuple[str, ...] = ()
    for name, version in (("good", good), ("bad", bad)):
        start = versions.index(version)
        index, step = start, 1 if start == 0 else -1
        while True:
            result = run(index)
            if result.nothing_selected and index == start:
                raise ConfigError(
                    f"nothing selected: pytest collected no tests on {result.label}; check the -k "
                    "expression or test ids after --"
                )
            if result.verdict is Verdict.FLAKY:
                return stop(f"{result.label} is flaky ({result.note}); fix or deselect the flaky test first")
            if result.verdict is not Verdict.UNTESTABLE:
                break
            index += step
            if index in seen or index == len(versions) - 1 - start:  # reached the other end
                raise ConfigError(
                    f"--{name} {version}: no version from it towards the other end "
                    "can run the selection (all untestable)"
                )
        ends[name] = index, result
        if name == "good" and result.verdict is Verdict.FAIL:
            set_aside = failing_tests(result)
            ran = [test for test, outcome in result.outcomes.items() if outcome != "skipped"]
            if not set_aside or set(set_aside) >= set(ran):
                raise SameVerdictError(result, None)  # one probe: the selection fails at the good end as a whole
    (good_index, good_probe), (bad_index, bad_probe) = ends["good"], ends["bad"]
    tracked = tuple(test for test in failing_tests(bad_probe) if test not in set_aside)
    if set_aside and not tracked:
        raise ConfigError(f"every test failing at {bad_probe.label} fails at {good_probe.label} too "
                          f"({', '.join(set_aside[:10])}): nothing changed between them")

    def verdict(probe: Probe) -> Verdict:
        return verdict_for(probe, tracked) if set_aside else probe.verdict

    if verdict(good_probe) is verdict(bad_probe):
        raise SameVerdictError(good_probe, bad_probe)
    if verdict(good_probe) is not Verdict.PASS:
        raise ConfigError(f"--good {good_probe.label} fails and --bad {bad_probe.label} passes; swap them")
    if narrow is not None and tracked and len(tracked) < len(bad_probe.outcomes):
        narrow(tracked)  # the other tests cannot move the boundary: later probes run only these

    low, high = sorted((good_index, bad_index))
    untestable: set[int] = set()
    while True:
        candidates = [i for i in range(low + 1, high) if i not in untestable]
        if not candidates:
            break
        middle = (low + high) / 2
        index = min(candidates, key=lambda i: (abs(i - middle), i))
        result = run(index)
        if result.verdict is Verdict.FLAKY:
            return stop(f"{result.label} is flaky ({result.note}); stopped rather than guess")
        if verdict(result) is Verdict.UNTESTABLE:
            untestable.add(index)
        elif verdict(result) is verdict(seen[low]):
            low = index
        else:
            high = index
    if high - low > 1:
        hidden = ", ".join(versions[i] for i in range(low + 1, high))
        return dataclasses.replace(stop(
            f"the change lies between {package} {versions[low]} and {versions[high]}, and {hidden} cannot be tested"
        ), set_aside=set_aside)
    failing = seen[high] if kind == "regression" else seen[low]
    test, message = failing.failure or (None, None)
    if set_aside and test is not None and test in set_aside:  # the first failure is one set aside: name a tracked one
        test, message = next(t for t in failing_tests(failing) if t in tracked), None
    return BisectResult(
        package=package,
        kind=kind,
        versions=tuple(versions),
        probes=tuple(probes),
        first=versions[high],
        last=versions[low],
        test=test,
        message=message,
        set_aside=set_aside,
    )


def failing_tests(probe: Probe) -> tuple[str, ...]:
    return tuple(sorted(test for test, outcome in probe.outcomes.items() if outcome == "failed"))


def verdict_for(probe: Probe, tracked: Sequence[str]) -> Verdict:
    """A probe's verdict over the tracked tests only (those failing at the bad end, not at the good one)."""
    if probe.verdict in (Verdict.FLAKY, Verdict.UNTESTABLE) or not probe.outcomes:
        return probe.verdict  # no per-test answer: a crash, an install failure
    outcomes = [probe.outcomes.get(test) for test in tracked]
    if "failed" in outcomes:
        return Verdict.FAIL
    return Verdict.PASS if "passed" in outcomes else Verdict.UNTESTABLE


def write_json(path: str | Path, record: BisectRecord) -> None:
    Path(path).write_text(json.dumps(record.to_json(), indent=2) + "\n")


def timed() -> Callable[[], float]:
    started = time.monotonic()
    return lambda: time.monotonic() - started
