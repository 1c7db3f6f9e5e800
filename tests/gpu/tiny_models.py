"""Tiny checkpoints of every family in families.py, built from configs at test time and saved with
`save_pretrained` (no download), with a router that decides clearly by construction.

Hidden channels 0..7 carry a routing code: token `t`'s embedding holds PRIMARY_CODE in channel `t % 8` and
SECONDARY_CODE in channel `secondary_expert(t)`, zero in the other six. Nothing else writes those channels:
every module that adds to the residual stream (attention's o_proj, dense and shared MLPs' down_proj, the
expert stacks' down projection and its bias) has zero output rows there, so every layer's router sees the
same code, scaled by the RMS norm. The code carries most of the hidden state's norm, so that scale varies by
a few percent only. Each router row reads only its own channel, so token `t` goes to experts `t % 8` and
`secondary_expert(t)` in every MoE layer with logits near 5.4 and 4.7, the other six near 0: the third
score is about 4 below the top two, and the top routing weight's share stays well under 1 (bounds in
tolerances.py, asserted on the suite's batch by tests/unit/suite/test_tiny_models.py). A router that scales what
it reads has its code raised until its margin clears the bound with room (calibrate_router_gain); a hash router's
token table is written with the same experts.

The families' own extras keep their part in the decision without changing it: GPT-OSS's router bias and
DeepSeek-V3's correction-bias buffer get small distinct values (0.05 at most, far below the margin), so a
rank that loads them wrong shows in the load check and, if large enough, in routing.
"""

from __future__ import annotations

from pathlib import Path

import families
import routing
import tolerances
import torch

PRIMARY_CODE = 8.0
SECONDARY_CODE = 7.0
CONTENT_STD = 0.5  # the other embedding channels: small next to the code, so the RMS norm keeps it steady
ROUTER_GAIN = 1.0
# A router whose margin falls below this has its code raised (by at most MAX_GAIN_RAISE): 1.5x the margin the
# suite asserts, so rounding in bf16 and across ranks stays far from the boundary.
CALIBRATED_MARGIN = 1.5 * tolerances.ROUTING_MARGIN_MIN
MAX_GAIN_RAISE = 16.0
CODE_CHANNELS = slice(0, families.NUM_EXPERTS)

BATCH_SIZE = 8  # sequences; divisible by every world size the suite runs (2, 4, 8)
SEQUENCE_LENGTH = 16
BATCH_SEED = 1234
WEIGHTS_SEED = 0
READOUT_SEED = 99


def primary_expert(token: int) -> int:
    return token % families.NUM_EXPERTS


