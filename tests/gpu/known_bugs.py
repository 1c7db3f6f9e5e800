"""Known upstream bugs: cases that fail because torch or transformers is wrong, in one table.

Each entry was reproduced in a few lines outside the suite (tests/gpu/upstream_repros/, run by hand), and
its version range was bisected with `harness bisect` at both ends (the `bisected` field: each command and
its answer). The cases it covers are marked `xfail(strict=True)` with a reason starting
`known upstream bug: `, so the report lists them with their cause, but only for the failure the entry
names: the failing rank's exception type (`raises`) and a pattern its message matches (`match`). A covered
case that fails otherwise is red, saying it failed differently from its known bug; one that passes fails
saying `fixed upstream: remove the entry` (conftest.py). Every range ends at the newest release it was
verified on, so a newer release runs the case and shows whether the bug is still there.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass

from harness.contract import FIXED_UPSTREAM as FIXED_MESSAGE
from harness.contract import KNOWN_BUG_PREFIX as REASON_PREFIX  # what the report and triage read
from harness.ranks import RankFailedError

DIFFERENT_MESSAGE = "failed differently from its known bug"


class KnownBugFailure(Exception):
    """A covered case failed the way its entry says: the strict xfail's `raises`, so nothing else is xfailed."""


class DifferentFailure(AssertionError):
    """A covered case failed, but not the way its entry says: a red, not an xfail."""


@dataclass(frozen=True)
class KnownBug:
    package: str  # "transformers" or "torch"
    versions: str  # a PEP 440 specifier set of the releases that have it, bounded above, e.g. ">=5.13,<5.20"
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

    def explains(self, error: BaseException) -> bool:
        error_type, message = failure_of(error)
        return error_type == self.raises and re.search(self.match, message) is not None

    def verdict(self, error: Exception) -> Exception:
        """What a covered case raises in place of `error`: the bug the xfail expects, or a different failure."""
        error_type, message = failure_of(error)
        if self.explains(error):
            return KnownBugFailure(f"{REASON_PREFIX}{self.package} {self.versions}: {error_type}: {message}")
        return DifferentFailure(
            f"{DIFFERENT_MESSAGE} ({self.package} {self.versions}: {self.raises} matching {self.match!r}): "
            f"{error_type or 'no exception'}: {message}"
        )


def failure_of(error: BaseException) -> tuple[str | None, str]:
    """(exception type, first line of its message) of the failure itself: for the ranks fixture's error, the
    first failing rank's own exception as it travelled (type None: the rank died without one)."""
    if isinstance(error, RankFailedError):
        return error.error_type, error.error_message if error.error_message is not None else error.summary
    text = str(error).strip()
    return type(error).__qualname__, text.splitlines()[0] if text else ""


# Versions: what `harness bisect` measured at each end (torch 2.13.0 CPU, 2 gloo ranks, fp32); an upper end
# written `<=` is the newest release verified, not a fix; a lower end at a feature's floor (tf_adapter) is the
# first release that can run the case at all.
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
_NEWEST = "upper end: 5.24.0, the newest release on the index, still fails, so the range stops there"


def _bisect(good: str, selection: str, answer: str) -> str:
    return f"harness bisect --package transformers --good {good} --bad 5.24.0 -- -k '{selection}': {answer}"


# The families new in 5.24.0: one bisect shows there is nothing earlier to run.
_NEW_IN_5_24 = _bisect(
    "5.23.0",
    "(sarvam_moe or lara_mini or inkling2_loop_text or hy_v4_vl_text) and "
    "(test_fsdp_ep_moe or test_ep_load_and_logits)",
    "5.23.0 untestable: pytest collected no tests (no model folders there), exit 2; 1 probe, 45s",
)

