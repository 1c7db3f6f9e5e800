"""Known upstream bugs: cases that fail because torch or transformers is wrong, in one table.

Each entry was reproduced in a few lines outside the suite (tests/gpu/upstream_repros/, run by hand). The
cases it covers are marked `xfail(strict=True)` with a reason starting `known upstream bug: `, so the report
lists them with their cause; a release that fixes the bug turns the XPASS into a failure saying
`fixed upstream: remove the entry` (conftest.py), and the entry's version range is narrowed then.
"""

from __future__ import annotations

from dataclasses import dataclass

REASON_PREFIX = "known upstream bug: "
FIXED_MESSAGE = "fixed upstream: remove the entry"


@dataclass(frozen=True)
class KnownBug:
    package: str  # "transformers" or "torch"
    versions: str  # a PEP 440 specifier set of the releases that have it, e.g. ">=5.13,<5.20"
    layouts: tuple[str, ...]  # tf_adapter.LAYOUTS keys
    checks: tuple[str, ...]  # a case shows the bug when it runs one of these checks
    cause: str  # one line
    reproduced: str  # the reproduction and where it ran
    families: tuple[str, ...] | None = None  # None: every MoE family
    implementations: tuple[str, ...] | None = None  # experts_implementation; None: every one
    dtypes: tuple[str, ...] | None = None  # None: every dtype

    @property
    def reason(self) -> str:
        return f"{REASON_PREFIX}{self.package} {self.versions}: {self.cause} (reproduced: {self.reproduced})"

    def covers(self, case, installed: dict[str, str]) -> bool:
        from packaging.specifiers import SpecifierSet

        return (
            installed.get(self.package) in SpecifierSet(self.versions)
            and case.layout in self.layouts
            and bool(set(case.checks) & set(self.checks))
            and (self.families is None or case.family in self.families)
            and (self.implementations is None or case.experts_implementation in self.implementations)
            and (self.dtypes is None or case.dtype in self.dtypes)
        )


# Version ranges: where the bug was reproduced (the `reproduced` field) and what the releases' changes bound it by
# (5.13 introduced the ep_router plan these go through; 5.20 replaced it; 5.23 fixed the FSDP2+EP scaling).
KNOWN_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        package="transformers",
        versions=">=5.13,<5.20",
        layouts=("ep",),
        checks=("logits", "gradients"),
        implementations=("eager",),
        cause="eager experts one-hot the ep_router's sentinel expert id: 'Class values must be smaller than "
        "num_classes'",
        reproduced="upstream_repros/ep_experts_implementations_5_13_to_5_19.py eager, 5.17.0 on 2 CPU ranks",
    ),
    KnownBug(
        package="transformers",
        versions=">=5.13,<5.20",
        layouts=("ep",),
        checks=("gradients",),
        implementations=("batched_mm",),
        cause="batched_mm experts under the ep_router give the router a wrong gradient (relative error 0.5-1.1)",
        reproduced="upstream_repros/ep_experts_implementations_5_13_to_5_19.py batched_mm, 5.17.0 on 2 CPU ranks",
    ),
    KnownBug(
        package="transformers",
        versions=">=5.20,<5.23",
        layouts=("fsdp_ep",),
        checks=("gradients",),
        cause="FSDP2 + EP expert gradients (and expert biases) are exactly 0.5x the whole model's on 2 ranks",
        reproduced="upstream_repros/fsdp_ep_expert_gradients_halved.py, 5.20.0 on 2 CPU ranks",
    ),
    KnownBug(
        package="transformers",
        versions=">=5.23",
        layouts=("ep",),
        checks=("logits",),
        families=("gpt_oss",),
        implementations=("eager",),
        cause="GPT-OSS eager experts one-hot the EP sentinel expert id at inference (AllReduceEP): "
        "'Class values must be smaller than num_classes'",
        reproduced="upstream_repros/gpt_oss_eager_ep_one_hot.py, 5.24.0 on 2 CPU ranks",
    ),
)


def installed_versions() -> dict[str, str]:
    import torch
    import transformers

    return {"transformers": transformers.__version__, "torch": torch.__version__.split("+")[0]}


def known_bug(case) -> KnownBug | None:
    """The table's entry covering `case` on the installed releases, if any."""
    installed = installed_versions()
    return next((bug for bug in KNOWN_BUGS if bug.covers(case, installed)), None)


def fixed_upstream_message(longrepr: str) -> str | None:
    """For pytest's strict-XPASS failure text of a known-bugs case, what to tell the reader instead; else None."""
    strict_xpass = "[XPASS(strict)] "
    if not longrepr.startswith(strict_xpass + REASON_PREFIX):
        return None
    return f"{strict_xpass}{FIXED_MESSAGE} in tests/gpu/known_bugs.py: {longrepr.removeprefix(strict_xpass)}"
