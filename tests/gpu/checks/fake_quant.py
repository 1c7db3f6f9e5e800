"""Fake quantization for quantized-training cases: weights are rounded to a low-precision format in the
forward pass and the gradient passes straight through (straight-through estimator, STE).

Recipes, for a weight of shape [..., rows, columns] (an expert stack is [experts, rows, columns]):
- fp8: e4m3 values with one scale per row (row amax / 448).
- nvfp4: e2m1 values in blocks of 16 along the columns, each block with an e4m3 scale, under one float32
  global scale per matrix: per expert for an expert stack (amax / (448 * 6)).

`scale_scope="local_shard"` computes the nvfp4 global scale over everything the tensor holds (on an
expert-parallel rank: all its local experts at once). It is the bug the negative test plants: the scale
must not depend on how the experts are sharded.

`FakeQuantizer` puts the quantized weight in place of the parameter for each forward of a module (a
pre-hook swaps it in, a hook swaps the parameter back), so transformers' own forward, expert-parallel
dispatch and FSDP's unshard/reshard run unchanged around it.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn

FP8_E4M3_MAX = 448.0
FP4_E2M1_MAX = 6.0
NVFP4_BLOCK = 16
RECIPES = ("fp8", "nvfp4")
SCALE_SCOPES = ("per_expert", "local_shard")
# e2m1 magnitudes, and the midpoints between neighbours that round-to-nearest switches at
_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_MIDPOINTS = tuple((low + high) / 2 for low, high in itertools.pairwise(_E2M1_VALUES))
_TINY = torch.finfo(torch.float32).tiny


def _divided(values: torch.Tensor, constant: float) -> torch.Tensor:
    """values / constant, correctly rounded on every device: CUDA divides a tensor by a Python number as a
    multiplication by its reciprocal (one rounding more), so a scale could differ from the CPU's by an ulp and move
    a quantized value across a rounding boundary. A tensor divisor takes the true division everywhere."""
    return values / torch.full_like(values, constant)


def fp8_rowwise(weight: torch.Tensor) -> torch.Tensor:
    """Quantize-dequantize to e4m3 with one scale per row (last dimension reduced)."""
    values = weight.float()
    scale = _divided(values.abs().amax(dim=-1, keepdim=True).clamp_min(_TINY), FP8_E4M3_MAX)
    return (values / scale).to(torch.float8_e4m3fn).float() * scale


def round_to_e2m1(values: torch.Tensor) -> torch.Tensor:
    """Round to the nearest e2m1 number (magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6), saturating at 6."""
    midpoints = torch.tensor(_E2M1_MIDPOINTS, dtype=values.dtype, device=values.device)
    grid = torch.tensor(_E2M1_VALUES, dtype=values.dtype, device=values.device)
    magnitudes = grid[torch.bucketize(values.abs(), midpoints)]
    return torch.copysign(magnitudes, values)


def nvfp4(weight: torch.Tensor, global_amax: torch.Tensor) -> torch.Tensor:
    """Quantize-dequantize to e2m1 in blocks of 16 columns with e4m3 block scales under a global scale.

    `global_amax` broadcasts against `weight` (shape [..., 1, 1]): the amax the global scale covers.
    """
    columns = weight.shape[-1]
    if columns % NVFP4_BLOCK:
        raise ValueError(f"nvfp4 needs columns divisible by {NVFP4_BLOCK}, got shape {tuple(weight.shape)}")
    values = weight.float()
    global_scale = _divided(global_amax.float().clamp_min(_TINY), FP8_E4M3_MAX * FP4_E2M1_MAX)
    blocks = values.reshape(*values.shape[:-1], columns // NVFP4_BLOCK, NVFP4_BLOCK)
    global_scale = global_scale.unsqueeze(-1)  # broadcast over the block dimension
    block_amax = blocks.abs().amax(dim=-1, keepdim=True)
    block_scale = (_divided(block_amax, FP4_E2M1_MAX) / global_scale).to(torch.float8_e4m3fn).float() * global_scale
    quantized = round_to_e2m1(blocks / block_scale.clamp_min(_TINY)) * block_scale
    return quantized.reshape(values.shape)


def global_amax(weight: torch.Tensor, scale_scope: str) -> torch.Tensor:
    """The amax the nvfp4 global scale covers: each matrix's own, or (the bug) the whole local tensor's."""
    magnitudes = weight.detach().float().abs()
    if scale_scope == "per_expert":
        return magnitudes.amax(dim=(-2, -1), keepdim=True)
    if scale_scope == "local_shard":
        return magnitudes.amax().reshape([1] * weight.dim())
    raise ValueError(f"scale_scope must be one of {SCALE_SCOPES}, got {scale_scope!r}")


def quantize(weight: torch.Tensor, recipe: str, scale_scope: str = "per_expert") -> torch.Tensor:
    """The fake-quantized weight, in the weight's dtype (no gradient: see `straight_through`)."""
    with torch.no_grad():
        if recipe == "fp8":
            quantized = fp8_rowwise(weight)
        elif recipe == "nvfp4":
            quantized = nvfp4(weight, global_amax(weight, scale_scope))
        else:
            raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")
    return quantized.to(weight.dtype)