_WIDE_SWEEP_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        package="transformers",
        versions=">=5.23,<=5.24.0",
        layouts=("ep",),
        checks=("gradients",),
        families=("qwen3_vl_moe_text", "qwen3_omni_moe_text"),
        raises="AssertionError",
        match=r"^gradients differ from the whole model's: .*self_attn\.[qk]_norm\.weight",
        cause="the text configs' base_model_tp_plan lacks q_norm/k_norm 'replicated_with_grad_allreduce' (Qwen3-MoE "
        "has it): under EP+TP each rank's q/k norm gradient covers its half of the heads",
        reproduced="upstream_repros/qwen3_vl_omni_ep_qk_norm_gradients.py FAMILY: per-rank q/k norm gradient errors "
        "0.40-1.02 at 5.24.0, on 2 CPU ranks",
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
            _NEWEST,
        ),
    ),
    KnownBug(
        package="transformers",
        versions=">=5.20,<=5.24.0",
        layouts=("fsdp_ep",),
        checks=("load",),
        families=("bailing_hybrid", "kimi_linear", "glm5_next_text"),
        raises="AssertionError",
        match=r"^load: rank \d+'s FSDP shard of \S*conv1d\.weight is not its share",
        cause="FSDP2+EP loading concatenates the checkpoint's q/k/v conv1d (Concatenate(dim=0)) per shard: each "
        "rank holds [q share | k share | v share], not its share of the whole conv1d",
        reproduced="upstream_repros/fsdp_ep_linear_attention_conv1d.py FAMILY: bailing_hybrid and glm5_next_text "
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
        package="transformers",
        versions=">=5.24,<=5.24.0",
        layouts=("fsdp_ep",),
        checks=("load",),
        families=("gemma4_text", "diffusion_gemma_text"),
        raises="RuntimeError",
        match=r"Cannot concatenate overlapping meshes",
        cause="FSDP2+EP's fully_shard (transformers/distributed/fsdp.py) concatenates the fsdp mesh with the ep mesh "
        "over the same ranks: the EP plan's TP styles for the dense MLP leave DTensors on the ep mesh",
        reproduced="upstream_repros/sharded_load_errors_5_24.py gemma4_text|diffusion_gemma_text fsdp_ep, 5.24.0, "
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
        package="transformers",
        versions=">=5.24,<=5.24.0",
        layouts=("ep", "fsdp_ep"),
        checks=("load", "gradients"),
        families=("sarvam_moe",),
        raises="RuntimeError",
        match=r"issues during automatic conversion of the weights",
        cause="sharded loading splits the checkpoint's fused query_key_value by the targets' full sizes while the "
        "tensor holds one rank's share ('split_sizes to sum exactly to 128 ..., but got [128, 64, 64]')",
        reproduced="upstream_repros/sharded_load_errors_5_24.py sarvam_moe ep|fsdp_ep, 5.24.0, 2 CPU ranks",
        bisected=(
            "lower end: 5.24.0, the first release with sarvam_moe (no model folder in 5.23.0)",
            _NEW_IN_5_24,
            _NEWEST,
        ),
    ),
    KnownBug(
        package="transformers",
        versions=">=5.24,<=5.24.0",
        layouts=("fsdp_ep",),
        checks=("load",),
        families=("lara_mini", "inkling2_loop_text"),
        raises="RuntimeError",
        # the first failing rank says one or the other
        match=r"issues during automatic conversion of the weights|You set `ignore_mismatched_sizes` to `False`",
        cause="FSDP2+EP loading runs a checkpoint conversion on an already sharded tensor (lara_mini's fused "
        "in_proj_qkv split by full sizes; inkling2_loop's merged message_input.query [12, 4, 64] for a [6, 4, 64] "
        "shard)",
        reproduced="upstream_repros/sharded_load_errors_5_24.py lara_mini|inkling2_loop_text fsdp_ep, 5.24.0, "
        "2 CPU ranks",
        bisected=(
            "lower end: 5.24.0, the first release with lara_mini and inkling2_loop_text (no model folders in 5.23.0)",
            _NEW_IN_5_24,
            _NEWEST,
        ),
    ),
    KnownBug(
        package="transformers",
        versions=">=5.23,<=5.24.0",
        layouts=("ep",),
        checks=("load", "gradients"),
        families=("dots3_note_text",),
        raises="AmbiguousGlobalPerLayerAttributeError",
        match=r"'qk_rope_head_dim' is a per-layer attribute",
        cause="tensor_parallel.transform_output_post_forward reads config.qk_rope_head_dim, a per-layer attribute",
        reproduced="upstream_repros/sharded_load_errors_5_24.py dots3_note_text ep, 5.24.0, 2 CPU ranks",
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
        package="transformers",
        versions=">=5.23,<=5.24.0",
        layouts=("ep",),
        checks=("load", "gradients"),
        families=("glm5_next_text",),
        raises="RuntimeError",
        match=r"mat1 and mat2 shapes cannot be multiplied|shape '\[\d+, \d+\]' is invalid for input of size \d+",
        cause="the TP plan's 'layers.*.self_attn.o_proj: rowwise' also matches the linear-attention layers' o_proj, "
        "whose input is not column-sharded",
        reproduced="upstream_repros/sharded_load_errors_5_24.py glm5_next_text ep, 5.24.0, 2 CPU ranks",
        bisected=(
            _bisect(
                "5.17.0",
                "glm5_next_text and test_ep_load_and_logits",
                "first bad: transformers 5.23.0 (last good 5.22.2); 6 probes, 660s",
            ),
            _NEWEST,
        ),
    ),
    KnownBug(
        package="transformers",
        versions=">=5.23,<=5.24.0",
        layouts=("ep",),
        checks=("load", "gradients"),
        families=("inkling_text", "muse_spark_text"),
        raises="AssertionError",
        match=r"^\(no message\)$",  # torch's DTensor _reduce_value asserts with no message
        cause="a DTensor leaves a TP-sharded module and reaches a plain RMSNorm (InklingRMSNorm, "
        "MuseSparkRMSNorm): torch's DTensor redistribute asserts in Partial._reduce_value",
        reproduced="upstream_repros/sharded_load_errors_5_24.py inkling_text|muse_spark_text ep, 5.24.0, "
        "2 CPU ranks, torch 2.13.0 (torch 2.11 raises 'aten.mul.Tensor got mixed torch.Tensor and DTensor')",
        bisected=(
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
        ),
    ),
    KnownBug(
        package="transformers",
        versions=">=5.23,<=5.24.0",
        layouts=("ep",),
        checks=("load", "gradients"),
        families=("openai_privacy_filter",),
        raises="ValueError",
        match=r"has no `tp_plan`",
        cause="the config declares an EP plan but no TP plan, and from 5.23 EP beside replicated dense weights is "
        "refused: EP cannot be used at all",
        reproduced="upstream_repros/sharded_load_errors_5_24.py openai_privacy_filter ep, 5.24.0, 2 CPU ranks",
        bisected=(
            _bisect(
                "5.7.0",
                "openai_privacy_filter and test_ep_load_and_logits",
                "first bad: transformers 5.23.0 (last good 5.22.2); 7 probes, 263s",
            ),
            _NEWEST,
        ),
    ),
)


