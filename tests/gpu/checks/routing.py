"""Records each MoE layer's routing as the model decided it: a forward hook on every router module keeps
its own output (router logits, top-k weights, top-k expert ids).

Reading the router's output instead of recomputing `topk(linear(h, W))` keeps whatever the family's router
does (a bias, a sigmoid, groups, a correction-bias buffer, an fp32 router under bf16), in global expert ids. A
router that is an MLP (families.ROUTER_MLPS) is read the same way: its output's logits are its MLP's, one column per
expert and one for a skip class if it has one (a column no token chooses under the routing code); a top-1 router's
decision is compared as any other (the same expert for every token).
"""

from __future__ import annotations

import torch
from models import families
from torch.distributed.tensor import DTensor

from checks import verdicts


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def as_logits(scores: torch.Tensor) -> torch.Tensor:
    """A router that returns its softmax probabilities (each row a distribution) in place of logits is read as log
    probabilities: they differ from its logits by a per-token constant, so margins are logit differences."""
    rows = scores.reshape(-1, scores.shape[-1])
    if rows.numel() and rows.min() >= 0 and torch.allclose(rows.sum(dim=-1), rows.new_ones(rows.shape[0]), atol=1e-3):
        return scores.clamp_min(torch.finfo(torch.float32).tiny).log()
    return scores


class RoutingRecorder:
    def __init__(self, model, family: families.Family):
        self.layers: list[verdicts.LayerRouting] = []
        modules = dict(model.named_modules())
        missing = [path for path in family.router_paths() if path not in modules]
        if missing:
            raise AssertionError(
                f"{family.model_type}: no router module at {missing}; the family's entry in "
                f"tests/gpu/models/families.py names other modules than {type(model).__name__} has"
            )
        self._handles = [
            modules[path].register_forward_hook(self._record, prepend=True, with_kwargs=True)
            for path in family.router_paths()
        ]

    def _record(self, module, args, kwargs, output):
        if "forward" in module.__dict__:
            # A parallel style replaced this router's forward with a wrapper that rewrites its output (5.13-5.19's
            # ep_router: rank-local expert ids); the router's own decision is its class's forward on the same input
            # (keywords included: a router may take state from the previous layer's router as one).
            with torch.no_grad():
                output = type(module).forward(module, *args, **kwargs)
        # copies: the tensors may be rewritten in place later
        if len(output) == 2:  # (scores, logits): the scores are zero but for each token's chosen experts
            scores, logits = (_full(tensor).detach().clone() for tensor in output)
            scores = scores.reshape(-1, scores.shape[-1])
            top_k = int((scores != 0).sum(dim=-1).max().item())
            weights, experts = scores.topk(top_k, dim=-1)
        else:
            logits, weights, experts = (_full(tensor).detach().clone() for tensor in output[:3])
        tokens = logits.numel() // logits.shape[-1]
        logits = as_logits(logits.float())
        self.layers.append(
            verdicts.LayerRouting(
                logits.float().reshape(tokens, -1).cpu(),
                experts.reshape(tokens, -1).cpu(),
                weights.float().reshape(tokens, -1).cpu(),
            )
        )

    def rows(self, tokens: slice) -> list[verdicts.LayerRouting]:
        return [layer.rows(tokens) for layer in self.layers]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()

    def __enter__(self) -> RoutingRecorder:
        return self

    def __exit__(self, *exc_info) -> None:
        self.remove()
