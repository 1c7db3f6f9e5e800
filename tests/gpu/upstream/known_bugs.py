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
import dataclasses
import functools
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from models import families
from packaging.specifiers import InvalidSpecifier, Specifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from harness.contract import FIXED_UPSTREAM as FIXED_MESSAGE
from harness.contract import KNOWN_BUG, KNOWN_BUG_KEY_CHARS, KNOWN_BUG_KEY_PATTERN
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
COVERING = pytest.StashKey[tuple[str, ...]]()
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
    layouts: tuple[str, ...]  # tf_adapter.LAYOUTS keys
    checks: tuple[str, ...]  # a case shows the bug when it runs one of these checks
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


# Versions: what `harness bisect` measured at each end (torch 2.13.0 CPU, 2 gloo ranks, fp32); an upper end is the
# first good release (a fix); a lower end at a feature's floor (tf_adapter) is the first release that can run the case
# at all. A live entry has no upper end: the newest release it was seen on is in upstream/known_bugs_verified.json.
#
# torch: the bisects and reproductions ran on torch 2.13.0 (some on 2.11.0 too: torch_verified), so a range starts
# at the oldest torch release the entry was run on and stays open: a newer torch runs the case covered and shows
# whether the bug is still there; an older one shows its own verdict until someone runs it there.
TORCH_2_13_ONLY = ">=2.13.0"
RUN_ON_2_13_ONLY = "2.13.0 only: every bisect and reproduction above ran on it (CPU, 2 gloo ranks)"
# The GPU image's torch 2.11.0+cu130 with transformers 5.17.0, 2 gloo ranks (CUDA hidden), 2026-12-02:
# test_ep_load_and_logits[{qwen3_moe,gpt_oss}-eager-2-float32], test_ep_gradients[qwen3_moe-eager-2-float32] and
# test_ep_gradients[{qwen3_moe,gpt_oss}-batched_mm-2-float32] each xfailed with this entry's failure.
TORCH_2_11_AND_2_13 = ">=2.11"
# The GPU host's own CPU, torch 2.11.0+cu130 with transformers 5.24.0 carried as a wheel, HARNESS_CPU_RANKS=8
# (the world-2 cases), 2026-12-02: each entry marked so failed there with its own exception type and message.
RUN_ON_2_11_WITH_5_24 = (
    "2.13.0 (the bisects) and 2.11.0 (the GPU host's CPU, transformers 5.24.0, gloo: the covered cases failed "
    "with this entry's type and message, 2026-12-02); 2.12 between them not run"
)
RUN_ON_2_11_AND_2_13 = (
    "2.13.0 (the bisects) and 2.11.0 (the GPU image, transformers 5.17.0: qwen3_moe and gpt_oss eager logits, "
    "eager and batched_mm gradients fail this way, 2026-12-02); 2.12 between them not run"
)
_EP_SELECTION = (
    '-k "(test_ep_load_and_logits and qwen3_moe-eager-2-float32) or '
    '(test_ep_gradients and qwen3_moe-batched_mm-2-float32)"'
)
# One selection holds both EP entries' cases; each probe's junit.xml shows both failing or both passing.
_EP_SENTINEL_BISECTED = (
    f"harness bisect --package transformers --good 5.12.1 --bad 5.13.0 -- {_EP_SELECTION}: good and bad give "
    "the same verdict, both fail (exit 2); 2 probes, 347s",
    f"harness bisect --package transformers --good 5.7.0 --bad 5.12.1 -- {_EP_SELECTION}: good and bad give "
    "the same verdict, both fail (exit 2); 2 probes, 275s",
    f"harness bisect --package transformers --good 5.6.2 --bad 5.7.0 -- {_EP_SELECTION}: 5.6.2 untestable "
    "(needs transformers>=5.7.0 for expert-parallel loading), exit 2; 1 probe, 188s",
    "lower end: 5.7.0, the EP floor (first release with an EP plan for qwen3_moe and gpt_oss), fails",
    f"harness bisect --package transformers --good 5.24.0 --bad 5.17.0 -- {_EP_SELECTION}: first good: "
    "transformers 5.18.0 (last bad 5.17.0); 5 probes, 800s",
)
_NEWEST = "upper end: none, the bug is live (5.24.0, the newest release when it was bisected, still fails)"


def _bisect(good: str, selection: str, answer: str) -> str:
    return f"harness bisect --package transformers --good {good} --bad 5.24.0 -- -k '{selection}': {answer}"


# The families new in 5.24.0: one bisect shows there is nothing earlier to run.
_NEW_IN_5_24 = _bisect(
    "5.23.0",
    "(sarvam_moe or lara_mini or inkling2_loop_text or hy_v4_vl_text) and "
    "(test_fsdp_ep_moe or test_ep_load_and_logits)",
    "5.23.0 untestable: pytest collected no tests (no model folders there), exit 2; 1 probe, 45s",
)

_INKLING_MUSE_BISECTED = (
    _bisect(
        "5.17.0",
        "inkling_text and test_ep_load_and_logits",
        "first bad: transformers 5.23.0 (last good 5.22.2); 6 probes, 147s",
    ),
    _bisect(
        "5.20.0",
        "muse_spark_text and test_ep_load_and_logits",
        "first bad: transformers 5.23.0 (last good 5.22.2); 6 probes, 204s",
    ),
    _NEWEST,
)

_INKLING_BARE_ASSERT = KnownBug(
    key="inkling-dtensor-rmsnorm-bare-assert",
    transformers=">=5.23,<5.25",
    torch=TORCH_2_13_ONLY,
    torch_verified=RUN_ON_2_13_ONLY,
    layouts=("ep",),
    checks=("load", "gradients"),
    families=("inkling_text",),
    raises="AssertionError",
    match=r"^\(no message\)$",  # NO_MESSAGE: torch 2.13's _MaskPartial._reduce_value `raise AssertionError`
    raised_at="torch/distributed/tensor/placement_types.py:_reduce_value",
    cause="a DTensor leaves a TP-sharded module and reaches a plain RMSNorm (InklingRMSNorm, "
    "MuseSparkRMSNorm): torch 2.13's DTensor redistribute raises a bare AssertionError in "
    "_MaskPartial._reduce_value (its mask buffer is empty)",
    reproduced="upstream/repros/sharded_load_errors_5_24.py inkling_text|muse_spark_text ep, 5.24.0, "
    "2 CPU ranks, torch 2.13.0: every rank raised at torch/distributed/tensor/placement_types.py:1703 "
    "_reduce_value, from InklingRMSNorm.forward and MuseSparkRMSNorm._norm (re-run 2026-12-02)",
    bisected=(
        _INKLING_MUSE_BISECTED[0],
        "harness bisect --package transformers --good 5.25.0 --bad 5.24.0 -- -k 'test_training_steps and "
        "inkling_text-ep-2': first good: transformers 5.25.0 (last bad 5.24.0); 2 probes, 54s (fixed upstream: the "
        "strict XPASS of 5.25.0's release-day run)",
    ),
)