KNOWN_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        package="transformers",
        versions=">=5.7,<5.18",
        layouts=("ep",),
        checks=("logits", "gradients"),
        implementations=("eager",),
        raises="RuntimeError",
        match=r"Class values must be smaller than num_classes",
        cause="eager experts one-hot the EP router's sentinel expert id: 'Class values must be smaller than "
        "num_classes'",
        reproduced="upstream_repros/ep_experts_implementations_sentinel.py eager: raises at 5.7.0 and 5.17.0, "
        "not at 5.18.0, on 2 CPU ranks",
        bisected=_EP_SENTINEL_BISECTED,
    ),
    KnownBug(
        package="transformers",
        versions=">=5.7,<5.18",
        layouts=("ep",),
        checks=("gradients",),
        implementations=("batched_mm",),
        raises="AssertionError",
        match=r"^gradients differ from the whole model's: .*\.(gate|router)\.weight",  # the router's gradient
        cause="batched_mm experts under EP give the router a wrong gradient (relative error 0.5-1.1)",
        reproduced="upstream_repros/ep_experts_implementations_sentinel.py batched_mm: router gradient error 0.6-0.8 "
        "at 5.7.0, 1.11 at 5.17.0, 0 at 5.18.0, on 2 CPU ranks",
        bisected=_EP_SENTINEL_BISECTED,
    ),
    KnownBug(
        package="transformers",
        versions=">=5.18,<5.19",
        layouts=("ep",),
        checks=("logits", "gradients"),
        families=("gpt_oss",),
        implementations=("eager",),
        raises="RuntimeError",
        match=r"Class values must be smaller than num_classes",
        cause="GPT-OSS eager experts still one-hot the EP sentinel expert id one release after the other "
        "families' fix (at inference and in training): 'Class values must be smaller than num_classes'",
        reproduced="upstream_repros/gpt_oss_eager_ep_one_hot.py: raises at 5.18.0, not at 5.19.0 or 5.20.0, on 2 "
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
        package="transformers",
        versions=">=5.20,<5.23",
        layouts=("fsdp_ep",),
        checks=("gradients",),
        raises="AssertionError",
        match=r"^gradients differ from the whole model's: .*\(0\.5 times the whole model's gradient\)",
        cause="FSDP2 + EP expert gradients (and expert biases) are exactly 0.5x the whole model's on 2 ranks",
        reproduced="upstream_repros/fsdp_ep_expert_gradients_halved.py: ratio 0.5 at 5.20.0 and 5.22.2, 1.0 at "
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
        package="transformers",
        versions=">=5.23,<=5.24.0",
        layouts=("ep",),
        checks=("logits",),
        families=("gpt_oss",),
        implementations=("eager",),
        raises="RuntimeError",
        match=r"Class values must be smaller than num_classes",
        cause="GPT-OSS eager experts one-hot the EP sentinel expert id at inference (AllReduceEP): "
        "'Class values must be smaller than num_classes'",
        reproduced="upstream_repros/gpt_oss_eager_ep_one_hot.py: raises at 5.23.0 and 5.24.0, not at 5.22.2, "
        "on 2 CPU ranks",
        bisected=(
            'harness bisect --package transformers --good 5.20.0 --bad 5.24.0 -- -k "test_ep_load_and_logits and '
            'gpt_oss-eager-2-float32": first bad: transformers 5.23.0 (last good 5.22.2); 6 probes, 493s',
            "upper end: none yet; 5.24.0, the newest release, still fails (the gptoss bisect's bad end), so the "
            "range stops there",
        ),
    ),
    # Found by the wide sweep of every declared family (issue 21). Bisected on torch 2.13.0 CPU, 2 gloo ranks,
    # fp32, `--env-dir` shared; the EP ones all start at 5.23.0, where EP of a family must shard its dense
    # weights with the family's TP plan (tf_adapter.FIRST_REFUSING_REPLICATED_DENSE_EP), so each TP plan is applied.
    *_WIDE_SWEEP_BUGS,
)