def straight_through(weight: torch.Tensor, quantized: torch.Tensor) -> torch.Tensor:
    """`quantized` in the forward pass; in the backward pass the gradient reaches `weight` unchanged."""
    return weight + (quantized - weight).detach()


class FakeQuantizer:
    """Fake-quantizes named parameters of modules for every forward; keeps the last quantized values.

    `quantized[(module_name, param_name)]` is the last quantized local tensor (what this rank computed
    with), for comparing the sharded model's quantization with the whole model's.
    """

    def __init__(self, recipe: str, scale_scope: str = "per_expert"):
        if recipe not in RECIPES:
            raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")
        if scale_scope not in SCALE_SCOPES:
            raise ValueError(f"scale_scope must be one of {SCALE_SCOPES}, got {scale_scope!r}")
        self.recipe = recipe
        self.scale_scope = scale_scope
        self.quantized: dict[tuple[str, str], torch.Tensor] = {}
        self._handles: list = []

    def attach(self, module_name: str, module: nn.Module, param_names: tuple[str, ...]) -> None:
        swapped: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

        def swap_in(module, args):
            for name in param_names:
                original = module._parameters[name]
                replacement = self._straight_through(module_name, name, original)
                # Bypass nn.Module.__setattr__: the replacement is a tensor computed from the parameter,
                # not a parameter, and it must stand where the forward looks the weight up.
                module._parameters[name] = replacement
                swapped[name] = (original, replacement)

        def swap_back(module, args, output):
            for name, (original, replacement) in swapped.items():
                # FSDP may have put its sharded parameter back already; only undo our own swap.
                if module._parameters[name] is replacement:
                    module._parameters[name] = original
            swapped.clear()

        self._handles.append(module.register_forward_pre_hook(swap_in))
        self._handles.append(module.register_forward_hook(swap_back))

    def _straight_through(self, module_name: str, param_name: str, weight: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        if isinstance(weight, DTensor):
            # Quantize what this rank holds (whole experts under expert parallelism), then rewrap.
            local = weight.to_local()
            quantized = quantize(local, self.recipe, self.scale_scope)
            self.quantized[(module_name, param_name)] = quantized.detach()
            return DTensor.from_local(
                straight_through(local, quantized),
                weight.device_mesh,
                weight.placements,
                run_check=False,
                shape=weight.shape,
                stride=weight.stride(),
            )
        quantized = quantize(weight, self.recipe, self.scale_scope)
        self.quantized[(module_name, param_name)] = quantized.detach()
        return straight_through(weight, quantized)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def attach_to_experts(model: nn.Module, quantizer: FakeQuantizer) -> int:
    """Fake-quantize every MoE expert stack (gate_up_proj, down_proj). Returns how many modules."""
    count = 0
    for name, module in model.named_modules():
        if "gate_up_proj" in module._parameters and "down_proj" in module._parameters:
            quantizer.attach(name, module, ("gate_up_proj", "down_proj"))
            count += 1
    return count


def attach_to_dense_mlps(model: nn.Module, quantizer: FakeQuantizer) -> int:
    """Fake-quantize the weight of every dense MLP projection (gate_proj, up_proj, down_proj)."""
    count = 0
    for name, module in model.named_modules():
        if name.rpartition(".")[2] in ("gate_proj", "up_proj", "down_proj") and ".mlp." in f".{name}":
            quantizer.attach(name, module, ("weight",))
            count += 1
    return count