_WIDE_SWEEP_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        key="text-config-qk-norm-tp-plan",
        transformers=">=5.23",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24,
        layouts=("ep",),
        checks=("gradients",),
        # glm4_moe: only its switched config builds q/k norms (Glm4MoeConfig(use_qk_norm=True), default False)
        families=("qwen3_vl_moe_text", "qwen3_omni_moe_text", "glm4_moe+switches"),
        raises="AssertionError",
        match=r"^gradients differ from the whole model's: .*self_attn\.[qk]_norm\.weight",
        cause="the text configs' base_model_tp_plan lacks q_norm/k_norm 'replicated_with_grad_allreduce' (Qwen3-MoE "
        "has it): under EP+TP each rank's q/k norm gradient covers its half of the heads",
        reproduced="upstream/repros/qwen3_vl_omni_ep_qk_norm_gradients.py FAMILY: per-rank q/k norm gradient errors "
        "0.40-1.02 at 5.24.0, on 2 CPU ranks; upstream/repros/glm4_moe_qk_norm_ep_gradients.py: 0.52-0.88 per rank, "
        "their sum over the ranks within 1e-6, 5.24.0",
        bisected=(
            _bisect(
                "5.22.2",
                "qwen3_vl_moe_text and test_ep_gradients",
                "first bad: transformers 5.23.0 (last good 5.22.2); 3 probes, 70s",
            ),
            _bisect(
                "5.22.2",
                "qwen3_omni_moe_text and test_ep_gradients",
                "first bad: transformers 5.23.0 (last good 5.22.2); 3 probes, 69s",
            ),
            "harness bisect --package transformers --good 5.17.0 --bad 5.24.0 -- 'tests/gpu/test_config_switches.py::"
            "test_switches_on_load_logits_and_gradients[glm4_moe+switches-ep-grouped_mm]': first bad: transformers "
            "5.23.0 (last good 5.22.2); 6 probes, 129s",
            _NEWEST,
        ),
    ),
    KnownBug(
        key="fsdp-ep-linear-attention-conv1d",
        transformers=">=5.20",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24,
        layouts=("fsdp_ep",),
        checks=("load",),
        families=("bailing_hybrid", "kimi_linear", "glm5_next_text"),
        raises="AssertionError",
        match=r"^load: rank \d+'s FSDP shard of \S*conv1d\.weight is not its share",
        cause="FSDP2+EP loading concatenates the checkpoint's q/k/v conv1d (Concatenate(dim=0)) per shard: each "
        "rank holds [q share | k share | v share], not its share of the whole conv1d",
        reproduced="upstream/repros/fsdp_ep_linear_attention_conv1d.py FAMILY: bailing_hybrid and glm5_next_text "
        "shards equal the concatenated q, k, v shares (largest difference 0.25-0.30), 5.24.0, 2 CPU ranks",
        bisected=(
            _bisect(
                "5.20.0",
                "kimi_linear and test_fsdp_ep_moe",
                "good and bad give the same verdict: 5.20.0 fails with the same conv1d message (exit 2)",
            ),
            _bisect("5.20.0", "bailing_hybrid and test_fsdp_ep_moe", "the same (exit 2)"),
            _bisect("5.20.0", "glm5_next_text and test_fsdp_ep_moe", "the same (exit 2)"),
            "lower end: 5.20.0, the FSDP2+EP floor (tf_adapter), fails",
            _NEWEST,
        ),
    ),
    KnownBug(
        key="fsdp-ep-overlapping-meshes",
        transformers=">=5.24",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24,
        layouts=("fsdp_ep",),
        checks=("load",),
        families=("gemma4_text", "diffusion_gemma_text"),
        raises="RuntimeError",
        match=r"Cannot concatenate overlapping meshes",
        cause="FSDP2+EP's fully_shard (transformers/distributed/fsdp.py) concatenates the fsdp mesh with the ep mesh "
        "over the same ranks: the EP plan's TP styles for the dense MLP leave DTensors on the ep mesh",
        reproduced="upstream/repros/sharded_load_errors_5_24.py gemma4_text|diffusion_gemma_text fsdp_ep, 5.24.0, "
        "2 CPU ranks",
        bisected=(
            _bisect(
                "5.20.0",
                "gemma4_text and test_fsdp_ep_moe",
                "good and bad give the same verdict (exit 2): 5.20.0 fails otherwise (ValueError: All-reduce "
                "expert parallelism requires `ep_size=tp_size`)",
            ),
            _bisect("5.20.0", "diffusion_gemma_text and test_fsdp_ep_moe", "the same (exit 2)"),
            "lower end: not found; only 5.24.0 is verified to fail this way, so a 5.21-5.23 cell shows its own verdict",
            _NEWEST,
        ),
    ),
    KnownBug(
        key="sarvam-fused-qkv-split",
        transformers=">=5.24",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24,
        layouts=("ep", "fsdp_ep"),
        checks=("load", "gradients"),
        families=("sarvam_moe",),
        raises="RuntimeError",
        match=r"issues during automatic conversion of the weights",
        cause="sharded loading splits the checkpoint's fused query_key_value by the targets' full sizes while the "
        "tensor holds one rank's share ('split_sizes to sum exactly to 128 ..., but got [128, 64, 64]')",
        reproduced="upstream/repros/sharded_load_errors_5_24.py sarvam_moe ep|fsdp_ep, 5.24.0, 2 CPU ranks",
        bisected=(
            "lower end: 5.24.0, the first release with sarvam_moe (no model folder in 5.23.0)",
            _NEW_IN_5_24,
            _NEWEST,
        ),
    ),
    KnownBug(
        key="fsdp-ep-conversion-on-shard",
        transformers=">=5.24",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24,
        layouts=("fsdp_ep",),
        checks=("load",),
        families=("lara_mini", "inkling2_loop_text"),
        raises="RuntimeError",
        # the first failing rank says one or the other
        match=r"issues during automatic conversion of the weights|You set `ignore_mismatched_sizes` to `False`",
        cause="FSDP2+EP loading runs a checkpoint conversion on an already sharded tensor (lara_mini's fused "
        "in_proj_qkv split by full sizes; inkling2_loop's merged message_input.query [12, 4, 64] for a [6, 4, 64] "
        "shard)",
        reproduced="upstream/repros/sharded_load_errors_5_24.py lara_mini|inkling2_loop_text fsdp_ep, 5.24.0, "
        "2 CPU ranks",
        bisected=(
            "lower end: 5.24.0, the first release with lara_mini and inkling2_loop_text (no model folders in 5.23.0)",
            _NEW_IN_5_24,
            _NEWEST,
        ),
    ),
    KnownBug(
        key="dots3-per-layer-qk-rope",
        transformers=">=5.23",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24,
        layouts=("ep",),
        checks=("load", "gradients"),
        families=("dots3_note_text",),
        raises="AmbiguousGlobalPerLayerAttributeError",
        match=r"'qk_rope_head_dim' is a per-layer attribute",
        cause="tensor_parallel.transform_output_post_forward reads config.qk_rope_head_dim, a per-layer attribute",
        reproduced="upstream/repros/sharded_load_errors_5_24.py dots3_note_text ep, 5.24.0, 2 CPU ranks",
        bisected=(
            _bisect(
                "5.23.0",
                "dots3_note_text and test_ep_load_and_logits",
                "good and bad give the same verdict: 5.23.0 fails the same way (exit 2); 2 probes, 49s",
            ),
            "lower end: 5.23.0, the first release declaring EP for dots3_note_text, fails",
            _NEWEST,
        ),
    ),
    KnownBug(
        key="glm5-next-o-proj-rowwise",
        transformers=">=5.23",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24,
        layouts=("ep",),
        checks=("load", "gradients"),
        families=("glm5_next_text",),
        raises="RuntimeError",
        match=r"mat1 and mat2 shapes cannot be multiplied|shape '\[\d+, \d+\]' is invalid for input of size \d+",
        cause="the TP plan's 'layers.*.self_attn.o_proj: rowwise' also matches the linear-attention layers' o_proj, "
        "whose input is not column-sharded",
        reproduced="upstream/repros/sharded_load_errors_5_24.py glm5_next_text ep, 5.24.0, 2 CPU ranks",
        bisected=(
            _bisect(
                "5.17.0",
                "glm5_next_text and test_ep_load_and_logits",
                "first bad: transformers 5.23.0 (last good 5.22.2); 6 probes, 660s",
            ),
            _NEWEST,
        ),
    ),
    _INKLING_BARE_ASSERT,
    # the same bare assert for muse_spark_text, which raises it on torch 2.11 too (inkling_text: the entry below)
    dataclasses.replace(
        _INKLING_BARE_ASSERT,
        key="muse-spark-dtensor-rmsnorm-bare-assert",
        families=("muse_spark_text",),
        transformers=">=5.23",  # live: 5.25.0 fixed inkling_text's, not this one
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24,
        bisected=_INKLING_MUSE_BISECTED,
    ),
    KnownBug(
        key="inkling-dtensor-rmsnorm-mixed",
        transformers=">=5.23,<5.25",
        torch=">=2.11,<2.13",  # torch 2.13.0 raises the bare AssertionError of the entry above instead
        torch_verified="2.11.0 only: the GPU host's CPU, transformers 5.24.0, gloo: both inkling_text EP cases "
        "failed with this message, 2026-12-02 (muse_spark_text raised the bare AssertionError there, as on 2.13)",
        layouts=("ep",),
        checks=("load", "gradients"),
        families=("inkling_text",),
        raises="RuntimeError",
        # torch's C++ DTensor dispatch says "aten.mul.Tensor got mixed ...", its Python one "aten.mul.Tensor: got ..."
        match=r"^aten\.mul\.Tensor:? got mixed torch\.Tensor and DTensor",
        cause="a DTensor leaves a TP-sharded module and reaches a plain RMSNorm (InklingRMSNorm): on torch 2.11 "
        "the norm's weight times the DTensor hidden states is refused as mixed torch.Tensor and DTensor",
        reproduced="the suite on torch 2.11.0 with transformers 5.24.0 (the GPU host's CPU, 2 gloo ranks, "
        "2026-12-02): test_ep_load_and_logits and test_ep_gradients[inkling_text-grouped_mm-2-float32]; the mixed "
        "multiply alone raises it on torch 2.11.0 (the GPU image, 1 gloo rank)",
        bisected=(
            "lower end: 5.23.0, where the torch 2.13.0 bisects of the entry above find these families first fail "
            "(EP shards their dense weights with the TP plan from there); not bisected on torch 2.11",
            "upper end: 5.25.0 passes on torch 2.11.0 (the strict XPASS of the release-day replay on the GPU host's "
            "CPU, 2026-12-06), as the torch 2.13.0 twin above, whose bisect found it first good; not bisected on "
            "torch 2.11",
        ),
    ),
    KnownBug(
        key="ep-without-tp-plan",
        transformers=">=5.23",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24,
        layouts=("ep",),
        checks=("load", "gradients"),
        families=("openai_privacy_filter", "zaya"),
        raises="ValueError",
        match=r"has no `tp_plan`",
        cause="the config declares an EP plan but no TP plan, and from 5.23 EP beside replicated dense weights is "
        "refused: EP cannot be used at all",
        reproduced="upstream/repros/sharded_load_errors_5_24.py openai_privacy_filter ep, 5.24.0, 2 CPU ranks; "
        "upstream/repros/zaya_ep_without_tp_plan.py (ep_size=2 with tp_size=2 raises this; alone, `ep_size` must "
        "divide `fsdp_size * tp_size`), 5.24.0, 2 CPU ranks",
        bisected=(
            _bisect(
                "5.7.0",
                "openai_privacy_filter and test_ep_load_and_logits",
                "first bad: transformers 5.23.0 (last good 5.22.2); 7 probes, 263s",
            ),
            _bisect("5.22.2", "test_training_steps and zaya-ep-2",
                    "first bad: transformers 5.23.0 (last good 5.22.2); 3 probes, 71s"),
            _NEWEST,
        ),
    ),
)


