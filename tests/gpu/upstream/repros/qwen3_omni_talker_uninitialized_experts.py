"""transformers 5.24.0: a Qwen3-Omni-MoE talker built from its config (Qwen3OmniMoeTalkerModel(config), as
from_config or a fresh checkpoint does) keeps whatever memory torch.empty handed its expert stacks: `gate_up_proj`
and `down_proj` of every MoE layer are never initialized, so they hold stale memory (NaN here, whenever the
allocator reuses a freed NaN buffer).

Cause: Qwen3OmniMoePreTrainedModel._init_weights initializes the thinker's Qwen3OmniMoeThinkerTextSparseMoeBlock
only; the talker's Qwen3OmniMoeTalkerTextExperts (nn.Parameter(torch.empty(...))) matches no branch, and the generic
PreTrainedModel init skips 3-D parameters of a plain nn.Module. (The talker's router weight starts as zeros.)

Also: Qwen3OmniMoeTalkerModel.forward(input_ids=...) raises AttributeError (it calls self.embed_tokens, which the
talker has not: its input embedding is `codec_embedding`); the talker is fed inputs_embeds, as
Qwen3OmniMoeTalkerForConditionalGeneration does.

The suite draws the talker's expert stacks itself (families.UNINITIALIZED_EXPERTS) and feeds it inputs_embeds from
its codec embedding (families.MODEL_INPUTS).

Run by hand: python tests/gpu/upstream/repros/qwen3_omni_talker_uninitialized_experts.py
"""

import torch
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeTalkerTextConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeTalkerModel

config = Qwen3OmniMoeTalkerTextConfig(
    vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, shared_expert_intermediate_size=32,
    num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=8, num_experts=8, num_experts_per_tok=2,
)
model = Qwen3OmniMoeTalkerModel(config)
experts, shared = model.layers[0].mlp.experts, model.layers[0].mlp.shared_expert.gate_proj
with torch.no_grad():  # mark every parameter, then run the model's own init on the modules that hold them
    for param in (experts.gate_up_proj, experts.down_proj, shared.weight):
        param.fill_(float("nan"))
for module in (experts, model.layers[0].mlp, shared):
    model._init_weights(module)
for name, param in (("experts.gate_up_proj", experts.gate_up_proj), ("experts.down_proj", experts.down_proj),
                    ("shared_expert.gate_proj.weight", shared.weight)):
    print(f"after _init_weights, layers.0.mlp.{name} is {'left as it was (NaN)' if param.isnan().all() else 'drawn'}")
for attempt in range(3):
    stale = [torch.full(tuple(param.shape), float("nan")) for param in model.parameters() for _ in range(4)]
    del stale  # freed: the next allocations of these sizes may reuse this memory
    fresh = Qwen3OmniMoeTalkerModel(config)
    empty = [name for name, param in fresh.named_parameters() if not torch.isfinite(param).all()]
    print(f"fresh build {attempt}: parameters holding NaN/inf after init: {empty}")
try:
    model(input_ids=torch.zeros(1, 4, dtype=torch.long))
except AttributeError as error:
    print(f"forward(input_ids=...): AttributeError: {error}")
