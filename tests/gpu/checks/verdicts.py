"""The comparisons of a sharded model with the whole model, as pure functions over tensors.

Each check raises AssertionError with a message that says what differs (which layer, expert, parameter
or rank), because that message is what a user of the harness reads first. None of them runs a
collective: callers gather shards first, so a check failing on one rank cannot hang the others.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch


def routing_differs_message(layer: int, differing: int, total: int) -> str:
    return f"routing differs: layer {layer} sends {differing} of {total} tokens to other experts than the whole model"


@dataclass(frozen=True)
class LayerRouting:
    """One MoE layer's decision for a set of tokens, as its router returned it: router logits [tokens,
    experts], chosen experts [tokens, top_k] and their routing weights [tokens, top_k]."""

    logits: torch.Tensor
    experts: torch.Tensor
    weights: torch.Tensor | None = None

    @property
    def margin(self) -> float:
        """Smallest gap between a token's lowest chosen logit and its highest logit not chosen."""
        logits = self.logits.float()
        chosen = torch.zeros_like(logits, dtype=torch.bool).scatter(1, self.experts.long(), True)
        lowest_chosen = logits.masked_fill(~chosen, float("inf")).amin(dim=-1)
        highest_other = logits.masked_fill(chosen, float("-inf")).amax(dim=-1)
        return (lowest_chosen - highest_other).min().item()

    @property
    def top_weight_range(self) -> tuple[float, float]:
        """Smallest and largest share of a token's first expert in its chosen experts' routing weights, as the
        router returned them (a share, so that a family's routed scaling factor does not move it)."""
        if self.weights is None:
            raise ValueError("no routing weights were recorded for this layer")
        weights = self.weights.float().abs()
        share = weights.amax(dim=-1) / weights.sum(dim=-1).clamp_min(torch.finfo(torch.float32).tiny)
        return share.min().item(), share.max().item()

    def rows(self, tokens: slice) -> LayerRouting:
        weights = None if self.weights is None else self.weights[tokens]
        return LayerRouting(self.logits[tokens], self.experts[tokens], weights)


def check_routing(sharded: Sequence[LayerRouting], whole: Sequence[LayerRouting]) -> None:
    """Every token goes to the same set of experts in every layer (and there are MoE layers to compare)."""
    if not whole or not sharded:
        raise AssertionError(
            f"routing not recorded: the sharded model routed in {len(sharded)} MoE layers, "
            f"the whole model in {len(whole)} (the recorder found no router to hook)"
        )
    if len(sharded) != len(whole):
        raise AssertionError(
            f"routing differs: the sharded model routed in {len(sharded)} MoE layers, the whole model in {len(whole)}"
        )
    for layer, (mine, theirs) in enumerate(zip(sharded, whole, strict=True)):
        if mine.experts.shape != theirs.experts.shape:
            raise AssertionError(
                f"routing differs: layer {layer} routed {tuple(mine.experts.shape)} tokens x "
                f"experts, the whole model {tuple(theirs.experts.shape)}"
            )
        same = (mine.experts.sort(dim=-1).values == theirs.experts.sort(dim=-1).values).all(dim=-1)
        differing = int((~same).sum())
        if differing:
            raise AssertionError(routing_differs_message(layer, differing, same.numel()))