# What the training layer (training/steps.py) found: bugs that one forward and backward never shows.
# Every EP family whose TP plan gives its attention norms `replicated_with_grad_allreduce` (at 5.24.0, measured:
# these are the declared families whose EP training case failed so, float32, 2 gloo ranks).
_GRAD_ALLREDUCE_FAMILIES = (
    "beam", "diffusion_gemma_text", "dots1", "exaone_moe", "gemma4_text", "hy_v3", "kolibri1", "laguna", "lara_mini",
    "mellum", "qwen3_5_moe_text", "qwen3_moe", "qwen3_next", "qwen3_omni_moe_talker_text",
)
_CLIP_EP = "harness bisect --package transformers -- -k 'test_training_clips_with_torch_clip_grad_norm and mixtral-ep'"
_CLIP_FSDP_EP = ("harness bisect --package transformers -- -k "
                 "'test_training_clips_with_torch_clip_grad_norm and mixtral-fsdp_ep'")
_FUSED_EP = "harness bisect --package transformers -- -k 'test_training_optimizer_kernels and mixtral-ep-fused'"
# The GPU host's own CPU, torch 2.11.0+cu130 with transformers 5.24.0 carried as a wheel, HARNESS_CPU_RANKS=8,
# `pytest tests/gpu/test_training.py -k "not wide"` (worlds 2, 4 and 8), 2026-12-03: the training entries so marked
# failed there as on 2.13.0 (torch 2.11 writes "aten.op: got mixed", with a colon).
RUN_ON_2_11_WITH_5_24_TRAINING = (
    "2.13.0 (the bisects) and 2.11.0 (the GPU host's CPU, transformers 5.24.0, gloo, worlds 2-8: the covered "
    "cases failed with this entry's type and message, 2026-12-03); 2.12 between them not run"
)
_TRAINING_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        key="replicated-grad-allreduce-training",
        transformers=">=5.23",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24_TRAINING,
        layouts=("ep",),
        checks=("train",),
        families=_GRAD_ALLREDUCE_FAMILIES,
        raises="AssertionError",
        match=r"^step 1: gradients differ from the whole model's: .*self_attn\.[qk]_norm\.weight .*"
        r"\(accumulated over 2 micro-batches\)$",
        cause="the 'replicated_with_grad_allreduce' parallel style (ReplicatedWithGradAllReduce) all-reduces "
        "param.grad in a post-accumulate-grad hook after every backward: with gradient accumulation it sums the "
        "whole accumulated gradient again, so the first micro-batch's q/k norm gradient counts world-size times",
        reproduced="upstream/repros/ep_grad_allreduce_accumulation.py: Qwen3-MoE q/k norm gradients' largest "
        "relative error 7.17e-07 with 1 micro-batch, 0.988 with 2 (every other parameter 7.19e-07), 5.24.0, 2 CPU "
        "ranks; upstream/repros/qwen3_omni_talker_ep_grad_allreduce_accumulation.py: the talker's, 4.5e-05 with 1, "
        "0.472 with 2",
        bisected=(
            _bisect("5.22.2", "test_training_steps and qwen3_moe-ep-2-float32",
                    "first bad: transformers 5.23.0 (last good 5.22.2); 3 probes, 190s"),
            _bisect("5.22.2", "test_training_steps and qwen3_omni_moe_talker_text-ep-2",
                    "first bad: transformers 5.23.0 (last good 5.22.2); 3 probes, 56s"),
            _NEWEST,
        ),
    ),
    KnownBug(
        key="text-config-qk-norm-training",
        transformers=">=5.23",
        torch=TORCH_2_13_ONLY,
        torch_verified=RUN_ON_2_13_ONLY,
        layouts=("ep",),
        checks=("train",),
        families=("qwen3_vl_moe_text", "qwen3_omni_moe_text"),
        raises="AssertionError",
        match=r"^step 1: parameter \S*self_attn\.[qk]_norm\.weight differs across ranks",
        cause="the one-step entry's bug (the text configs' TP plan lacks q_norm/k_norm "
        "'replicated_with_grad_allreduce'), seen in training: each rank updates its replicated q/k norm with its "
        "own half of the gradient, so the replicas part after the first step",
        reproduced="upstream/repros/qwen3_vl_omni_ep_qk_norm_gradients.py FAMILY (the gradients); in the suite "
        "layers.0.self_attn.q_norm.weight differs by 0.000999 between the ranks after step 1, 5.24.0, 2 CPU ranks",
        bisected=(
            _bisect("5.22.2", "test_training_steps and qwen3_vl_moe_text-ep-2-float32",
                    "first bad: transformers 5.23.0 (last good 5.22.2); 3 probes, 81s"),
            _NEWEST,
        ),
    ),
    KnownBug(
        key="ep-clip-grad-norm-mixed-dtensor",
        transformers=">=5.16",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24_TRAINING,
        layouts=("ep",),
        checks=("torch_clip",),
        raises="RuntimeError",
        match=r"^aten\._foreach_norm\.Scalar:? got mixed torch\.Tensor and DTensor",
        cause="an EP model holds DTensor parameters (experts; from 5.23 the TP-sharded dense weights) beside plain "
        "tensors (norms, routers): torch.nn.utils.clip_grad_norm_ takes every gradient in one foreach norm and "
        "refuses the mix (with foreach=False: 'All operands in aten.stack.default must have the same mesh')",
        reproduced="upstream/repros/ep_mixed_meshes_clip_and_fused_adamw.py ep: 14 DTensor and 11 plain "
        "parameters, clip_grad_norm_ raises with foreach and without, 5.24.0, 2 CPU ranks",
        bisected=(
            f"{_CLIP_EP} --good 5.13.0 --bad 5.24.0: the good end fails, otherwise: step 1: parameter "
            "model.embed_tokens.weight differs across ranks (as at 5.15.0: replicas part before the clip)",
            f"{_CLIP_EP} --good 5.16.0 --bad 5.17.0, --good 5.17.0 --bad 5.18.0, --good 5.18.0 --bad 5.22.2, "
            "--good 5.22.2 --bad 5.24.0: each good end fails this way (RuntimeError: aten._foreach_norm.Scalar got "
            "mixed torch.Tensor and DTensor); 1 probe each, 22-32s",
            "lower end: 5.16.0, the first release probed after 5.15.0 (which fails before the clip)",
            _NEWEST,
        ),
    ),
    KnownBug(
        key="fsdp-ep-clip-grad-norm-meshes",
        transformers=">=5.20",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24_TRAINING,
        layouts=("fsdp_ep",),
        checks=("torch_clip",),
        raises="RuntimeError",
        match=r"^All operands in aten\.stack\.default must have the same mesh",
        cause="an FSDP2+EP model's parameters live on two meshes (the experts on efsdp x ep, the rest on fsdp): "
        "torch.nn.utils.clip_grad_norm_ stacks their norms as one DTensor and refuses meshes that differ",
        reproduced="upstream/repros/ep_mixed_meshes_clip_and_fused_adamw.py fsdp_ep: 25 DTensor parameters on "
        "DeviceMesh((efsdp=1, ep=2)) and DeviceMesh((fsdp=2)), clip_grad_norm_ raises with foreach and without, "
        "5.24.0, 2 CPU ranks",
        bisected=(
            f"{_CLIP_FSDP_EP} --good 5.20.0 --bad 5.24.0: the good end fails this way; 1 probe, 78s",
            "lower end: 5.20.0, the FSDP2+EP floor, fails so",
            _NEWEST,
        ),
    ),
    KnownBug(
        key="ep-fused-adamw-mixed-dtensor",
        transformers=">=5.16",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24_TRAINING,
        layouts=("ep",),
        checks=("fused_adamw",),
        raises="RuntimeError",
        match=r"^aten\._fused_adamw_\.default:? got mixed torch\.Tensor and DTensor",
        cause="the EP model's DTensor parameters beside plain tensors (as for clip_grad_norm_): "
        "torch.optim.AdamW(fused=True) steps every parameter in one fused call and refuses the mix",
        reproduced="upstream/repros/ep_mixed_meshes_clip_and_fused_adamw.py ep: AdamW(fused=True).step() raises, "
        "5.24.0, 2 CPU ranks (FSDP2+EP, all DTensors, steps)",
        bisected=(
            f"{_FUSED_EP} --good 5.13.0 --bad 5.24.0: the good end fails, otherwise: step 1: parameter "
            "model.embed_tokens.weight differs across ranks",
            f"{_FUSED_EP} --good 5.16.0 --bad 5.17.0, --good 5.22.2 --bad 5.24.0: each good end fails this way; "
            "1 probe each, 13-19s",
            "lower end: 5.16.0, as for clip_grad_norm_",
            _NEWEST,
        ),
    ),
    KnownBug(
        key="fully-shard-save-pretrained",
        transformers=">=5.1",
        torch=TORCH_2_11_AND_2_13,
        torch_verified="2.13.0 (the bisect) and 2.11.0 (the GPU host's CPU, transformers 5.24.0 carried, 2 gloo "
        "ranks: test_save_pretrained_after_training_loads_back_whole[qwen3-fully_shard] failed so, 2026-12-03); "
        "2.12 between them not run",
        layouts=("fully_shard",),
        checks=("save_pretrained",),
        raises="RuntimeError",
        match=r"^Attempted to access the data pointer on an invalid python storage",
        cause="save_pretrained gathers sharded weights only for a model loaded with a distributed_config "
        "(gather_sharded_state_dict_for_save); a model sharded by the user with torch's fully_shard reaches "
        "safetensors with its DTensor shards, whose storage it cannot read",
        reproduced="upstream/repros/fully_shard_save_pretrained.py: tiny Qwen3, fully_shard on 2 gloo ranks, "
        "save_pretrained raises on rank 0 (every rank up to 5.13); with state_dict=get_model_state_dict(..., "
        "full_state_dict=True) it saves, 5.24.0; by hand also 5.6.0, 5.13.0, 5.20.0, 5.22.2, 5.23.0",
        bisected=(
            "harness bisect --package transformers --good 5.0.0 --bad 5.6.0 -- -k "
            "'test_save_pretrained_after_training_loads_back_whole and qwen3-fully_shard': first bad: transformers "
            "5.1.0 (last good 5.0.0); 5 probes, 310s (--good 4.57.6 cannot run the case: the suite's loading passes "
            "experts_implementation, which 4.57's Qwen3 refuses)",
            "upper end: none, the bug is live (5.24.0, the newest release then, fails so: the suite's own run and "
            "the repro)",
        ),
    ),
)


