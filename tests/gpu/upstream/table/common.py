"""What entries of several groups say alike: the torch releases an entry was run on, and the bisect of 5.24.0."""

from __future__ import annotations

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
LIVE_AT_5_24 = "upper end: none, the bug is live (5.24.0, the newest release when it was bisected, still fails)"


def bisect_to_5_24(good: str, selection: str, answer: str) -> str:
    return f"harness bisect --package transformers --good {good} --bad 5.24.0 -- -k '{selection}': {answer}"

