"""bisect.json and triage.json, the files the nightly's jobs hand on, as frozen records read back by `from_json`."""

from __future__ import annotations

import dataclasses
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from harness.contract import TRIAGE_REAL

from harness.results.model import CaseCounts

# Their file names and values are harness.contract's (BISECT_JSON_GLOB, VERDICT_*, TRIAGE_*); `from_json` raises
# ValueError, saying why, for what these types did not write.


# A test of the product suite as pytest names it: tests/gpu/test_x.py::test_y[parameters]; printable ASCII, no
# space, no shell or Markdown quoting character, so the command reads the same wherever it is shown.
SUITE_TEST_ID = re.compile(r"tests/gpu/[A-Za-z0-9_/]+\.py::[A-Za-z0-9_]+(\[[A-Za-z0-9_.+=,:/-]{1,200}\])?")


def _typed(document: dict, key: str, types: tuple[type, ...], default: Any, what: str) -> Any:
    """document[key] when it is one of `types` (None allowed where the default is None), else ValueError."""
    value = document.get(key, default)
    if value is None and default is None:
        return None
    if isinstance(value, types) and not (isinstance(value, bool) and bool not in types):
        return value
    raise ValueError(f"{what}: {key!r} must be {' or '.join(kind.__name__ for kind in types)}, not {value!r:.60}")


def _strings(value: Any, key: str, what: str) -> list[str]:
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return list(value)
    raise ValueError(f"{what}: {key!r} must be a list of strings")


def _string_map(value: Any, key: str, what: str) -> dict[str, str] | None:
    if value is None:
        return None
    if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        return dict(value)
    raise ValueError(f"{what}: {key!r} must be an object of strings or null")


def _objects(document: dict, key: str, what: str) -> list[dict]:
    value = document.get(key, [])
    if isinstance(value, list) and all(isinstance(item, dict) for item in value):
        return value
    raise ValueError(f"{what}: {key!r} must be a list of objects")


@dataclass(frozen=True, kw_only=True)
class BisectProbeRecord:
    """One probe of a bisect: the versions it ran, its verdict (contract.VERDICT_*) and why, and the folders it left."""

    versions: dict[str, str]
    label: str
    verdict: str
    note: str | None = None
    failure: list[str] | None = None  # [test, first line] of the first failing test
    duration_s: float = 0.0
    environments_built: int = 0
    folders: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, document: dict) -> BisectProbeRecord:
        what = "a probe"
        failure = _typed(document, "failure", (list,), None, what)
        return cls(
            versions=_string_map(_typed(document, "versions", (dict,), {}, what), "versions", what) or {},
            label=_typed(document, "label", (str,), "", what),
            verdict=_typed(document, "verdict", (str,), "", what),
            note=_typed(document, "note", (str,), None, what),
            failure=None if failure is None else _strings(failure, "failure", what),
            duration_s=float(_typed(document, "duration_s", (int, float), 0.0, what)),
            environments_built=_typed(document, "environments_built", (int,), 0, what),
            folders=_strings(_typed(document, "folders", (list,), [], what), "folders", what),
        )


