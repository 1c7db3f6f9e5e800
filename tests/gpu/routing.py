"""Records each MoE layer's routing as the model decided it: a forward hook on every router module keeps
its own output (router logits, top-k weights, top-k expert ids).

Reading the router's output instead of recomputing `topk(linear(h, W))` keeps whatever the family's router
does (a bias, a sigmoid, groups, a correction-bias buffer, an fp32 router under bf16). Expert parallelism
in the releases under test remaps expert ids at the experts module's input, after the router, so the ids
recorded here are global on every rank.
"""

from __future__ import annotations

import checks
import families
import torch
from torch.distributed.tensor import DTensor


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


class RoutingRecorder:
    def __init__(self, model, family: families.Family):
        self.layers: list[checks.LayerRouting] = []
        modules = dict(model.named_modules())
        missing = [path for path in family.router_paths() if path not in modules]
        if missing:
            raise AssertionError(
                f"{family.model_type}: no router module at {missing}; the family's entry in "
                f"tests/gpu/families.py names other modules than {type(model).__name__} has"
            )
        self._handles = [modules[path].register_forward_hook(self._record) for path in family.router_paths()]

    def _record(self, module, args, output):
        logits, weights, experts = output[:3]
        with torch.no_grad():
            logits = _full(logits).detach().float().reshape(-1, _full(logits).shape[-1])
            weights = _full(weights).detach().float().reshape(logits.shape[0], -1)
            experts = _full(experts).detach().reshape(logits.shape[0], -1)
        self.layers.append(checks.LayerRouting(logits.cpu(), experts.cpu(), weights.cpu()))

    def rows(self, tokens: slice) -> list[checks.LayerRouting]:
        return [layer.rows(tokens) for layer in self.layers]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
