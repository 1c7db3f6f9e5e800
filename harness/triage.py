"""Nightly triage: each new red since the previous night gets a class, and the real failures get a
bisect plan (last night's versions good, tonight's bad) for a job on the same runner shape.

Classes, first match wins:
  known upstream bug  a strict xfail of the known-bugs table that passed ("fixed upstream"), or a
                      failure that says it is one
  flaky               passed on a rerun in the same job (pytest-rerunfailures, or the bisect's rerun)
  infrastructure      the machine, not the code: one of INFRASTRUCTURE's patterns
  real failure        anything else; bisected
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from harness.results import CellResult, CellStatus, Outcome, ResultSet, TestResult, natural_key


class Triage(str, enum.Enum):
    KNOWN_UPSTREAM = "known upstream bug"
    FLAKY = "flaky"
    INFRASTRUCTURE = "infrastructure"
    REAL = "real failure"


@dataclasses.dataclass(frozen=True)
class Pattern:
    name: str
    regex: re.Pattern


def _pattern(name: str, *alternatives: str) -> Pattern:
    return Pattern(name, re.compile("|".join(f"(?:{a})" for a in alternatives), re.M))


KNOWN_UPSTREAM = _pattern("known upstream bug", r"known upstream bug: ", r"fixed upstream")

# What a broken machine, network or runner says. One row per cause; each has a test in test_triage.py.
INFRASTRUCTURE = (
    _pattern(
        "rank killed by a signal",
        r"\b(?:killed|exited) by signal SIG[A-Z]+",  # run.py (pytest itself) and the rank launchers
        r"exited with (?:exit)?code -\d+\b",
        r"Signal \d+ \(SIG[A-Z]+\) received",
    ),
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
        r"device-side assert triggered",
        r"an illegal memory access was encountered",
    ),
    _pattern("out of memory", r"CUDA out of memory", r"\bOutOfMemoryError\b", r"\bout of memory\b"),
    _pattern(
        "install failure",
        r"^environment: ",
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

    def to_json(self) -> dict:
        return {
            "cell": self.cell_id,
            "test": self.test_id,
            "name": self.test_name,
            "message": self.message,
            "class": self.triage.value,
            "cause": self.cause,
            "good": dict(self.good) if self.good else None,
            "bad": dict(self.bad) if self.bad else None,
        }


def classify_text(text: str) -> tuple[Triage, str] | None:
    """The class a failure's text says it is, or None when nothing matches (a real failure)."""
    if KNOWN_UPSTREAM.regex.search(text):
        return Triage.KNOWN_UPSTREAM, KNOWN_UPSTREAM.name
    for pattern in INFRASTRUCTURE:
        if pattern.regex.search(text):
            return Triage.INFRASTRUCTURE, pattern.name
    return None


def classify_test(test: TestResult) -> tuple[Triage, str]:
    if test.outcome is Outcome.FLAKY:
        return Triage.FLAKY, f"passed on attempt {test.attempts}"
    text = "\n".join(filter(None, (test.message, test.excerpt)))
    return classify_text(text) or (Triage.REAL, "no infrastructure pattern matched")


def classify_cell(cell: CellResult) -> tuple[Triage, str]:
    """A cell that errored without a failing test: its reason, then the end of its log."""
    text = "\n".join(filter(None, (cell.reason, cell.log_tail)))
    return classify_text(text) or (Triage.REAL, "no infrastructure pattern matched")


def versions_of(cell: CellResult) -> dict[str, str]:
    return {"torch": cell.info.torch or "", "transformers": cell.info.transformers or ""}


def night_before(cell: CellResult, baseline: ResultSet) -> CellResult | None:
    """Last night's cell of the same runner shape: the same id, else (versions floated) the same GPU
    type and count with the same torch, else the same transformers."""
    same_shape = [b for b in baseline.cells if (b.info.gpu, b.info.gpus) == (cell.info.gpu, cell.info.gpus)]
    for matches in (
        (lambda b: b.id == cell.id),
        (lambda b: b.info.torch == cell.info.torch),
        (lambda b: b.info.transformers == cell.info.transformers),
    ):
        found = sorted((b for b in same_shape if matches(b)), key=lambda b: natural_key(b.id))
        if found:
            return found[-1]
    return None