@dataclass(frozen=True, kw_only=True)
class BisectRecord:
    """bisect.json. A search that ran gives its boundary (or why there is none) and its probes; a bisect that said
    nothing before it searched gives `error`, and `same_verdict` where its good and bad ends agreed."""

    cell: str
    pytest_args: list[str] = field(default_factory=list)
    exit_code: int | None = None
    # A search that ran.
    package: str | None = None
    kind: str | None = None  # regression | fix
    versions: list[str] = field(default_factory=list)  # "range": the versions searched, oldest first
    found: bool = False
    first: str | None = None  # first bad (regression) or first good (fix)
    last: str | None = None  # the version before it
    test: str | None = None
    message: str | None = None
    stopped: str | None = None  # why no boundary
    culprit: str | None = None  # with both packages different: which swap said which upstream
    set_aside: list[str] = field(default_factory=list)  # tests failing at both ends
    line: str | None = None  # the answer in one line
    duration_s: float | None = None
    environments_built: int = 0
    probes: list[BisectProbeRecord] = field(default_factory=list)
    # A bisect that said nothing.
    error: str | None = None
    same_verdict: str | None = None  # VERDICT_PASS or VERDICT_FAIL: good and bad both gave it
    # With same_verdict VERDICT_FAIL: the tests that failed on the good end (the last good build, on the red's runner
    # shape), as the probe's junit.xml had them. Triage's evidence that a crash shows there too.
    failing_at_good: list[str] = field(default_factory=list)

    def said(self) -> str | None:
        """What the bisect answered, in one line: its boundary, or why it found none or said nothing."""
        return self.line or self.error

    def to_json(self) -> dict[str, Any]:
        head = {"cell": self.cell, "pytest_args": list(self.pytest_args)}
        if self.error is not None:
            return {**head, "error": self.error, "exit_code": self.exit_code, "same_verdict": self.same_verdict,
                    "failing_at_good": list(self.failing_at_good)}
        return {
            **head,
            "package": self.package,
            "kind": self.kind,
            "range": list(self.versions),
            "found": self.found,
            "first": self.first,
            "last": self.last,
            "test": self.test,
            "message": self.message,
            "stopped": self.stopped,
            "culprit": self.culprit,
            "set_aside": list(self.set_aside),
            "line": self.line,
            "exit_code": self.exit_code,
            "duration_s": self.duration_s,
            "environments_built": self.environments_built,
            "probes": [probe.to_json() for probe in self.probes],
        }

    @classmethod
    def from_json(cls, document: object) -> BisectRecord:
        if not isinstance(document, dict) or not isinstance(document.get("cell"), str):
            raise ValueError("not a bisect.json: an object with a 'cell' string")
        what = f"bisect of {document['cell']:.80}"

        def text(key: str) -> str | None:
            return _typed(document, key, (str,), None, what)

        return cls(
            cell=document["cell"],
            pytest_args=_strings(_typed(document, "pytest_args", (list,), [], what), "pytest_args", what),
            exit_code=_typed(document, "exit_code", (int,), None, what),
            package=text("package"),
            kind=text("kind"),
            versions=_strings(_typed(document, "range", (list,), [], what), "range", what),
            found=_typed(document, "found", (bool,), False, what),
            first=text("first"),
            last=text("last"),
            test=text("test"),
            message=text("message"),
            stopped=text("stopped"),
            culprit=text("culprit"),
            set_aside=_strings(_typed(document, "set_aside", (list,), [], what), "set_aside", what),
            line=text("line"),
            duration_s=_typed(document, "duration_s", (int, float), None, what),
            environments_built=_typed(document, "environments_built", (int,), 0, what),
            probes=[BisectProbeRecord.from_json(probe) for probe in _objects(document, "probes", what)],
            error=text("error"),
            same_verdict=text("same_verdict"),
            failing_at_good=_strings(_typed(document, "failing_at_good", (list,), [], what), "failing_at_good", what),
        )


@dataclass(frozen=True, kw_only=True)
class TriageRed:
    """One new red of triage.json: a failing test (`test` None: a cell that errored without one), its class (one of
    TRIAGE_CLASSES) and why, last night's and tonight's versions where it is bisected, and the bisect's line."""

    cell: str
    test: str | None
    name: str | None
    message: str
    triage_class: str  # "class" in the file
    cause: str
    label: str | None = None  # what the failure's words look like ("looks like an OOM"): beside the class, never it
    good: dict[str, str] | None = None
    bad: dict[str, str] | None = None
    crash: bool = False  # a crash, hang or timeout: infrastructure if the last good build shows it too
    bisect: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"cell": self.cell, "test": self.test, "name": self.name, "message": self.message,
                "class": self.triage_class, "cause": self.cause, "label": self.label, "good": self.good,
                "bad": self.bad, "crash": self.crash, "bisect": self.bisect}

    @property
    def repro(self) -> str | None:
        """`harness repro 'TEST_ID'`, the command that writes this red's standalone reproducer (a script needing
        torch and transformers alone, for an upstream issue): for a real failure of one of the suite's tests. Built
        from the test id only where it has a suite test's shape (the id comes from a results folder), and quoted."""
        if self.triage_class != TRIAGE_REAL or not self.test or not SUITE_TEST_ID.fullmatch(self.test):
            return None
        return f"harness repro {shlex.quote(self.test)}"

    @classmethod
    def from_json(cls, document: dict) -> TriageRed:
        cell, test, triage_class = document.get("cell"), document.get("test"), document.get("class")
        if not isinstance(cell, str) or not isinstance(triage_class, str) or not isinstance(test, (str, type(None))):
            raise ValueError("a red needs 'cell' and 'class' strings and 'test' a string or null")
        what = f"the red {cell:.80} {test or ''}"
        return cls(
            cell=cell,
            test=test,
            name=_typed(document, "name", (str,), None, what),
            message=_typed(document, "message", (str,), "", what),
            triage_class=triage_class,
            cause=_typed(document, "cause", (str,), "", what),
            label=_typed(document, "label", (str,), None, what),
            good=_string_map(document.get("good"), "good", what),
            bad=_string_map(document.get("bad"), "bad", what),
            crash=_typed(document, "crash", (bool,), False, what),
            bisect=_typed(document, "bisect", (str,), None, what),
        )


