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


KNOWN_BUGS: tuple[KnownBug, ...] = (
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