KNOWN_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        key="ep-eager-sentinel-one-hot",
        transformers=">=5.7,<5.18",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_AND_2_13,
        layouts=("ep",),
        checks=("logits", "gradients"),
        implementations=("eager",),
        raises="RuntimeError",
        match=r"Class values must be smaller than num_classes",
        cause="eager experts one-hot the EP router's sentinel expert id: 'Class values must be smaller than "
        "num_classes'",
        reproduced="upstream/repros/ep_experts_implementations_sentinel.py eager: raises at 5.7.0 and 5.17.0, "
        "not at 5.18.0, on 2 CPU ranks",
        bisected=_EP_SENTINEL_BISECTED,
    ),
    KnownBug(
        key="ep-batched-mm-router-gradient",
        transformers=">=5.7,<5.18",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_AND_2_13,
        layouts=("ep",),
        checks=("gradients",),
        implementations=("batched_mm",),
        raises="AssertionError",
        match=r"^gradients differ from the whole model's: .*\.(gate|router)\.weight",  # the router's gradient
        cause="batched_mm experts under EP give the router a wrong gradient (relative error 0.5-1.1)",
        reproduced="upstream/repros/ep_experts_implementations_sentinel.py batched_mm: router gradient error 0.6-0.8 "
        "at 5.7.0, 1.11 at 5.17.0, 0 at 5.18.0, on 2 CPU ranks",
        bisected=_EP_SENTINEL_BISECTED,
    ),
    KnownBug(
        key="gpt-oss-eager-sentinel-5-18",
        transformers=">=5.18,<5.19",
        torch=TORCH_2_13_ONLY,
        torch_verified=RUN_ON_2_13_ONLY,
        layouts=("ep",),
        checks=("logits", "gradients"),
        families=("gpt_oss",),
        implementations=("eager",),
        raises="RuntimeError",
        match=r"Class values must be smaller than num_classes",
        cause="GPT-OSS eager experts still one-hot the EP sentinel expert id one release after the other "
        "families' fix (at inference and in training): 'Class values must be smaller than num_classes'",
        reproduced="upstream/repros/gpt_oss_eager_ep_one_hot.py: raises at 5.18.0, not at 5.19.0 or 5.20.0, on 2 "
        "CPU ranks",
        bisected=(
            'harness bisect --package transformers --good 5.18.0 --bad 5.17.0 -- -k "(test_ep_load_and_logits and '
            'eager-2-float32) or (test_ep_gradients and batched_mm-2-float32)": both fail (exit 2); at 5.17.0 every '
            "family's eager logits and batched_mm gradients fail, at 5.18.0 only gpt_oss's eager logits; 2 probes, "
            "291s",
            "lower end: 5.18.0, where the entry above (the same failure for every family) ends",
            'harness bisect --package transformers --good 5.20.0 --bad 5.18.0 -- -k "test_ep_load_and_logits and '
            'gpt_oss-eager-2-float32": first good: transformers 5.19.0 (last bad 5.18.0); 3 probes, 205s',
            'harness bisect --package transformers --good 5.19.0 --bad 5.18.0 -- -k "test_ep_gradients and '
            'gpt_oss-eager-2-float32": first good: transformers 5.19.0 (last bad 5.18.0); 2 probes, 81s',
        ),
    ),
    KnownBug(
        key="fsdp-ep-half-expert-gradients",
        transformers=">=5.20,<5.23",
        torch=TORCH_2_13_ONLY,
        torch_verified=RUN_ON_2_13_ONLY,
        layouts=("fsdp_ep",),
        checks=("gradients",),
        raises="AssertionError",
        match=r"^gradients differ from the whole model's: .*\(0\.5 times the whole model's gradient\)",
        cause="FSDP2 + EP expert gradients (and expert biases) are exactly 0.5x the whole model's on 2 ranks",
        reproduced="upstream/repros/fsdp_ep_expert_gradients_halved.py: ratio 0.5 at 5.20.0 and 5.22.2, 1.0 at "
        "5.23.0 and 5.24.0, on 2 CPU ranks",
        bisected=(
            'harness bisect --package transformers --good 5.19.0 --bad 5.20.0 -- -k "test_fsdp_ep_moe and '
            'qwen3_moe-2-float32": 5.19.0 untestable (needs transformers>=5.20.0 for FSDP2 with expert '
            "parallelism), exit 2; 1 probe, 169s",
            "lower end: 5.20.0, the FSDP2 + EP floor (tf_adapter), fails (the upper bisect's bad end)",
            'harness bisect --package transformers --good 5.24.0 --bad 5.20.0 -- -k "test_fsdp_ep_moe and '
            'qwen3_moe-2-float32": first good: transformers 5.23.0 (last bad 5.22.2); 6 probes, 806s',
        ),
    ),
    KnownBug(
        key="gpt-oss-eager-sentinel-all-reduce-ep",
        transformers=">=5.23",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24,
        layouts=("ep",),
        checks=("logits",),
        families=("gpt_oss",),
        implementations=("eager",),
        raises="RuntimeError",
        match=r"Class values must be smaller than num_classes",
        cause="GPT-OSS eager experts one-hot the EP sentinel expert id at inference (AllReduceEP): "
        "'Class values must be smaller than num_classes'",
        reproduced="upstream/repros/gpt_oss_eager_ep_one_hot.py: raises at 5.23.0 and 5.24.0, not at 5.22.2, "
        "on 2 CPU ranks",
        bisected=(
            'harness bisect --package transformers --good 5.20.0 --bad 5.24.0 -- -k "test_ep_load_and_logits and '
            'gpt_oss-eager-2-float32": first bad: transformers 5.23.0 (last good 5.22.2); 6 probes, 493s',
            "upper end: none, the bug is live; 5.24.0, the newest release when it was bisected, still fails (the "
            "gptoss bisect's bad end)",
        ),
    ),
    # Found by the wide sweep of every declared family (issue 21). Bisected on torch 2.13.0 CPU, 2 gloo ranks,
    # fp32, `--env-dir` shared; the EP ones all start at 5.23.0, where EP of a family must shard its dense
    # weights with the family's TP plan (tf_adapter.FIRST_REFUSING_REPLICATED_DENSE_EP), so each TP plan is applied.
    *_WIDE_SWEEP_BUGS,
    # Found by the one-device tier on the H200 (issue 29): a torch kernel bug that only a GPU shows.
    KnownBug(
        key="deepseek-v3-cuda-sdpa-offset",
        transformers=None,  # torch's bug: every transformers release that reaches the kernel shows it
        torch=">=2.11",
        torch_verified="2.11.0+cu130 only (the H200 image, cuDNN 9.19); not bisected in torch: the bug needs CUDA, "
        "and the GPU host has this one CUDA torch, no network, and a run carries at most 64 MiB (a CUDA torch wheel "
        "is GBs)",
        layouts=("one_device",),  # device_cases.LAYOUT
        checks=("logits",),
        families=("deepseek_v3",),
        dtypes=("bfloat16",),
        devices=("cuda",),
        raises="AssertionError",
        match=r"^logits differ from the whole model's: \d+ of \d+ values farther than",
        cause="CUDA scaled_dot_product_attention takes a bfloat16 value view whose storage offset is not 16-byte "
        "aligned (MLA splits keys and values out of one projection; qk_nope_head_dim 4): torch's own choice, cuDNN "
        "attention, returns wrong rows, and flash and memory-efficient attention raise 'CUDA error: misaligned "
        "address'",
        reproduced="upstream/repros/cuda_sdpa_misaligned_value.py on the H200, torch 2.11.0+cu130: default "
        "(cuDNN) max error 4.27, MATH 0.00628, the value made contiguous 0.00628, float32 right with every kernel "
        "(2026-12-03); in the suite 171 of 16384 logits off by up to 0.71 against a bound of 0.311",
        bisected=(
            "lower end: 5.17.0, the oldest release of the matrices (the GPU image's), fails so; the bug is torch's, "
            "so no transformers bisect was run",
            "upper end: none, the bug is live (5.24.0, the newest release then, carried to the GPU host, fails so)",
        ),
    ),
    *_TRAINING_BUGS,
)


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


