"""Known upstream bugs: cases that fail because torch or transformers is wrong, in one table.

Each entry was reproduced in a few lines outside the suite (tests/gpu/upstream/repros/, run by hand), and
its transformers range was bisected with `harness bisect` at both ends (the `bisected` field: each command and
its answer). An entry holds for the transformers releases AND the torch releases it names (`transformers`,
`torch`: one PEP 440 specifier set each; a torch bug names no transformers range at all; `torch_verified` says
which torch releases it was run on). A range starts at the first bad release and stays open while the bug is
live: its only upper end is a fix (`<FIRST_GOOD`), written when a strict XPASS said "fixed upstream". The newest
releases each entry was seen on live beside the table, in upstream/known_bugs_verified.json, moved forward from a run's
results by `harness known-bugs verify RESULTS` (a new entry starts there as `"key": {}`, written by hand; the
releases in it are never edited by hand), so a release after the last one checked runs the
case covered and shows at once whether the bug is still there. The cases
it covers are marked `xfail(strict=True)` with a reason starting `known upstream bug: `, so the report lists
them with their cause, but only for the failure the entry names: the failing rank's exception type (`raises`),
a pattern its message's first line matches (`match`) and, where that message says nothing (a bare `assert`),
where it was raised (`raised_at`: the failing rank's innermost frame, which travels from the rank as data). A
covered case that fails otherwise is red, saying it failed differently from its known bug; one that passes
fails saying `fixed upstream: close the range` (conftest.py).

Each entry has a stable `key`, and the case records, as a JUnit property, which entries it matched: the entry that
explained an expected failure (contract.KNOWN_BUG), or the entries covering a case that passed (contract.
KNOWN_BUG_FIXED, conftest.py). Nightly triage calls a red a known upstream bug from that property alone; the words
above are for people.

The `bisected` commands name the tests as they were when they ran: `test_fsdp_ep_moe`, the FSDP2 dense
`test_fsdp_dense_*` and the EP cases of `test_ep_load_and_logits` / `test_ep_gradients` are now the one-step checks
at the start of `test_training_steps` (one load serves both; the deep EP ones per experts implementation too). A
case runs its checks in order and stops at the first failure, so several entries can cover one case (one per
check): the failure is the known bug when any of them explains it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from harness.contract import FIXED_UPSTREAM as FIXED_MESSAGE
from harness.contract import KNOWN_BUG
from harness.contract import KNOWN_BUG_PREFIX as REASON_PREFIX  # what the report shows
from harness.environment import KNOWN_BUGS_AS_OF_ENV as AS_OF_ENV
from upstream import table
from upstream.entry import (  # noqa: F401 - the entry's type and a failure's, used by the suite through this module
    DIFFERENT_MESSAGE,
    DifferentFailure,
    Failure,
    KnownBug,
    KnownBugFailure,
    failure_of,
    verified_releases,
)

# The keys of the entries covering the running test, for the report hook (conftest.py) to name on a strict XPASS.
COVERING = pytest.StashKey[tuple[str, ...]]()


def installed_versions() -> dict[str, str]:
    import torch
    import transformers

    return {"transformers": transformers.__version__, "torch": torch.__version__.split("+")[0]}


def ranks_device() -> str:
    """The device type the ranks compute on: "cuda" where the host's GPUs are its ranks, else "cpu"."""
    from harness.ranks.plugin import RANK_UNIT_GPUS, available_ranks

    return "cuda" if available_ranks()[1] == RANK_UNIT_GPUS else "cpu"


def known_bugs(case) -> tuple[KnownBug, ...]:
    """The table's entries covering `case` on the installed releases and this host's device. A case that runs
    several checks (a training case runs the one-step checks first) can be covered by an entry per check."""
    installed, device = installed_versions(), ranks_device()
    return tuple(bug for bug in KNOWN_BUGS if bug.covers(case, installed, device))


@contextlib.contextmanager
def expecting(request, bugs: tuple[KnownBug, ...]) -> Iterator[None]:
    """Marks the running test as a strict xfail for `bugs`; a failure inside the block is one of theirs (xfailed,
    recording the entry's key as the KNOWN_BUG property) or a different one (red). pytest's own outcomes (skip, xfail)
    and interrupts pass through unchanged. A case that passes is the strict XPASS conftest.py names (fixed
    upstream), from the covering keys stashed here."""
    if not bugs:
        yield
        return
    reason = bugs[0].reason + "".join(f"; or {bug.reason.removeprefix(REASON_PREFIX)}" for bug in bugs[1:])
    request.applymarker(pytest.mark.xfail(strict=True, reason=reason, raises=KnownBugFailure))
    request.node.stash[COVERING] = tuple(bug.key for bug in bugs)
    try:
        yield
    except Exception as error:
        found = verdict(bugs, error)
        if isinstance(found, KnownBugFailure):
            request.node.user_properties.append((KNOWN_BUG, found.key))
        raise found from error


def verdict(bugs: tuple[KnownBug, ...], error: Exception) -> Exception:
    """The first of `bugs` that explains `error`, as the xfail expects it; else the first one's different failure
    (naming the others too)."""
    for bug in bugs:
        if bug.explains(error):
            return bug.verdict(error)
    different = bugs[0].verdict(error)
    if len(bugs) > 1:
        others = "; ".join(f"{bug.ranges}: {bug.raises} matching {bug.match!r}" for bug in bugs[1:])
        return DifferentFailure(f"{different} (nor the other entries covering it: {others})")
    return different


def fixed_upstream(item, call, report) -> tuple[str, ...] | None:
    """The keys of the entries covering a case that passed (its strict xfail's XPASS, which pytest reports failed),
    decided by structure: the call raised nothing, its report failed, and `expecting` covered it. Else None."""
    if call.when != "call" or call.excinfo is not None or not report.failed:
        return None
    return item.stash.get(COVERING, None)


def fixed_upstream_message(longrepr: str) -> str:
    """What to tell the reader of a known-bugs case's strict XPASS, in place of pytest's text."""
    strict_xpass = "[XPASS(strict)] "
    return f"{strict_xpass}{FIXED_MESSAGE} in tests/gpu/upstream/known_bugs.py: {longrepr.removeprefix(strict_xpass)}"



def first_bad(bug: KnownBug) -> Version | None:
    """The lower end of the entry's transformers range (None: a torch bug, or no lower end)."""
    if bug.transformers is None:
        return None
    lower = [Version(each.version) for each in SpecifierSet(bug.transformers) if each.operator in (">=", ">")]
    return max(lower) if lower else None


def known_as_of(bugs: tuple[KnownBug, ...], release: str | None) -> tuple[KnownBug, ...]:
    if not release:
        return bugs
    newest = Version(release)
    return tuple(bug for bug in bugs if (bad := first_bad(bug)) is None or bad <= newest)



# A release day replayed: HARNESS_KNOWN_BUGS_AS_OF=V keeps the entries known when V was the newest transformers
# release (their range's lower end at or below V; a torch bug's entry always), so a run of the release after V
# shows what that morning would have: every red left is a change of the new release.
KNOWN_BUGS = known_as_of(table.ENTRIES, os.environ.get(AS_OF_ENV))
