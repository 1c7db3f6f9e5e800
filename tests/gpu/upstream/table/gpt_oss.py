"""One family from its first EP release (5.3.0) up to the EP layout's floor (5.7.0)."""

from __future__ import annotations

from checks.kinds import Check, Layout

from upstream.entry import KnownBug
from upstream.table.common import RUN_ON_2_13_ONLY, TORCH_2_13_ONLY

# gpt_oss from its first EP release (ep_plan_history.json: 5.3.0) up to the EP layout's floor (5.7.0): every gpt_oss
# case of the suite run at 5.3.0, 5.4.0, 5.5.0, 5.5.4, 5.6.0 and 5.6.2 (torch 2.13.0, 2 CPU ranks, 2026-12-03).
_GPT_OSS_RUN = ("pytest tests/gpu -k gpt_oss in each release's harness environment "
                "(~/.cache/harness/envs/py3.11-torch2.13.0-tf<release>): {what}")
_GPT_OSS_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        transformers=">=5.3,<5.4",
        torch=TORCH_2_13_ONLY,
        torch_verified=RUN_ON_2_13_ONLY,
        layouts=(Layout.EP,),
        checks=(Check.LOAD,),
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
        layouts=(Layout.EP,),
        checks=(Check.LOAD,),
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
        layouts=(Layout.EP,),
        checks=(Check.LOGITS, Check.GRADIENTS),
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
        layouts=(Layout.EP,),
        checks=(Check.GRADIENTS,),
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

ENTRIES: tuple[KnownBug, ...] = _GPT_OSS_BUGS