def secondary_expert(token: int) -> int:
    """Another expert than the primary, picked by the token id."""
    experts = families.NUM_EXPERTS
    return (token % experts + 1 + (token // experts) % (experts - 1)) % experts


def small_bias(count: int) -> torch.Tensor:
    """Distinct values in [-0.05, 0.05]: nonzero, so a wrong load shows, and far below the routing margin."""
    return torch.linspace(-0.05, 0.05, count)


def build_checkpoint(family: families.Family, path: Path) -> Path:
    """Save the family's tiny model, with the routing code when it is MoE, to `path`; return `path`."""
    config = families.config_class(family.model_type)(**family.config)
    torch.manual_seed(WEIGHTS_SEED)
    model = families.model_class(config)(config)
    if family.is_moe:
        with torch.no_grad():
            write_routing_code(model, family)
            calibrate_router_gain(model, family)
    model.save_pretrained(path)
    return path


def _zero_code_outputs(model, family: families.Family) -> None:
    """Nothing but the embedding writes the code channels: every linear layer whose output is as wide as the
    residual stream (attention and MLP outputs, a Mamba or linear-attention mixer's out projection) and every
    expert stack's down projection has zero output rows there."""
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.out_features == families.HIDDEN_SIZE:
            module.weight[CODE_CHANNELS, :] = 0.0
            if module.bias is not None:
                module.bias[CODE_CHANNELS] = 0.0
    for layer in family.moe_layers:
        experts = model.get_submodule(f"{family.block_path(layer)}.{family.experts}")
        for name in family.expert_params:
            stack = getattr(experts, name)
            if not name.startswith("down_proj"):
                continue
            if stack.dim() == 2:  # a bias [experts, hidden]
                stack[:, CODE_CHANNELS] = 0.0
            elif getattr(experts, "is_transposed", False):  # [experts, intermediate, hidden]
                stack[:, :, CODE_CHANNELS] = 0.0
            else:  # [experts, hidden, intermediate]
                stack[:, CODE_CHANNELS, :] = 0.0


def write_routing_code(model, family: families.Family) -> None:
    embedding = model.get_input_embeddings().weight
    embedding.normal_(0.0, CONTENT_STD)
    embedding[:, CODE_CHANNELS] = 0.0
    for token in range(embedding.shape[0]):
        embedding[token, primary_expert(token)] = PRIMARY_CODE
        if family.top_k > 1:
            embedding[token, secondary_expert(token)] = SECONDARY_CODE
    _zero_code_outputs(model, family)
    for layer in family.moe_layers:
        router = model.get_submodule(f"{family.block_path(layer)}.{family.router}")
        _, weight, transposed = families.router_weight(router)
        code = ROUTER_GAIN * torch.eye(families.NUM_EXPERTS)
        weight.zero_()  # rows past the routed experts (shared experts a router also scores) stay zero
        if transposed:
            weight[CODE_CHANNELS, : families.NUM_EXPERTS] = code
        else:
            weight[: families.NUM_EXPERTS, CODE_CHANNELS] = code
        # a hash router's table (token id -> experts, a frozen buffer) sends each token where the code does
        for table in router.buffers():
            if not table.is_floating_point() and tuple(table.shape) == (embedding.shape[0], family.top_k):
                chosen = (primary_expert, secondary_expert)[: family.top_k]
                table.copy_(torch.tensor([[expert(token) for expert in chosen] for token in range(table.shape[0])]))
        # the router's own extras keep their part in the decision, far below the margin
        for name, extra in [*router.named_parameters(), *router.named_buffers()]:
            if "bias" in name and extra is not weight and extra.dim() == 1 and extra.shape[0] == families.NUM_EXPERTS:
                extra.copy_(small_bias(families.NUM_EXPERTS))


def readout(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[vocab, hidden]: how the suite scores a base model's hidden states (families without an LM head)."""
    generator = torch.Generator().manual_seed(READOUT_SEED)
    weight = torch.randn(families.VOCAB_SIZE, families.HIDDEN_SIZE, generator=generator) * families.INITIALIZER_RANGE
    return weight.to(dtype=dtype, device=device)


def calibrate_router_gain(model, family: families.Family) -> None:
    """Some routers scale what they read (by hidden**-0.5, a learned scale, a norm of their own): measure each MoE
    layer's margin on the suite's batch and raise that router's code until it clears CALIBRATED_MARGIN."""
    recorder = routing.RoutingRecorder(model, family)
    try:
        model(make_batch(), use_cache=False)
    finally:
        recorder.remove()
    for layer, decision in zip(family.moe_layers, recorder.layers, strict=True):
        margin = decision.margin
        if 0 < margin < CALIBRATED_MARGIN:
            router = model.get_submodule(f"{family.block_path(layer)}.{family.router}")
            _, weight, _ = families.router_weight(router)
            weight.mul_(min(MAX_GAIN_RAISE, CALIBRATED_MARGIN / margin))


def make_batch() -> torch.Tensor:
    """The token ids every case feeds: BATCH_SIZE x SEQUENCE_LENGTH, the same on every rank and run."""
    generator = torch.Generator().manual_seed(BATCH_SEED)
    return torch.randint(0, families.VOCAB_SIZE, (BATCH_SIZE, SEQUENCE_LENGTH), generator=generator)
