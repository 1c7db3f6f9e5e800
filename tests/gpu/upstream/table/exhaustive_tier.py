"""What the nightly's exhaustive tier (every switch, FSDP2+EP, every implementation) found."""

from __future__ import annotations

from checks.kinds import Check, Layout

from upstream.entry import KnownBug
from upstream.table.common import RUN_ON_2_13_ONLY, TORCH_2_13_ONLY

# What the nightly tier's other experts implementations of the wide families found (test_config_switches.py's
# `exhaustive` cases, 2026-12-03).
_EXHAUSTIVE_TIER_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        transformers=">=5.23",
        torch=TORCH_2_13_ONLY,
        torch_verified=RUN_ON_2_13_ONLY,
        layouts=(Layout.EP,),
        checks=(Check.LOGITS,),
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

ENTRIES: tuple[KnownBug, ...] = _EXHAUSTIVE_TIER_BUGS