def installed_versions() -> dict[str, str]:
    import torch
    import transformers

    return {"transformers": transformers.__version__, "torch": torch.__version__.split("+")[0]}


def known_bug(case) -> KnownBug | None:
    """The table's entry covering `case` on the installed releases, if any."""
    installed = installed_versions()
    return next((bug for bug in KNOWN_BUGS if bug.covers(case, installed)), None)


@contextlib.contextmanager
def expecting(request, bug: KnownBug | None) -> Iterator[None]:
    """Marks the running test as `bug`'s strict xfail; a failure inside the block is the bug's (xfailed) or a
    different one (red). pytest's own outcomes (skip, xfail) and interrupts pass through unchanged."""
    if bug is None:
        yield
        return
    import pytest

    request.applymarker(pytest.mark.xfail(strict=True, reason=bug.reason, raises=KnownBugFailure))
    try:
        yield
    except Exception as error:
        raise bug.verdict(error) from error


def fixed_upstream_message(longrepr: str) -> str | None:
    """For pytest's strict-XPASS failure text of a known-bugs case, what to tell the reader instead; else None."""
    strict_xpass = "[XPASS(strict)] "
    if not longrepr.startswith(strict_xpass + REASON_PREFIX):
        return None
    return f"{strict_xpass}{FIXED_MESSAGE} in tests/gpu/known_bugs.py: {longrepr.removeprefix(strict_xpass)}"