@dataclass(frozen=True, kw_only=True)
class BisectJob:
    """One bisect job of triage's plan: an entry of the nightly's `strategy.matrix.include`."""

    cell: str
    runs_on: list[str]  # the runner labels of the cell's GPU type
    good: str  # "torch=2.13.0,transformers=5.19.0": last night's versions
    bad: str  # tonight's
    tests: str  # a JSON list of test ids (the job reads them NUL-separated); "[]": the cell's whole suite

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, document: dict) -> BisectJob:
        what = "a bisect job"
        return cls(
            cell=_typed(document, "cell", (str,), "", what),
            runs_on=_strings(_typed(document, "runs_on", (list,), [], what), "runs_on", what),
            good=_typed(document, "good", (str,), "", what),
            bad=_typed(document, "bad", (str,), "", what),
            tests=_typed(document, "tests", (str,), "[]", what),
        )


@dataclass(frozen=True, kw_only=True)
class ReleaseRecord:
    """One package's releases last night and tonight (results.compare.ReleaseChange), oldest first; `before` empty:
    no results from the night before."""

    package: str
    before: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, document: dict) -> ReleaseRecord:
        what = "a release"
        return cls(
            package=_typed(document, "package", (str,), "", what),
            before=_strings(_typed(document, "before", (list,), [], what), "before", what),
            after=_strings(_typed(document, "after", (list,), [], what), "after", what),
        )


@dataclass(frozen=True, kw_only=True)
class CaseRecord:
    """A case of tonight the release view lists apart from the reds: fixed upstream (`keys`: the known-bugs entries
    whose range to close) or not built (`reason`: why the suite could not build it), with the releases it ran on."""

    cell: str
    test: str
    keys: list[str] = field(default_factory=list)
    reason: str | None = None
    versions: dict[str, str] = field(default_factory=dict)  # transformers, torch

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, document: dict) -> CaseRecord:
        what = "a case"
        return cls(
            cell=_typed(document, "cell", (str,), "", what),
            test=_typed(document, "test", (str,), "", what),
            keys=_strings(_typed(document, "keys", (list,), [], what), "keys", what),
            reason=_typed(document, "reason", (str,), None, what),
            versions=_string_map(_typed(document, "versions", (dict,), {}, what), "versions", what) or {},
        )


@dataclass(frozen=True, kw_only=True)
class TriageRecord:
    """triage.json: the releases new since last night, tonight's cases by class (contract.CASE_CLASSES), every new red
    of the night, the cases fixed upstream and those not built, and the bisect plan. A file written before the release
    view was kept reads with `releases` and the case lists empty and `cases` None."""

    reds: list[TriageRed] = field(default_factory=list)
    bisect: list[BisectJob] = field(default_factory=list)
    releases: list[ReleaseRecord] = field(default_factory=list)
    cases: CaseCounts | None = None
    fixed_upstream: list[CaseRecord] = field(default_factory=list)
    not_built: list[CaseRecord] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "new_since_last_night": [release.to_json() for release in self.releases],
            "cases": self.cases.to_json() if self.cases is not None else None,
            "reds": [red.to_json() for red in self.reds],
            "fixed_upstream": [case.to_json() for case in self.fixed_upstream],
            "not_built": [case.to_json() for case in self.not_built],
            "bisect": [job.to_json() for job in self.bisect],
        }

    def github_matrix(self) -> dict[str, Any]:
        """The plan as the {'include': [...]} object strategy.matrix takes."""
        return {"include": [job.to_json() for job in self.bisect]}

    @classmethod
    def from_json(cls, document: object) -> TriageRecord:
        if not isinstance(document, dict):
            raise ValueError(f"not the JSON `harness triage -o` writes: an object, not {type(document).__name__}")
        reds = document.get("reds")
        if not isinstance(reds, list) or not all(isinstance(red, dict) for red in reds):
            raise ValueError("'reds' must be a list of objects")
        cases = document.get("cases")
        return cls(
            reds=[TriageRed.from_json(red) for red in reds],
            bisect=[BisectJob.from_json(job) for job in _objects(document, "bisect", "the bisect plan")],
            releases=[ReleaseRecord.from_json(release)
                      for release in _objects(document, "new_since_last_night", "the releases")],
            cases=None if cases is None else CaseCounts.from_json(cases),
            fixed_upstream=[CaseRecord.from_json(case) for case in _objects(document, "fixed_upstream", "triage")],
            not_built=[CaseRecord.from_json(case) for case in _objects(document, "not_built", "triage")],
        )
