"""What one device tests, so a host with one GPU (or one CPU rank) still checks what it can.

- Each mechanics family's whole model on this rank's device, per experts implementation and dtype, against
  float64: on a GPU, CUDA's grouped_mm, batched_mm and eager kernels against the CPU's rounding; on the CPU the
  fused implementations against the eager loop (training/device_cases.py).
- Fake-quantized training (fp8, nvfp4) on the device: the same quantized bits as the CPU's, gradients within the
  bound.
- Hub kernels, where the release turns them on by default: a user's `from_pretrained(...).train()` kernelizes the
  model for its device; the kernelized model against float64 like any experts implementation. Not run where the
  kernels are not in the local cache of an offline cell, saying so (every other case runs with them off).
- torch's fully_shard on a mesh of one (world size 1): DTensor parameters, FSDP's unshard and reduce hooks, so a
  one-GPU host still trains through FSDP2's code. (transformers' EP and FSDP2 loading take no mesh of one: see
  below.)

None of these is distributed: a cell where only they ran says that nothing distributed ran.
"""

from __future__ import annotations

import pytest
from checks.kinds import Check, Layout
from loading import tf_adapter
from loading.tf_adapter import PORTABLE_EXPERTS_IMPLEMENTATIONS
from models import families

from harness.ranks.plugin import available_ranks

DEEP_MOE = families.deep_moe()
DTYPES = ("float32", "bfloat16")
# One rank on one device each: with --pack-tests on a GPU host several share a GPU (harness.ranks.gpushare). The
# tiny models' peaks are tens of MiB; 2 GiB leaves room for a kernel's workspace.
pytestmark = pytest.mark.one_device(peak_mib=2048)


def _on_gpu() -> bool:
    return available_ranks()[1] == "GPUs"


def _skip_where_the_subject_is_its_own_noise_sample(what: str) -> None:
    """On the CPU the noise sample is the eager model on the CPU: a subject computed the same way would be compared
    with itself, a check that cannot fail."""
    if not _on_gpu():
        pytest.skip(f"needs a GPU: on the CPU {what} is the noise sample itself")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("experts_implementation", PORTABLE_EXPERTS_IMPLEMENTATIONS)
@pytest.mark.parametrize("checkpoint", DEEP_MOE, indirect=True)
def test_experts_implementation_on_this_device(run_device_case, checkpoint, experts_implementation, dtype):
    """Routing as float64 decides it; logits and gradients within the stated multiple of the CPU's own rounding."""
    if experts_implementation == "eager":
        _skip_where_the_subject_is_its_own_noise_sample("the eager model")
    run_device_case(checkpoint, experts_implementation=experts_implementation, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("checkpoint", DEEP_MOE + families.dense(), indirect=True)
def test_hub_kernels_on_this_device(run_device_case, checkpoint, dtype):
    """The release's default path with Hub kernels on: routing as float64 decides it; logits and gradients within
    the stated multiple of the CPU's own rounding."""
    reason = tf_adapter.hub_kernels_not_run("cuda" if _on_gpu() else "cpu")
    if reason is not None:
        pytest.skip(reason)
    run_device_case(checkpoint, dtype=dtype, hub_kernels=True)


@pytest.mark.parametrize("recipe", ["fp8", "nvfp4"])
@pytest.mark.parametrize("checkpoint", families.role("quantized_moe") + families.role("quantized_dense"), indirect=True)
def test_quantized_training_on_this_device(run_device_case, checkpoint, recipe):
    """The device quantizes to the CPU's bits; the fake-quantized model's gradients within the bound."""
    if not families.family(checkpoint.family).is_moe:
        _skip_where_the_subject_is_its_own_noise_sample("the dense model")
    run_device_case(checkpoint, quant=recipe)


# transformers' own EP and FSDP2 loading take no mesh of one: with every size 1, from_pretrained returns before it
# builds a mesh (distributed/mixin.py, prepare_distribute_model, 5.24.0) and loads a plain model, on the CPU even
# where the rank has a GPU, so nothing distributed would run. torch's fully_shard does build one.
@pytest.mark.parametrize("checkpoint", families.dense(), indirect=True)
def test_fully_shard_on_a_mesh_of_one(run_case, checkpoint):
    """torch's fully_shard on one rank (DTensor parameters on a mesh of one): load, logits, gradients."""
    run_case(1, checkpoint, Layout.FULLY_SHARD, (Check.LOAD, Check.LOGITS, Check.GRADIENTS))
