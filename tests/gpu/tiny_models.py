"""The suite's two tiny models, built from configs at test time and saved with `save_pretrained` (no
download): a Qwen3-MoE (8 experts, top-2, 2 layers) whose router decides clearly, and a dense Qwen3.

The MoE router is deterministic by construction. Hidden channels 0..7 carry a routing code: token `t`'s
embedding holds PRIMARY_CODE in channel `t % 8` and SECONDARY_CODE in channel `secondary_expert(t)`,
zero in the other six. Attention and experts never write those channels (their output rows there are
zero), so every layer's router sees the same code, scaled by the RMS norm. The code carries most of the
hidden state's norm, so that scale varies by a few percent only. Each router row reads only its own
channel, so token `t` goes to experts `t % 8` and `secondary_expert(t)` in every layer with logits near
3.8 and 3.3, the other six exactly 0: the third score is about 3 below the top two and the top routing
weight stays near 0.56 (bounds in tests/gpu/tolerances.py, asserted on the suite's batch by
test_tiny_models.py).
"""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB_SIZE = 128
HIDDEN_SIZE = 64
NUM_LAYERS = 2
NUM_EXPERTS = 8
TOP_K = 2
INITIALIZER_RANGE = 0.07  # above the default 0.02, so that every layer changes the residual stream visibly

PRIMARY_CODE = 8.0
SECONDARY_CODE = 7.0
CONTENT_STD = 0.5  # the other embedding channels: small next to the code, so the RMS norm keeps it steady
ROUTER_GAIN = 0.7
CODE_CHANNELS = slice(0, NUM_EXPERTS)

BATCH_SIZE = 8  # sequences; divisible by every world size the suite runs (2, 4, 8)
SEQUENCE_LENGTH = 16
BATCH_SEED = 1234
WEIGHTS_SEED = 0


def primary_expert(token: int) -> int:
    return token % NUM_EXPERTS


def secondary_expert(token: int) -> int:
    """Another expert than the primary, picked by the token id."""
    return (token % NUM_EXPERTS + 1 + (token // NUM_EXPERTS) % (NUM_EXPERTS - 1)) % NUM_EXPERTS


def _common_config() -> dict:
    return {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN_SIZE,
        "num_hidden_layers": NUM_LAYERS,
        # 16 query and 8 key/value heads: tensor parallelism (the dense half of expert parallelism in the
        # releases that refuse replicated dense weights) splits whole heads up to 8 ranks
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 8,
        "max_position_embeddings": 64,
        "initializer_range": INITIALIZER_RANGE,
        "tie_word_embeddings": False,
    }


def moe_config():
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(**_common_config(), intermediate_size=128, moe_intermediate_size=32,
                          num_experts=NUM_EXPERTS, num_experts_per_tok=TOP_K, norm_topk_prob=False,
                          decoder_sparse_step=1, mlp_only_layers=[])


def dense_config():
    from transformers import Qwen3Config

    return Qwen3Config(**_common_config(), intermediate_size=128)


def build_moe(path: Path) -> Path:
    """Save the MoE with its routing code to `path`; return `path`."""
    from transformers import Qwen3MoeForCausalLM

    torch.manual_seed(WEIGHTS_SEED)
    model = Qwen3MoeForCausalLM(moe_config())
    with torch.no_grad():
        embedding = model.model.embed_tokens.weight
        embedding.normal_(0.0, CONTENT_STD)
        embedding[:, CODE_CHANNELS] = 0.0
        for token in range(VOCAB_SIZE):
            embedding[token, primary_expert(token)] = PRIMARY_CODE
            embedding[token, secondary_expert(token)] = SECONDARY_CODE
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[CODE_CHANNELS, :] = 0.0
            layer.mlp.experts.down_proj[:, CODE_CHANNELS, :] = 0.0
            router = layer.mlp.gate.weight
            router.zero_()
            router[:, CODE_CHANNELS] = ROUTER_GAIN * torch.eye(NUM_EXPERTS)
    model.save_pretrained(path)
    return path


def build_dense(path: Path) -> Path:
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(WEIGHTS_SEED)
    Qwen3ForCausalLM(dense_config()).save_pretrained(path)
    return path


def make_batch() -> torch.Tensor:
    """The token ids every case feeds: BATCH_SIZE x SEQUENCE_LENGTH, the same on every rank and run."""
    generator = torch.Generator().manual_seed(BATCH_SEED)
    return torch.randint(0, VOCAB_SIZE, (BATCH_SIZE, SEQUENCE_LENGTH), generator=generator)