def largest_difference(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| in float64 (inf when the shapes differ, NaN when a value is NaN)."""
    if actual.shape != expected.shape:
        return math.inf
    if actual.numel() == 0:
        return 0.0
    return (actual.double() - expected.double()).abs().max().item()


def check_close_to_reference(name: str, actual: torch.Tensor, reference: torch.Tensor, *, bound: float,
                             whole_difference: float) -> float:
    """Element-wise |actual - reference| <= bound (the reference: float64); returns the largest |difference|.
    `whole_difference`, the whole model's own largest difference, goes into the message: the noise it allows."""
    if actual.shape != reference.shape:
        raise AssertionError(f"{name} differ: shape {tuple(actual.shape)}, whole model {tuple(reference.shape)}")
    difference = (actual.double() - reference.double()).abs()
    worst = difference.max().item() if difference.numel() else 0.0
    if not bool((difference <= bound).all()):
        outside = int((~(difference <= bound)).sum())
        raise AssertionError(
            f"{name} differ from the whole model's: {outside} of {difference.numel()} values farther than "
            f"{bound:.3g} from the float64 reference (the whole model's own rounding: {whole_difference:.3g}); "
            f"largest difference {worst:.3g}"
        )
    return worst


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """|actual - expected| / |expected| in the L2 norm over the whole tensor (0 when both are zero), in float64:
    `expected` is usually the float64 reference, whose digits a float32 difference would round away."""
    actual, expected = actual.double(), expected.double()
    difference = (actual - expected).norm().item()
    scale = expected.norm().item()
    if scale == 0.0:
        return 0.0 if difference == 0.0 else math.inf
    return difference / scale


def gradient_errors(
    sharded: Mapping[str, torch.Tensor | None], whole: Mapping[str, torch.Tensor | None]
) -> dict[str, float]:
    """Relative error of every parameter's gradient against `whole` (the float64 reference, or the whole model);
    inf where one side has a gradient and the other not."""
    if sharded.keys() != whole.keys():
        missing = sorted(whole.keys() - sharded.keys())
        extra = sorted(sharded.keys() - whole.keys())
        raise AssertionError(f"parameters differ from the whole model's: missing {missing}, extra {extra}")
    errors = {}
    for name, expected in whole.items():
        actual = sharded[name]
        if actual is None and expected is None:
            errors[name] = 0.0
        elif actual is None or expected is None:
            errors[name] = math.inf
        elif actual.shape != expected.shape:
            raise AssertionError(
                f"gradient of {name} has shape {tuple(actual.shape)}, the whole model's {tuple(expected.shape)}"
            )
        else:
            errors[name] = relative_error(actual, expected)
    return errors


def gradient_scale(actual: torch.Tensor, expected: torch.Tensor) -> float | None:
    """The factor s when `actual` is s times `expected` up to a remainder far below the difference (a
    gradient divided or summed once too often, say), else None."""
    actual, expected = actual.float().flatten(), expected.float().flatten()
    squared_norm = expected.dot(expected).item()
    if squared_norm == 0.0:
        return None
    scale = actual.dot(expected).item() / squared_norm
    remainder = (actual - scale * expected).norm().item()
    difference = (actual - expected).norm().item()
    return scale if remainder < 0.1 * difference else None


def gradient_notes(
    sharded: Mapping[str, torch.Tensor | None],
    whole: Mapping[str, torch.Tensor | None],
    errors: Mapping[str, float],
    bounds: Mapping[str, float],
) -> dict[str, str]:
    """What each gradient over the bound looks like, where it has a simple shape: missing, not finite, or
    the whole model's times a factor."""
    notes = {}
    for name, error in errors.items():
        if error <= bounds[name]:
            continue
        actual, expected = sharded[name], whole[name]
        if actual is None or expected is None:
            notes[name] = "no gradient in the sharded model" if actual is None else "no gradient in the whole model"
        elif not bool(torch.isfinite(actual).all()):
            notes[name] = "the sharded gradient holds NaN or inf"
        elif (scale := gradient_scale(actual, expected)) is not None:
            notes[name] = f"{scale:.3g} times the whole model's gradient"
    return notes


def check_gradients(
    errors: Mapping[str, float], bounds: Mapping[str, float], notes: Mapping[str, str] | None = None
) -> None:
    """Every parameter's relative gradient error is within its own bound (measured in the run: checks/tolerances.py);
    the message lists the worst ones by their ratio to it, each with its note (`notes`: what the difference looks
    like) where there is one."""
    problem = over_bounds("gradients", errors, bounds, notes)
    if problem is not None:
        raise AssertionError(problem)


def over_bounds(
    subject: str, errors: Mapping[str, float], bounds: Mapping[str, float], notes: Mapping[str, str] | None = None
) -> str | None:
    """`{subject} differ from the whole model's: N of M parameters exceed their bound ...`, the worst five by their
    ratio to it; None when every error is within its bound."""
    notes = notes or {}
    over = sorted(
        ((ratio_to_bound(error, bounds[name]), name) for name, error in errors.items() if not error <= bounds[name]),
        reverse=True,
    )
    if not over:
        return None
    listed = "; ".join(
        f"{name} {errors[name]:.3g} (its bound {bounds[name]:.3g})" + (f" ({notes[name]})" if name in notes else "")
        for _, name in over[:5]
    )
    more = f"; and {len(over) - 5} more" if len(over) > 5 else ""
    return (
        f"{subject} differ from the whole model's: {len(over)} of {len(errors)} parameters exceed their "
        f"bound (rounding measured in this run): {listed}{more}"
    )


def ratio_to_bound(error: float, bound: float) -> float:
    """error / bound for ordering; NaN (and an error over a zero bound) the worst."""
    if math.isnan(error):
        return math.inf
    return error / bound if bound > 0 else math.inf


def worst_parameter(errors: Mapping[str, float], bounds: Mapping[str, float]) -> str:
    """The parameter whose error is largest against its bound."""
    return max(errors, key=lambda name: ratio_to_bound(errors[name], bounds[name]))


def differing_experts(local: torch.Tensor, expected: torch.Tensor, first_expert: int) -> list[tuple[int, float, float]]:
    """(global expert id, largest |difference|, largest |weight|) for each expert of a local stack that
    differs from the whole model's."""
    found = []
    for offset in range(local.shape[0]):
        if not torch.equal(local[offset], expected[offset]):
            difference = (local[offset].float() - expected[offset].float()).abs().max().item()
            found.append((first_expert + offset, difference, expected[offset].float().abs().max().item()))
    return found


def expert_shard_message(
    rank: int, name: str, first: int, count: int, differing: list[tuple[int, float, float]]
) -> str:
    """Names the rank, the parameter, the experts it holds and those that differ (by how much, next to the
    expert's largest weight: a rounding difference is a fraction of a percent, a corruption is not)."""
    listed = ", ".join(
        f"expert {expert} (largest difference {difference:.3g}, largest weight {largest:.3g})"
        for expert, difference, largest in differing
    )
    return (
        f"rank {rank} holds experts {first}..{first + count - 1} of {name}, and {listed} differ from the whole model's"
    )