# ---------------------------------------------------------------- below the EP layout's floor (families.EARLY_EP)
# The families whose configs declare an EP plan before 5.7.0 (ep_plan_history.json), run from that release: what the
# wide EP training case `test_training_steps[<family>-ep-2-float32-wide]` (grouped_mm) meets at 5.6.0-5.16.1, torch
# 2.13.0 CPU, 2 gloo ranks, fp32. `harness bisect` reads a probe's verdict, not its message: where one failing range
# holds two failures, the release between them comes from `harness run` of each release (the index has no release
# between 5.7.0 and 5.8.0). gemma4_text's 5.6-5.15 gradients were read with the gradient check taking a rank's
# plain-tensor TP shard as check_load does (rank_cases.tp_chunk; not in the suite yet: without it those releases stop
# at `gradient of model.layers.0.mlp.gate_proj.weight has shape (64, 64), the whole model's (128, 64)`).
_EARLY_BISECT = "harness bisect --package transformers --good 5.17.0 --bad {bad} -- -k 'test_training_steps and {case}'"
_EARLY_RUN = ("harness run --matrix M -- -k 'test_training_steps and {case}' (M: cpu, 2 ranks, torch 2.13.0, "
              "transformers {releases})")
_EARLY_RELEASE_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        key="opf-router-gradients-early",
        transformers=">=5.6,<5.17",
        torch=TORCH_2_13_ONLY,
        torch_verified=RUN_ON_2_13_ONLY,
        layouts=("ep",),
        checks=("gradients",),
        families=("openai_privacy_filter",),
        raises="AssertionError",
        match=r"^gradients differ from the whole model's: .*mlp\.router\.(weight|bias) \d",
        cause="under the EP plan every gradient is wrong, the router's the most (relative error 0.6-0.85), the logits "
        "right: each rank's router and dense gradients keep only its own experts' share",
        reproduced="upstream/repros/openai_privacy_filter_ep_gradients.py: router.weight gradient error 0.835 / "
        "0.454 (rank 0 / 1), 52 of 53 parameters above 1e-4, logits within 1e-6, at 5.6.0 and 5.8.0; 0.0022 at 5.17.0 "
        "(largest 0.0046), on 2 CPU ranks",
        bisected=(
            "lower end: 5.6.0, the family's first EP plan (ep_plan_history.json), fails so (the bisect's bad end; "
            "5.6.1 and 5.6.2 too, harness run)",
            _EARLY_BISECT.format(bad="5.6.0", case="openai_privacy_filter-ep-2")
            + ": first good: transformers 5.17.0 (last bad 5.16.1); 7 probes, 4 environments built, 240s",
        ),
    ),
    KnownBug(
        key="opf-expert-bias-nan-early",
        transformers=">=5.8,<5.17",
        torch=TORCH_2_13_ONLY,
        torch_verified=RUN_ON_2_13_ONLY,
        layouts=("ep",),
        checks=("gradients",),
        families=("openai_privacy_filter",),
        raises="AssertionError",
        match=r"^gradients differ from the whole model's: .*mlp\.experts\.gate_up_proj_bias (nan|\S+e\+\d+) ",
        cause="under the EP plan the experts' gate_up_proj_bias gradient is memory never written (NaN, or 1e+03 to "
        "1e+35), besides the wrong gradients of the entry above",
        reproduced="upstream/repros/openai_privacy_filter_ep_gradients.py: the largest gradient error 1.67e+07 "
        "(layers.2.mlp.experts.gate_up_proj_bias) at 5.8.0, 2.17 (a router) at 5.6.0, on 2 CPU ranks",
        bisected=(
            "lower end: " + _EARLY_RUN.format(case="openai_privacy_filter-ep-2", releases="5.7.0 and 5.8.0")
            + ": 5.7.0 fails with the routers first (the entry above), 5.8.0 with layers.2.mlp.experts."
            "gate_up_proj_bias 9.58e+15; no release between them; 5.9.0-5.16.1 fail with the bias NaN",
            _EARLY_BISECT.format(bad="5.6.0", case="openai_privacy_filter-ep-2")
            + ": first good: transformers 5.17.0 (last bad 5.16.1, bias NaN); 7 probes, 240s",
        ),
    ),
    KnownBug(
        key="gemma4-router-gradients-early",
        transformers=">=5.6,<5.17",
        torch=TORCH_2_13_ONLY,
        torch_verified=RUN_ON_2_13_ONLY,
        layouts=("ep",),
        checks=("gradients",),
        families=("gemma4_text",),
        raises="AssertionError",
        match=r"^gradients differ from the whole model's: .*\.router\.(per_expert_scale|proj\.weight|scale) \d",
        cause="under the EP plan the router's gradients are wrong (per_expert_scale 0.607, proj.weight 0.497), 63 of "
        "78 parameters' with them, the logits right",
        reproduced="upstream/repros/ep_before_5_7.py gemma4_text: largest gradient error 0.949, a router, at 5.6.0 "
        "and 5.7.0, on 2 CPU ranks; the suite's case the same at 5.6.0-5.7.0 and 5.16.0-5.16.1",
        bisected=(
            "lower end: 5.6.0, the family's first EP plan, fails so: "
            + _EARLY_RUN.format(case="gemma4_text-ep-2", releases="5.6.0, 5.6.1, 5.6.2, 5.7.0")
            + ", with the gradient check reading plain TP shards",
            _EARLY_BISECT.format(bad="5.16.0", case="gemma4_text-ep-2")
            + ": first good: transformers 5.17.0 (last bad 5.16.1); 3 probes, 45s",
        ),
    ),
    KnownBug(
        key="gemma4-nan-backward-early",
        transformers=">=5.8,<5.16",  # 5.16.0 fails without NaN (the router entry above)
        torch=TORCH_2_13_ONLY,
        torch_verified=RUN_ON_2_13_ONLY,
        layouts=("ep",),
        checks=("gradients",),
        families=("gemma4_text",),
        raises="AssertionError",
        match=r"^gradients differ from the whole model's: \d+ of \d+ parameters exceed their bound .*: "
        r"model\.per_layer_\S+ nan ",  # the NaN starts at gemma4's per-layer projection
        cause="under the EP plan the backward turns NaN (model.per_layer_projection_norm.weight, attention weights): "
        "the NaN gradients of openai_privacy_filter's entry above, from the same release",
        reproduced="the suite's case with the gradient check reading plain TP shards: 63 of 78 gradients NaN or off at "
        "5.8.0, 5.10.1, 5.13.0 and 5.15.0; 5.6.0-5.7.0 without NaN (the router entry above), on 2 CPU ranks",
        bisected=(
            "lower end: " + _EARLY_RUN.format(case="gemma4_text-ep-2", releases="5.7.0 and 5.8.0")
            + ", with the gradient check reading plain TP shards: 5.7.0 fails without NaN, 5.8.0 with; no release "
            "between them",
            "upper end: 5.15.0, the newest release run with that gradient check, fails so; 5.16.0 fails without NaN "
            "(the router entry above); 5.15.1 not run",
        ),
    ),
)
# What the deep training cases found running every experts implementation at older releases (2026-12-03).
_GROUPED_MM_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        key="ep-grouped-mm-router-gradient",
        transformers=">=5.7,<5.17",
        torch=TORCH_2_13_ONLY,
        torch_verified=RUN_ON_2_13_ONLY,
        layouts=("ep",),
        checks=("gradients",),
        implementations=("grouped_mm",),
        raises="AssertionError",
        match=r"^gradients differ from the whole model's: .*\.(gate|router)\.weight",  # the router's gradient
        cause="grouped_mm experts under EP give the router a wrong gradient (relative error 0.4-1.0), as batched_mm "
        "does (entry above), fixed one release earlier",
        reproduced="upstream/repros/ep_experts_implementations_sentinel.py grouped_mm: router gradient error 0.806 / "
        "0.616 (rank 0 / 1) at 5.7.0 and 5.13.0, on 2 CPU ranks",
        bisected=(
            "harness bisect --package transformers --good 5.7.0 --bad 5.13.0 -- -k 'test_training_steps and "
            "qwen3_moe-ep-2-float32-grouped_mm': the good end fails (gate.weight 0.657): 5.7.0, the EP layout's "
            "floor, is the lower end",
            "harness bisect --package transformers --good 5.17.0 --bad 5.16.0 -- -k 'test_training_steps and "
            "mixtral-ep-2-float32-grouped_mm': first good: transformers 5.17.0 (last bad 5.16.1); 3 probes, 44s",
        ),
    ),
)
# What the nightly tier's other experts implementations of the wide families found (test_config_switches.py's
# `exhaustive` cases, 2026-12-03).
_EXHAUSTIVE_TIER_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        transformers=">=5.23",
        torch=TORCH_2_13_ONLY,
        torch_verified=RUN_ON_2_13_ONLY,
        layouts=("ep",),
        checks=("logits",),
        families=("nemotron_h",),
        implementations=("eager",),
        raises="IndexError",
        match=r"index \d+ is out of bounds for dimension 0 with size \d+",
        key="nemotron-h-eager-ep-sentinel",
        cause="Nemotron-H's eager experts one-hot the EP sentinel expert id with a class of its own "
        "(num_classes=num_experts + 1) and then index it into the local expert stack (self.up_proj[num_local_experts])",
        reproduced="upstream/repros/nemotron_h_eager_ep_sentinel.py: raises at 5.23.0 and 5.24.0, not at 5.21.0 or "
        "5.22.2, on 2 CPU ranks",
        bisected=(
            'harness bisect --package transformers --good 5.22.2 --bad 5.24.0 -- -m "" -k '
            '"test_defaults_other_implementations_ep and nemotron_h-ep-eager": first bad: transformers 5.23.0 (last '
            "good 5.22.2); 3 probes, 45s",
            "upper end: none, the bug is live (5.24.0, the newest release then, still fails)",
        ),
    ),
)
# gpt_oss from its first EP release (ep_plan_history.json: 5.3.0) up to the EP layout's floor (5.7.0): every gpt_oss
# case of the suite run at 5.3.0, 5.4.0, 5.5.0, 5.5.4, 5.6.0 and 5.6.2 (torch 2.13.0, 2 CPU ranks, 2026-12-03).
_GPT_OSS_RUN = ("pytest tests/gpu -k gpt_oss in each release's harness environment "
                "(~/.cache/harness/envs/py3.11-torch2.13.0-tf<release>): {what}")