def triage(tonight: ResultSet, baseline: ResultSet | None) -> list[Red]:
    """Every red of tonight that was not red the night before, classified."""
    baseline = baseline or ResultSet(cells=())
    reds = []
    for cell in sorted(tonight.cells, key=lambda c: natural_key(c.id)):
        before = night_before(cell, baseline)
        outcome_before = {t.test_id: t.outcome for t in before.tests} if before else {}
        if cell.status is CellStatus.ERRORED and not cell.failing_tests:
            if before is None or before.status is not CellStatus.ERRORED:
                triage_class, cause = classify_cell(cell)
                reds.append(
                    Red(
                        cell_id=cell.id,
                        test_id=None,
                        test_name=None,
                        message=cell.reason or "errored",
                        triage=triage_class,
                        cause=cause,
                    )
                )
            continue
        for test in [*cell.failing_tests, *(t for t in cell.tests if t.outcome is Outcome.FLAKY)]:
            was = outcome_before.get(test.test_id)
            if was is not None and was.is_failing:
                continue  # red the night before too: not new
            triage_class, cause = classify_test(test)
            good = bad = None
            if triage_class is Triage.REAL:
                if was is Outcome.PASSED and versions_of(before) != versions_of(cell):
                    good, bad = versions_of(before), versions_of(cell)
                elif was is Outcome.PASSED:
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
                )
            )
    return reds


def bisect_plan(reds: Iterable[Red], labels: Mapping[str, Sequence[str]], gpu_of: Mapping[str, str]) -> list[dict]:
    """One bisect job per cell with real failures: `strategy.matrix.include` entries."""
    jobs: dict[str, dict] = {}
    for red in reds:
        if red.good is None or red.bad is None or red.test_id is None:
            continue
        job = jobs.setdefault(
            red.cell_id,
            {
                "cell": red.cell_id,
                "runs_on": list(labels.get(gpu_of[red.cell_id], ())),
                "good": ",".join(f"{k}={v}" for k, v in sorted(red.good.items())),
                "bad": ",".join(f"{k}={v}" for k, v in sorted(red.bad.items())),
                "tests": [],
            },
        )
        job["tests"].append(red.test_id)
    # A JSON list, never words: a test id may hold spaces (`test[a b]`), and the job reads it NUL-separated.
    return [{**job, "tests": json.dumps(job["tests"])} for job in jobs.values()]


def with_bisects(reds: Sequence[Red], bisects: Mapping[str, Mapping]) -> list[dict]:
    """Each red as data, with its cell's bisect answer; a bisect whose bad end passed again means the
    red did not reproduce on the same runner shape: flaky."""
    rows = []
    for red in reds:
        row = {**red.to_json(), "bisect": None}
        answer = bisects.get(red.cell_id) if red.good else None
        if answer is not None:
            row["bisect"] = answer.get("line") or answer.get("error")
            if answer.get("same_verdict") == "pass":
                row["class"], row["cause"] = Triage.FLAKY.value, "passed when the bisect job ran it again"
        rows.append(row)
    return rows


def load_bisects(folder: str | Path | None) -> dict[str, dict]:
    """The bisect jobs' --json files, by cell id; a missing or broken file is a bisect that said nothing."""
    found: dict[str, dict] = {}
    for path in sorted(Path(folder).rglob("bisect*.json")) if folder and Path(folder).is_dir() else []:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("cell"), str):
            found[data["cell"]] = data
    return found


def command(args) -> int:
    from harness.matrix import load_runners
    from harness.results import load_results
    from harness.templates import render_template

    tonight = load_results([args.results])
    baseline = load_results([args.baseline]) if args.baseline and Path(args.baseline).is_dir() else None
    reds = triage(tonight, baseline)
    runners = load_runners()
    plan = bisect_plan(
        reds,
        {name: runner.labels for name, runner in runners.items()},
        {cell.id: cell.info.gpu or "" for cell in tonight.cells},
    )
    rows = with_bisects(reds, load_bisects(args.bisects))
    document = {"reds": rows, "bisect": plan}
    if args.output:
        Path(args.output).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    if args.github_matrix:
        Path(args.github_matrix).write_text(json.dumps({"include": plan}, separators=(",", ":")), encoding="utf-8")
    print(render_template("triage.md.j2", reds=rows, baseline=baseline is not None), end="")
    return 0
