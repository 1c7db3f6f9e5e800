"""What the deep training cases found running every experts implementation at older releases."""

from __future__ import annotations

from checks.kinds import Check, Layout

from upstream.entry import KnownBug
from upstream.table.common import RUN_ON_2_13_ONLY, TORCH_2_13_ONLY

# What the deep training cases found running every experts implementation at older releases (2026-12-03).
_GROUPED_MM_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        key="ep-grouped-mm-router-gradient",
        transformers=">=5.7,<5.17",
        torch=TORCH_2_13_ONLY,
        torch_verified=RUN_ON_2_13_ONLY,
        layouts=(Layout.EP,),
        checks=(Check.GRADIENTS,),
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

ENTRIES: tuple[KnownBug, ...] = _GROUPED_MM_BUGS