_GPT_OSS_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        transformers=">=5.3,<5.4",
        torch=TORCH_2_13_ONLY,
        torch_verified=RUN_ON_2_13_ONLY,
        layouts=("ep",),
        checks=("load",),
        families=("gpt_oss",),
        raises="UnboundLocalError",
        match=r"cannot access local variable 'tp_plan_alt'",
        key="gpt-oss-ep-tp-plan-alt-unbound",
        cause="EP loading of GPT-OSS, the release that first declares its EP plan, raises before any weight is read: "
        "'cannot access local variable 'tp_plan_alt' where it is not associated with a value'",
        reproduced=_GPT_OSS_RUN.format(what="every EP case raises at 5.3.0, on 2 CPU ranks"),
        bisected=(
            "harness bisect --package transformers --good 5.3.0 --bad 5.5.0 -- -k 'test_training_steps and "
            "gpt_oss-ep-2-float32-grouped_mm': the good end fails so: 5.3.0, gpt_oss's first EP release, is the "
            "lower end",
            "upper end: 5.3.0; 5.4.0 loads without raising (the entry below), no release between them",
        ),
    ),
    KnownBug(
        transformers=">=5.4,<5.6",
        torch=TORCH_2_13_ONLY,
        torch_verified=RUN_ON_2_13_ONLY,
        layouts=("ep",),
        checks=("load",),
        families=("gpt_oss",),
        raises="AssertionError",
        match=r"^load: rank \d+ holds \d+ experts of model\.layers\.\d+\.mlp\.experts\.\S+, expected \d+",
        key="gpt-oss-ep-experts-not-sharded",
        cause="EP loading of GPT-OSS hands the weight loader the TP plan instead of the EP plan: every rank holds all "
        "the experts of every stack (8 where its share is 4)",
        reproduced=_GPT_OSS_RUN.format(what="every EP case fails the load check at 5.4.0, 5.5.0 and "
                                       "5.5.4, on 2 CPU ranks"),
        bisected=(
            "lower end: 5.4.0 (5.3.0 raises first: the entry above)",
            "upper end: 5.5.4, the last 5.5 release; 5.6.0 and 5.6.2 shard the experts (the entries below)",
        ),
    ),
    KnownBug(
        transformers=">=5.6,<5.7",
        torch=TORCH_2_13_ONLY,
        torch_verified=RUN_ON_2_13_ONLY,
        layouts=("ep",),
        checks=("logits", "gradients"),
        families=("gpt_oss",),
        implementations=("eager",),
        raises="RuntimeError",
        match=r"Class values must be smaller than num_classes",
        key="gpt-oss-eager-ep-one-hot-5-6",
        cause="GPT-OSS eager experts one-hot the EP sentinel expert id (entry 0's bug, one release before its lower "
        "end there: 5.7.0 was the EP layout's floor)",
        reproduced="upstream/repros/gpt_oss_eager_ep_one_hot.py raises at 5.6.0 and 5.6.2, on 2 CPU ranks",
        bisected=(
            "lower end: 5.6.0 (5.5.4 fails at loading: the entry above)",
            "upper end: 5.6.2, the last 5.6 release; from 5.7.0 entry 0 holds it",
        ),
    ),
    KnownBug(
        transformers=">=5.6,<5.7",
        torch=TORCH_2_13_ONLY,
        torch_verified=RUN_ON_2_13_ONLY,
        layouts=("ep",),
        checks=("gradients",),
        families=("gpt_oss",),
        implementations=("grouped_mm", "batched_mm"),
        raises="AssertionError",
        match=r"^gradients differ from the whole model's: .*\.router\.(weight|bias)",
        key="gpt-oss-ep-router-gradients-5-6",
        cause="grouped_mm and batched_mm experts under EP give GPT-OSS's router a wrong gradient (relative error "
        "0.6-1.3: entries 1 and 27's bug, one release before their lower end: 5.7.0 was the EP layout's floor)",
        reproduced=_GPT_OSS_RUN.format(what="router.weight and router.bias 0.63-1.31 against bounds "
                                       "of 4e-06 at 5.6.0 and 5.6.2, float32 and bfloat16, on 2 CPU ranks"),
        bisected=(
            "lower end: 5.6.0 (5.5.4 fails at loading: the entry above)",
            "upper end: 5.6.2, the last 5.6 release; from 5.7.0 entries 1 and 27 hold it",
        ),
    ),
)
# ---------------------------------------------------------------- new in transformers 5.25.0
# What 5.25.0 changed, found by the suite on its release day (torch 2.13.0 CPU, 2 gloo ranks, fp32): each the only
# red of its case once the table's ranges stayed open. Each bisect ran with HARNESS_INSTALLER=pip and a shared
# --env-dir; the reproducers were written by `harness repro TEST_ID` and run alone (torch and transformers only).
_BISECT_5_25 = "harness bisect --package transformers --good 5.24.0 --bad 5.25.0 -- -k '{selection}': {answer}"
_FIRST_BAD_5_25 = "first bad: transformers 5.25.0 (last good 5.24.0); 2 probes, {seconds}s"
_NO_FOLDER_5_24 = "5.24.0 untestable: pytest collected no tests (no model folder there), exit 2; 1 probe, 14s"
_REPRO_5_25 = ("`harness repro 'tests/gpu/test_training.py::test_training_steps[{case}]'`, the script run alone (torch "
               "2.13.0 CPU, 2 gloo ranks, 5.25.0): exit 1, {what}")
