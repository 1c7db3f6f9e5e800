"""The model families the suite loads sharded: one entry each, a tiny config and the module paths the checks need.

Families are chosen for the EP mechanics where they differ:

- qwen3_moe: softmax top-k router (`mlp.gate`), gate_up / down expert stacks.
- mixtral: softmax router whose top-k weights are renormalized.
- qwen2_moe: a sigmoid-gated shared expert beside the routed ones.
- deepseek_v3: an fp32 sigmoid router with a correction-bias buffer, group-limited top-k and a routed scaling
  factor; shared experts; a dense first layer; MLA attention.
- gpt_oss: a router with a bias (`mlp.router`); transposed, interleaved gate/up stacks with biases; attention
  sinks and a sliding window.
- granitemoe: experts under another module name (`block_sparse_moe`), softmax over the top k.

Adding a family is one `Family` entry and one config builder. Every builder makes hidden 64, 2-3 layers, 8
experts, top-2, so that tiny_models.build_checkpoint can write the same routing code into each (see there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

HIDDEN_SIZE = 64
VOCAB_SIZE = 128
NUM_EXPERTS = 8
TOP_K = 2
INITIALIZER_RANGE = 0.07  # above the default 0.02, so that every layer changes the residual stream visibly


@dataclass(frozen=True)
class Family:
    model_type: str  # as transformers spells it: the test ids carry it
    make_config: Callable[[], object]
    # first transformers release whose config declares an EP plan for it (None: a dense family); read from
    # each release's configuration_<family>.py (base_model_ep_plan), 5.7.0 to 5.24.0
    ep_floor: str | None = None
    moe_block: str = "mlp"  # a decoder layer's attribute holding the MoE block
    router: str = "gate"  # the MoE block's attribute holding the router
    experts: str = "experts"  # the MoE block's attribute holding the expert stacks
    expert_params: tuple[str, ...] = ("gate_up_proj", "down_proj")  # stacked [experts, ...] parameters
    moe_layers: tuple[int, ...] = ()  # indices of the decoder layers that are MoE (the others are dense)

    @property
    def is_moe(self) -> bool:
        return self.ep_floor is not None

    def router_paths(self) -> list[str]:
        return [f"model.layers.{layer}.{self.moe_block}.{self.router}" for layer in self.moe_layers]

    def expert_stack_suffixes(self) -> tuple[str, ...]:
        return tuple(f"{self.moe_block}.{self.experts}.{param}" for param in self.expert_params)

    def is_expert_stack(self, name: str) -> bool:
        """A parameter EP shards along its first (expert) dimension."""
        return self.is_moe and name.endswith(self.expert_stack_suffixes())


def _common() -> dict:
    return {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN_SIZE,
        "num_hidden_layers": 2,
        # 16 query and 8 key/value heads: tensor parallelism (the dense half of expert parallelism in the
        # releases that refuse replicated dense weights) splits whole heads up to 8 ranks
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 8,
        "max_position_embeddings": 64,
        "initializer_range": INITIALIZER_RANGE,
        "tie_word_embeddings": False,
    }


def _qwen3_moe():
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        **_common(),
        intermediate_size=128,
        moe_intermediate_size=32,
        num_experts=NUM_EXPERTS,
        num_experts_per_tok=TOP_K,
        norm_topk_prob=False,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )


def _mixtral():
    from transformers import MixtralConfig

    return MixtralConfig(**_common(), intermediate_size=32, num_local_experts=NUM_EXPERTS, num_experts_per_tok=TOP_K)


def _qwen2_moe():
    from transformers import Qwen2MoeConfig

    return Qwen2MoeConfig(
        **_common(),
        intermediate_size=128,
        moe_intermediate_size=32,
        num_experts=NUM_EXPERTS,
        num_experts_per_tok=TOP_K,
        shared_expert_intermediate_size=32,
        norm_topk_prob=False,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )


def _deepseek_v3():
    from transformers import DeepseekV3Config

    common = _common()
    del common["head_dim"]  # MLA: the head sizes below
    # 3 layers, the first dense; 4 groups of 2 experts of which the router keeps the best 2 groups.
    return DeepseekV3Config(
        **common | {"num_hidden_layers": 3},
        intermediate_size=128,
        moe_intermediate_size=32,
        n_routed_experts=NUM_EXPERTS,
        num_experts_per_tok=TOP_K,
        n_shared_experts=1,
        n_group=4,
        topk_group=2,
        first_k_dense_replace=1,
        routed_scaling_factor=1.5,
        norm_topk_prob=True,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_rope_head_dim=4,
        qk_nope_head_dim=4,
        v_head_dim=8,
    )


def _gpt_oss():
    from transformers import GptOssConfig

    return GptOssConfig(
        **_common(),
        intermediate_size=32,
        num_local_experts=NUM_EXPERTS,
        num_experts_per_tok=TOP_K,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
    )


def _granitemoe():
    from transformers import GraniteMoeConfig

    common = _common()
    del common["head_dim"]  # hidden / heads
    return GraniteMoeConfig(
        **common | {"num_attention_heads": 8},
        intermediate_size=32,
        num_local_experts=NUM_EXPERTS,
        num_experts_per_tok=TOP_K,
    )


def _qwen3():
    from transformers import Qwen3Config

    return Qwen3Config(**_common(), intermediate_size=128)


def _llama():
    from transformers import LlamaConfig

    return LlamaConfig(**_common(), intermediate_size=128)


MOE_FAMILIES = {
    family.model_type: family
    for family in (
        Family("qwen3_moe", _qwen3_moe, ep_floor="5.7.0", moe_layers=(0, 1)),
        Family("mixtral", _mixtral, ep_floor="5.13.0", moe_layers=(0, 1)),
        Family("qwen2_moe", _qwen2_moe, ep_floor="5.13.0", moe_layers=(0, 1)),
        Family("deepseek_v3", _deepseek_v3, ep_floor="5.13.0", moe_layers=(1, 2)),
        Family(
            "gpt_oss",
            _gpt_oss,
            ep_floor="5.7.0",
            router="router",
            expert_params=("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias"),
            moe_layers=(0, 1),
        ),
        Family(
            "granitemoe",
            _granitemoe,
            ep_floor="5.21.0",
            moe_block="block_sparse_moe",
            router="router",
            moe_layers=(0, 1),
        ),
    )
}
DENSE_FAMILIES = {family.model_type: family for family in (Family("qwen3", _qwen3), Family("llama", _llama))}
FAMILIES = MOE_FAMILIES | DENSE_FAMILIES


def family(model_type: str) -> Family:
    try:
        return FAMILIES[model_type]
    except KeyError:
        raise ValueError(f"unknown model family {model_type!r}; known: {sorted(FAMILIES)}") from None
