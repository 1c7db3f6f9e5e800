"""Tiny checkpoints of every family in families.py, built from configs at test time and saved with
`save_pretrained` (no download), with a router that decides clearly by construction.

Hidden channels 0..7 carry a routing code: token `t`'s embedding holds PRIMARY_CODE in channel `t % 8` and
SECONDARY_CODE in channel `secondary_expert(t)`, zero in the other six. Nothing else writes those channels:
every module that adds to the residual stream (attention's o_proj, dense and shared MLPs' down_proj, the
expert stacks' down projection and its bias) has zero output rows there, so every layer's router sees the
same code, scaled by the RMS norm. The code carries most of the hidden state's norm, so that scale varies by
a few percent only. Each router row reads only its own channel, so token `t` goes to experts `t % 8` and
`secondary_expert(t)` in every MoE layer with logits near 3.8 and 3.3, the other six near 0: the third
score is about 3 below the top two, and the top routing weight stays well under 1 (bounds in
tolerances.py, asserted on the suite's batch by test_tiny_models.py).

The families' own extras keep their part in the decision without changing it: GPT-OSS's router bias and
DeepSeek-V3's correction-bias buffer get small distinct values (0.05 at most, far below the margin), so a
rank that loads them wrong shows in the load check and, if large enough, in routing.
"""

from __future__ import annotations

from pathlib import Path

import families
import torch

PRIMARY_CODE = 8.0
SECONDARY_CODE = 7.0
CONTENT_STD = 0.5  # the other embedding channels: small next to the code, so the RMS norm keeps it steady
ROUTER_GAIN = 0.7
CODE_CHANNELS = slice(0, families.NUM_EXPERTS)
# Linear layers whose output is added to the residual stream, by the end of their name
RESIDUAL_WRITERS = ("o_proj", "down_proj")

BATCH_SIZE = 8  # sequences; divisible by every world size the suite runs (2, 4, 8)
SEQUENCE_LENGTH = 16
BATCH_SEED = 1234
WEIGHTS_SEED = 0


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
    from transformers import AutoModelForCausalLM

    torch.manual_seed(WEIGHTS_SEED)
    model = AutoModelForCausalLM.from_config(family.make_config())
    if family.is_moe:
        with torch.no_grad():
            write_routing_code(model, family)
    model.save_pretrained(path)
    return path


def write_routing_code(model, family: families.Family) -> None:
    embedding = model.model.embed_tokens.weight
    embedding.normal_(0.0, CONTENT_STD)
    embedding[:, CODE_CHANNELS] = 0.0
    for token in range(embedding.shape[0]):
        embedding[token, primary_expert(token)] = PRIMARY_CODE
        embedding[token, secondary_expert(token)] = SECONDARY_CODE
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.endswith(RESIDUAL_WRITERS):
            module.weight[CODE_CHANNELS, :] = 0.0
            if module.bias is not None:
                module.bias[CODE_CHANNELS] = 0.0
    for layer in family.moe_layers:
        block = getattr(model.model.layers[layer], family.moe_block)
        experts = getattr(block, family.experts)
        # transposed stacks (GPT-OSS) hold down_proj as [experts, intermediate, hidden]
        if getattr(experts, "is_transposed", False):
            experts.down_proj[:, :, CODE_CHANNELS] = 0.0
        else:
            experts.down_proj[:, CODE_CHANNELS, :] = 0.0
        if getattr(experts, "down_proj_bias", None) is not None:
            experts.down_proj_bias[:, CODE_CHANNELS] = 0.0
        router = getattr(block, family.router)
        router.weight.zero_()
        router.weight[:, CODE_CHANNELS] = ROUTER_GAIN * torch.eye(families.NUM_EXPERTS)
        if getattr(router, "bias", None) is not None:
            router.bias.copy_(small_bias(families.NUM_EXPERTS))
        if hasattr(router, "e_score_correction_bias"):
            router.e_score_correction_bias.copy_(small_bias(families.NUM_EXPERTS))


def make_batch() -> torch.Tensor:
    """The token ids every case feeds: BATCH_SIZE x SEQUENCE_LENGTH, the same on every rank and run."""
    generator = torch.Generator().manual_seed(BATCH_SEED)
    return torch.randint(0, families.VOCAB_SIZE, (BATCH_SIZE, SEQUENCE_LENGTH), generator=generator)
