"""One known upstream bug as data (`KnownBug`), and what a failure is (`Failure`): the entries of the table
(upstream/table/) are made of these; upstream/known_bugs.py matches a case's failure against them."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from checks.kinds import Check, Layout
from models import families
from packaging.specifiers import InvalidSpecifier, Specifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from harness.contract import KNOWN_BUG_KEY_CHARS, KNOWN_BUG_KEY_PATTERN
from harness.contract import KNOWN_BUG_PREFIX as REASON_PREFIX  # what the report shows
from harness.ranks import RankFailedError
from harness.ranks.raised import NO_MESSAGE, RaisingFrame, first_line, raising_frame

DIFFERENT_MESSAGE = "failed differently from its known bug"
PACKAGES = ("transformers", "torch")  # every entry names the releases of each it holds for
# The newest releases each entry was seen on: {"schema": 1, "entries": {key: {"transformers": V, "torch": V}}},
# written by `harness known-bugs verify` (harness/upstream/verify.py).
VERIFIED_FILE = Path(__file__).with_name("known_bugs_verified.json")
# An upper end is a fix (`<V`, V the first good release); `<=`, `==`, `~=` and `===` would cap a live bug at the
# last release someone checked, and the next release would read it as a new red.
CAPPING_OPERATORS = ("<=", "==", "~=", "===")


class KnownBugFailure(Exception):
    """A covered case failed the way its entry says: the strict xfail's `raises`, so nothing else is xfailed. `key`:
    the entry that explained it."""

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


# The keys of the entries covering the running test, for the report hook (conftest.py) to name on a strict XPASS.
_KEY = re.compile(KNOWN_BUG_KEY_PATTERN)


class DifferentFailure(AssertionError):
    """A covered case failed, but not the way its entry says: a red, not an xfail."""


@dataclass(frozen=True)
class Failure:
    """What a case's failure was, as data: the failing rank's exception type (None: it died without one), the
    first line of its message, and where it was raised (None: unknown)."""

    error_type: str | None
    message: str
    raised_at: RaisingFrame | None

    def __str__(self) -> str:
        where = f" (raised at {self.raised_at})" if self.raised_at else ""
        return f"{self.error_type or 'no exception'}: {self.message}{where}"


@dataclass(frozen=True, kw_only=True)
class KnownBug:
    # Names the entry in the case's known-bugs property (contract.KNOWN_BUG): lower-case words joined by -, _ or .;
    # unique in the table, and kept when the entry's ranges or words change.
    key: str
    # a PEP 440 specifier set of the transformers releases that have it, open above while it is live; None: a
    # torch bug, which every transformers release that reaches it shows
    transformers: str | None
    torch: str  # likewise for torch (a release without its local tag: 2.11.0, not 2.11.0+cu130)
    torch_verified: str  # the torch releases the entry was run on, and where its torch range rests on no run
    layouts: tuple[Layout, ...]  # tf_adapter.LAYOUTS keys, or Layout.ONE_DEVICE
    checks: tuple[Check, ...]  # a case shows the bug when it runs one of these checks
    raises: str  # the failing rank's exception type (qualname), e.g. "RuntimeError"
    match: str  # a regular expression searched for in the first line of that exception's message
    cause: str  # one line
    reproduced: str  # the reproduction and where it ran
    bisected: tuple[str, ...]  # each end's `harness bisect` command and answer, or `lower/upper end: ` why none
    families: tuple[str, ...] | None = None  # None: every MoE family
    implementations: tuple[str, ...] | None = None  # experts_implementation; None: every one
    dtypes: tuple[str, ...] | None = None  # None: every dtype
    devices: tuple[str, ...] | None = None  # the ranks' device type ("cpu", "cuda"); None: every one
    # `file:function` of the raising frame (RaisingFrame.location, e.g.
    # "torch/distributed/tensor/placement_types.py:_reduce_value"): required where `match` accepts an exception
    # without a message, which alone would take any bare `assert` for this bug.
    raised_at: str | None = None

    def __post_init__(self) -> None:
        if not (len(self.key) <= KNOWN_BUG_KEY_CHARS and _KEY.fullmatch(self.key)):
            raise ValueError(f"known bug {self.key!r}: a key is lower-case words joined by -, _ or . "
                             f"({KNOWN_BUG_KEY_PATTERN}), at most {KNOWN_BUG_KEY_CHARS} characters")
        for package in PACKAGES:
            _check_specifiers(self, package)
        if self.raised_at is None and re.search(self.match, NO_MESSAGE):
            raise ValueError(
                f"known bug {self.label}: match {self.match!r} accepts an exception without a message "
                f"({NO_MESSAGE}), so any bare assert would pass for it: name where it is raised "
                "(raised_at='package/path/file.py:function')"
            )

    @property
    def label(self) -> str:
        """Which entry this is, for an error about the table."""
        families = ", ".join(self.families) if self.families else "every MoE family"
        return f"{self.key} [{families}; {'/'.join(self.layouts)}; {self.raises}; {self.ranges}]"

    @property
    def ranges(self) -> str:
        transformers = f"transformers {self.transformers}, " if self.transformers is not None else ""
        return f"{transformers}torch {self.torch}"

    @property
    def verified(self) -> Mapping[str, str]:
        """The newest releases the entry was seen on (upstream/known_bugs_verified.json)."""
        return verified_releases().get(self.key, {})

    @property
    def seen(self) -> str:
        releases = ", ".join(f"{package} {self.verified[package]}" for package in PACKAGES if package in self.verified)
        return f"last seen on {releases}" if releases else "not yet seen by `harness known-bugs verify`"

    @property
    def reason(self) -> str:
        return f"{REASON_PREFIX}{self.ranges} ({self.seen}): {self.cause} (reproduced: {self.reproduced})"

    def covers(self, case, installed: dict[str, str], device: str) -> bool:
        return (
            all(_within(installed.get(package), getattr(self, package)) for package in PACKAGES)
            and (self.devices is None or device in self.devices)
            and case.layout in self.layouts
            and bool(set(case.checks) & set(self.checks))
            # an entry for a family covers its variants (`glm4_moe+switches`) too; one for a variant, that alone
            and (self.families is None or case.family in self.families
                 or families.split_variant(case.family)[0] in self.families)
            and (self.implementations is None or case.experts_implementation in self.implementations)
            and (self.dtypes is None or case.dtype in self.dtypes)
        )

    def explains(self, error: BaseException) -> bool:
        failure = failure_of(error)
        return (
            failure.error_type == self.raises
            and re.search(self.match, failure.message) is not None
            and (self.raised_at is None or (failure.raised_at is not None
                                            and failure.raised_at.location == self.raised_at))
        )

    def verdict(self, error: Exception) -> Exception:
        """What a covered case raises in place of `error`: the bug the xfail expects, or a different failure."""
        failure = failure_of(error)
        if self.explains(error):
            return KnownBugFailure(f"{REASON_PREFIX}{self.ranges}: {failure}", self.key)
        where = f" raised in {self.raised_at}" if self.raised_at else ""
        return DifferentFailure(
            f"{DIFFERENT_MESSAGE} ({self.ranges}: {self.raises} matching {self.match!r}{where}): {failure}"
        )


def _check_specifiers(bug: KnownBug, package: str) -> None:
    """An empty specifier set would hold for every release: each package's range must say which (a torch bug may
    name no transformers range). A range is open above while the bug is live: its upper end, if any, is a fix."""
    text = getattr(bug, package)
    if text is None and package == "transformers":
        return
    try:
        specifiers = SpecifierSet(text) if isinstance(text, str) and text.strip() else None
    except InvalidSpecifier:
        specifiers = None
    if specifiers is None:
        raise ValueError(f"known bug {bug.label}: {package}={text!r} is not a PEP 440 range of {package} releases")
    capped = [str(each) for each in specifiers if isinstance(each, Specifier) and each.operator in CAPPING_OPERATORS]
    if capped:
        raise ValueError(
            f"known bug {bug.label}: {package} {', '.join(capped)} caps the range at a release: a range stays open "
            "while the bug is live (its newest release seen goes in known_bugs_verified.json, through `harness "
            "known-bugs verify`); its only upper end is the first good release, written `<V`"
        )


def _within(version: str | None, specifiers: str | None) -> bool:
    if specifiers is None:
        return True
    try:
        return version is not None and Version(version) in SpecifierSet(specifiers)
    except InvalidVersion:
        return False


@functools.cache
def verified_releases() -> Mapping[str, Mapping[str, str]]:
    """upstream/known_bugs_verified.json's entries: key -> {package: newest release seen}."""
    return json.loads(VERIFIED_FILE.read_text(encoding="utf-8"))["entries"]


def failure_of(error: BaseException) -> Failure:
    """The failure itself: for the ranks fixture's error, the first failing rank's own exception as it travelled
    (type None: the rank died without one); else the exception raised here."""
    if isinstance(error, RankFailedError):
        message = error.error_message if error.error_message is not None else error.summary
        return Failure(error.error_type, message, error.error_frame)
    return Failure(type(error).__qualname__, first_line(error), raising_frame(error))
