"""What one device can test without a second rank: the whole model as this device computes it, against float64.

`run_device_case(checkpoint, case)` runs on one rank (the `ranks` fixture with world size 1, so the device is
set up exactly as for the distributed cases: the rank's GPU, or the CPU). It loads three whole models:

1. the subject: the case's experts implementation (and fake quantization) on this rank's device, in its dtype;
2. the noise sample: the eager implementation on the CPU in the same dtype, the rounding a correct run has;
3. the truth: float64 on the CPU, with exactly the dtype's weights (tf_adapter.load_reference).

Routing must be the truth's; the subject's logits and gradients must be within the stated multiple of the noise
sample's own distance from the truth (checks/tolerances.py), as for the sharded cases. On a GPU this checks the device's
kernels (grouped_mm and batched_mm on CUDA, CUDA's float8 conversion in fake quantization) against the CPU's; on
the CPU the fused implementations against the eager loop.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from checks import fake_quant, rank_cases, routing, verdicts
from checks.case import SuiteCase
from checks.kinds import Check, Layout
from loading import tf_adapter
from loading.float64_mode import stay_float64
from models import families, tiny_models

# What the known-bugs table and the reports read of a device case: it has no sharding.
LAYOUT = Layout.ONE_DEVICE
CHECKS = (Check.LOGITS, Check.GRADIENTS)
CPU = torch.device("cpu")


@dataclass(frozen=True)
class DeviceCase(SuiteCase):
    """The whole model on this rank's device against the CPU's float64: nothing distributed, nothing planted."""

    layout: Layout = LAYOUT
    quant: str | None = None  # a fake_quant recipe
    hub_kernels: bool = False  # the subject loaded with Hub kernels on (tf_adapter.hub_kernels), as a user's default
    checks: tuple[Check, ...] = CHECKS

    LAYOUTS = (LAYOUT,)

    def __post_init__(self):
        super().__post_init__()
        if self.quant is not None and self.quant not in fake_quant.RECIPES:
            raise ValueError(f"unknown recipe {self.quant!r}; known: {fake_quant.RECIPES}")


def run_device_case(
    checkpoint: str, case: DeviceCase, metrics_dir: str | None = None, model_class: type | None = None
) -> dict:
    return rank_cases.measured(
        rank_cases.case_metrics(case), metrics_dir, lambda into: _compare(checkpoint, case, into, model_class)
    )


def _compare(checkpoint: str, case: DeviceCase, metrics: dict, model_class: type | None) -> None:
    from transformers.utils import logging

    logging.disable_progress_bar()
    device = rank_cases.rank_device()
    dtype = getattr(torch, case.dtype)
    family = families.family(case.family)
    with tf_adapter.hub_kernels(case.hub_kernels):
        subject = tf_adapter.load_whole(checkpoint, dtype, device, case.experts_implementation, model_class)
    noise = tf_adapter.load_eager(checkpoint, dtype, CPU, model_class)
    truth = tf_adapter.load_reference(checkpoint, dtype, CPU, model_class)
    quantizers = _fake_quantize(case, family, (subject, noise, truth))

    batch = tiny_models.make_batch()
    noise.train()
    other_order = rank_cases.gradients_in_another_order(noise, batch)  # before the recorders listen
    recorders = [routing.RoutingRecorder(model, family) for model in (subject, truth)] if family.is_moe else []
    losses, logits = [], []
    for model, on in ((subject, device), (noise, CPU), (truth, CPU)):
        model.train()
        with stay_float64() if model is truth else contextlib.nullcontext():
            output = rank_cases.model_logits(model, batch.to(on))
            losses.append(rank_cases.next_token_loss(output, batch.to(on)))
        logits.append(output.detach().to(CPU))
    if quantizers:
        _check_same_quantization(*quantizers[:2])
    if recorders:
        verdicts.check_routing(recorders[0].layers, recorders[1].layers)
    subject_logits, whole_logits, reference_logits = logits
    rank_cases.compare_logits(subject_logits, whole_logits, reference_logits, case.dtype, metrics)
    for loss in losses:
        loss.backward()
    grads = [
        {name: None if param.grad is None else param.grad.to(CPU) for name, param in model.named_parameters()}
        for model in (subject, noise, truth)
    ]
    subject_grads, noise_grads, truth_grads = grads
    rank_cases.check_gradients_against_reference(
        subject_grads, (noise_grads, other_order), truth_grads, case.dtype, metrics
    )


def _fake_quantize(case: DeviceCase, family: families.Family, models) -> list[fake_quant.FakeQuantizer]:
    if case.quant is None:
        return []
    attach = fake_quant.attach_to_experts if family.is_moe else fake_quant.attach_to_dense_mlps
    quantizers = [fake_quant.FakeQuantizer(case.quant) for _ in models]
    if not all(attach(model, quantizer) for model, quantizer in zip(models, quantizers, strict=True)):
        raise AssertionError(f"found no weights to fake-quantize in {type(models[0]).__name__}")
    return quantizers


def _check_same_quantization(on_device: fake_quant.FakeQuantizer, on_cpu: fake_quant.FakeQuantizer) -> None:
    """The device quantizes to exactly the CPU's bits (each scale and rounding is a function of the weight)."""
    differing = [
        f"{module}.{param}"
        for (module, param), expected in on_cpu.quantized.items()
        if not torch.equal(on_device.quantized[(module, param)].to(CPU), expected)
    ]
    if differing:
        raise AssertionError(
            f"{on_device.recipe}-quantized weights differ between this device and the CPU: {', '.join(differing)}"
        )