_LIVE_AT_5_25 = "upper end: none, the bug is live (5.25.0, the newest release, fails so)"
RUN_ON_2_11_WITH_5_25 = (
    "2.13.0 (the bisects) and 2.11.0 (the GPU host's CPU, transformers 5.25.0, gloo, the release-day replay of "
    "2026-12-06: every covered case red before the entry existed, those read with this entry's type and message)"
)
_NEW_IN_5_25_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        key="grad-allreduce-training-new-tp-plans",
        transformers=">=5.25",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_25,
        layouts=("ep",),
        checks=("train",),
        families=("afmoe", "hunyuan_v1_moe", "lfm2_moe"),
        raises="AssertionError",
        match=r"^step 1: gradients differ from the whole model's: .*self_attn\.(?:[qk]_norm|query_layernorm|"
        r"key_layernorm|[qk]_layernorm)\.weight .*\(accumulated over 2 micro-batches\)$",
        cause="5.25.0 gives these families attention TP plans whose q/k norms are 'replicated_with_grad_allreduce' "
        "(5.24.0 had only expert TP styles), so the accumulation bug of replicated-grad-allreduce-training reaches "
        "them: the post-accumulate-grad all-reduce sums the whole accumulated q/k norm gradient again",
        reproduced=_REPRO_5_25.format(
            case="afmoe-ep-2-float32-wide",
            what="rank 0 'step 1: gradients differ ...: model.layers.1.self_attn.k_norm.weight 0.599 (its bound "
            "5.43e-06) ...', the one-backward gradient check before it within its bound; in the suite hunyuan_v1_moe "
            "(query_layernorm, key_layernorm: 0.53-0.56) and lfm2_moe (q_layernorm, k_layernorm: 0.63-0.69) fail so",
        ),
        bisected=(
            _BISECT_5_25.format(selection="test_training_steps and afmoe-ep-2",
                                answer=_FIRST_BAD_5_25.format(seconds=133)),
            _BISECT_5_25.format(selection="test_training_steps and hunyuan_v1_moe-ep-2",
                                answer=_FIRST_BAD_5_25.format(seconds=57)),
            _BISECT_5_25.format(selection="test_training_steps and lfm2_moe-ep-2",
                                answer=_FIRST_BAD_5_25.format(seconds=67)),
            _LIVE_AT_5_25,
        ),
    ),
    KnownBug(
        key="dots3-vision-tp-plan-dropped",
        transformers=">=5.25",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_25,
        layouts=("ep",),
        checks=("load", "gradients"),
        families=("dots3_note_vision_encoder",),
        raises="ValueError",
        match=r"has no `tp_plan`",
        cause="5.25.0 drops every 'moe_tp_experts' style from the TP plans, which leaves Dots3NoteVisionConfig's "
        "base_model_tp_plan empty while its EP plan stays: EP beside replicated dense weights is refused (from "
        "5.23), so the vision encoder that loaded expert-parallel at 5.24.0 cannot at all",
        reproduced="upstream/repros/dots3_vision_ep_without_tp_plan.py: both ranks raise it at 5.25.0 (its "
        "base_model_tp_plan {}), both load at 5.24.0, torch 2.13.0 CPU (`harness repro` refuses this case: the "
        "encoder is fed pixel patches)",
        bisected=(
            _BISECT_5_25.format(selection="test_training_steps and dots3_note_vision_encoder-ep-2",
                                answer=_FIRST_BAD_5_25.format(seconds=53)),
            _LIVE_AT_5_25,
        ),
    ),
    KnownBug(
        key="param2moe-fused-qkv-split",
        transformers=">=5.25",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_25,
        layouts=("ep", "fsdp_ep"),
        checks=("load", "gradients"),
        families=("param2moe",),
        raises="RuntimeError",
        match=r"issues during automatic conversion of the weights",
        cause="sarvam-fused-qkv-split in a family new in 5.25.0: sharded loading splits the checkpoint's fused "
        "query_key_value by the targets' full sizes while the tensor holds one rank's share ('split_sizes to sum "
        "exactly to 128 ..., but got [128, 64, 64]', destined for self_attn.q_proj.weight)",
        reproduced=_REPRO_5_25.format(
            case="param2moe-ep-2-float32-wide",
            what="rank 1 RuntimeError 'We encountered some issues during automatic conversion of the weights' at "
            "transformers/utils/loading_report.py:311",
        ),
        bisected=(
            "lower end: 5.25.0, the first release with param2moe (no model folder in 5.24.0)",
            _BISECT_5_25.format(selection="test_training_steps and param2moe-ep-2", answer=_NO_FOLDER_5_24),
            _LIVE_AT_5_25,
        ),
    ),
    KnownBug(
        key="ergo-fsdp-ep-shard-shapes",
        transformers=">=5.25",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_25,
        layouts=("fsdp_ep",),
        checks=("load",),
        families=("ergo",),
        raises="RuntimeError",
        match=r"You set `ignore_mismatched_sizes` to `False`",
        cause="FSDP2+EP loading of ergo (new in 5.25.0) gives its shared experts and router gate shards of another "
        "layout than the model's (load report: shared_experts.down_proj.weight ckpt [64, 16] vs model [32, 32], "
        "gate.linear.weight [8, 32] vs [4, 64]) and refuses them as mismatched sizes",
        reproduced=_REPRO_5_25.format(
            case="ergo-fsdp_ep-2-float32-wide",
            what="rank 0 RuntimeError 'You set `ignore_mismatched_sizes` to `False`' at "
            "transformers/utils/loading_report.py:316, the load report's MISMATCH rows as in the cause",
        ),
        bisected=(
            "lower end: 5.25.0, the first release with ergo (no model folder in 5.24.0)",
            _BISECT_5_25.format(selection="test_training_steps and ergo-fsdp_ep-2", answer=_NO_FOLDER_5_24),
            _LIVE_AT_5_25,
        ),
    ),
)
KNOWN_BUGS = (KNOWN_BUGS + _EARLY_RELEASE_BUGS + _GROUPED_MM_BUGS + _EXHAUSTIVE_TIER_BUGS + _GPT_OSS_BUGS
              + _NEW_IN_5_25_BUGS)


# A release day replayed: HARNESS_KNOWN_BUGS_AS_OF=V keeps the entries known when V was the newest transformers
# release (their range's lower end at or below V; a torch bug's entry always), so a run of the release after V
# shows what that morning would have: every red left is a change of the new release.
AS_OF_ENV = "HARNESS_KNOWN_BUGS_AS_OF"


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
    return tuple(bug for bug in bugs if first_bad(bug) is None or first_bad(bug) <= newest)


KNOWN_BUGS = known_as_of(KNOWN_BUGS, os.environ.get(AS_OF_ENV))
