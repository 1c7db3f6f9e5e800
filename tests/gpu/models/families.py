"""The model families the suite loads sharded: every model type the installed transformers declares an
expert-parallel plan for, plus two dense families for FSDP2. This module is the registry: the only place in
the suite that names a family.

Most entries are generated. For every config class with a non-empty `base_model_ep_plan`, `tiny_config`
shrinks the class's own defaults to a tiny model (hidden 64, 3 layers, 8 experts, top-2, 16 query / 8
key-value heads of 8 channels, so TP can split heads up to 8 ranks), and `family` reads the module paths
from the EP plan (`layers.*.<moe block>.experts.<stack>`, or a vision encoder's `blocks.*`) and from the model
built on the meta device (where the decoder layers live, which layers are MoE, which child of the MoE block is the
router).

Hand entries are data, for what introspection cannot know:
- MECHANICS: the families that run deep (every experts implementation, both dtypes, 2/4/8 ranks, QAT),
  chosen for the EP mechanics where they differ: softmax top-k (qwen3_moe, mixtral), a shared expert
  (qwen2_moe), sigmoid routing with a correction-bias buffer, groups and a dense first layer (deepseek_v3),
  router and expert biases with transposed gate/up stacks (gpt_oss), other module names (granitemoe); and the
  dense qwen3 and llama for FSDP2. Their configs are written out, so their bounds stay measured.
- OVERRIDES: config values a family needs to build small (a validator's constraint) or to switch on a
  mechanic its default leaves off (an MoE block, q/k norms, shared experts).
- ROUTER_MLPS: a router that is an MLP (the layers the routing code passes through before its scoring weight).
- MODEL_INPUTS: a family that takes no token ids (a talker fed embeddings, a vision encoder fed pixel patches):
  how the suite's token ids reach it (tiny_models.model_inputs / run_model, which every forward of the suite uses).
- UNINITIALIZED_EXPERTS: a family whose own init leaves its expert stacks empty (the builder draws them).
- NOT_COVERED: declared families the suite cannot build, each with its reason (reports list them; none in 5.24.0).
  A family the registry fails to read on the installed release (its tiny config refused by the config class, an
  experts layout or router it cannot find) raises NotBuilt: its cases are *not built* with that reason
  (contract.NOT_BUILT), a gap of the suite, never a red of transformers and never a pass.
- EARLY_EP: families (generated or mechanics) whose EP cases run below the EP layout's floor, from their first
  release declaring an EP plan (ep_plan_history.json), where their EP cases were run on ranks (what those releases
  get wrong is in the known-bugs table).

Roles are data too (`ROLES`): which family the fake-quantization and deliberate-bug tests use.
"""

from __future__ import annotations

import functools
import importlib
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

# With this module, not at a family's first use: a module first imported during a rank's call retires the rank pool.
from models import ep_floors

HIDDEN_SIZE = 64
VOCAB_SIZE = 128
NUM_EXPERTS = 8
TOP_K = 2
NUM_LAYERS = 3
INITIALIZER_RANGE = 0.07  # above the default 0.02, so that every layer changes the residual stream visibly
# The experts implementation a wide (one-implementation) case runs: the one every release since the
# experts interface offers and the one EP dispatch is built around.
WIDE_EXPERTS_IMPLEMENTATION = "grouped_mm"


class NotBuilt(LookupError):
    """The suite's own code could not build or shape a family on the installed release: its tiny config refused by
    the config class, an experts layout, router or input it does not know. Raised only where the suite's own reading
    fails; where transformers raises on a config its class accepted, that is the release's red, not this."""


@dataclass(frozen=True)
class Family:
    model_type: str  # as transformers spells it: the test ids carry it
    config: Mapping = field(repr=False)  # keyword arguments of the config class, tiny
    # first transformers release whose config declares an EP plan for it (mechanics families, read from each
    # release's configuration_<family>.py; models/ep_plan_history.json has them all); for a generated family, only where
    # it runs below the EP layout's floor (EARLY_EP), else None (declared by the installed release)
    ep_floor: str | None = None
    deep: bool = False  # runs the full cross (a mechanics family)
    layers_prefix: str = "model.layers"  # where the decoder layers live in the loaded model
    moe_block: str = "mlp"  # a decoder layer's submodule holding the experts and the router ("" = the layer)
    router: str = "gate"  # the MoE block's attribute holding the router
    experts: str = "experts"  # the MoE block's attribute holding the expert stacks
    expert_params: tuple[str, ...] = ()  # stacked [experts, ...] parameters EP shards (empty: a dense family)
    moe_layers: tuple[int, ...] = ()  # indices of the decoder layers that are MoE (the others are dense)
    top_k: int = TOP_K
    # the router's linear layers, in order, before its scoring weight (a router that is an MLP: ROUTER_MLPS)
    router_mlp: tuple[str, ...] = ()
    # how the suite's token ids reach the model (MODEL_INPUTS): "input_ids", or one of INPUT_KINDS' other kinds
    inputs: str = "input_ids"

    @property
    def is_moe(self) -> bool:
        return bool(self.expert_params)

    def block_path(self, layer: int) -> str:
        return ".".join(part for part in (self.layers_prefix, str(layer), self.moe_block) if part)

    def router_paths(self) -> list[str]:
        return [f"{self.block_path(layer)}.{self.router}" for layer in self.moe_layers]

    def expert_stack_suffixes(self) -> tuple[str, ...]:
        block = f"{self.moe_block}." if self.moe_block else ""
        return tuple(f"{block}{self.experts}.{param}" for param in self.expert_params)

    def is_expert_stack(self, name: str) -> bool:
        """A parameter EP shards along its first (expert) dimension."""
        return self.is_moe and name.endswith(self.expert_stack_suffixes())


# ---------------------------------------------------------------- hand entries (data)


def _attention(**extra) -> dict:
    return {"num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 8} | extra


_COMMON = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": HIDDEN_SIZE,
    "num_hidden_layers": 2,
    "max_position_embeddings": 64,
    "initializer_range": INITIALIZER_RANGE,
    "tie_word_embeddings": False,
}
_MOE = {"num_experts_per_tok": TOP_K}

# model_type -> (config, ep_floor; None for a dense family): written out, as the suite's bounds were measured on them
MECHANICS: Mapping[str, tuple[dict, str | None]] = MappingProxyType(
    {
        "qwen3_moe": (
            _COMMON
            | _attention()
            | _MOE
            | {
                "intermediate_size": 128,
                "moe_intermediate_size": 32,
                "num_experts": NUM_EXPERTS,
                "norm_topk_prob": False,
                "decoder_sparse_step": 1,
                "mlp_only_layers": [],
            },
            "5.7.0",
        ),
        "mixtral": (
            _COMMON | _attention() | _MOE | {"intermediate_size": 32, "num_local_experts": NUM_EXPERTS},
            "5.13.0",
        ),
        "qwen2_moe": (
            _COMMON
            | _attention()
            | _MOE
            | {
                "intermediate_size": 128,
                "moe_intermediate_size": 32,
                "num_experts": NUM_EXPERTS,
                "shared_expert_intermediate_size": 32,
                "norm_topk_prob": False,
                "decoder_sparse_step": 1,
                "mlp_only_layers": [],
            },
            "5.13.0",
        ),
        # 3 layers, the first dense; 4 groups of 2 experts of which the router keeps the best 2 groups; MLA heads
        "deepseek_v3": (
            _COMMON
            | _MOE
            | {
                "num_hidden_layers": 3,
                "num_attention_heads": 16,
                "num_key_value_heads": 8,
                "intermediate_size": 128,
                "moe_intermediate_size": 32,
                "n_routed_experts": NUM_EXPERTS,
                "n_shared_experts": 1,
                "n_group": 4,
                "topk_group": 2,
                "first_k_dense_replace": 1,
                "routed_scaling_factor": 1.5,
                "norm_topk_prob": True,
                "q_lora_rank": 32,
                "kv_lora_rank": 16,
                "qk_rope_head_dim": 4,
                "qk_nope_head_dim": 4,
                "v_head_dim": 8,
            },
            "5.13.0",
        ),
        "gpt_oss": (
            _COMMON
            | _attention()
            | _MOE
            | {
                "intermediate_size": 32,
                "num_local_experts": NUM_EXPERTS,
                "sliding_window": 8,
                "layer_types": ["sliding_attention", "full_attention"],
            },
            "5.7.0",
        ),
        "granitemoe": (
            _COMMON
            | _MOE
            | {"num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 32}
            | {"num_local_experts": NUM_EXPERTS},
            "5.21.0",
        ),
        "qwen3": (_COMMON | _attention() | {"intermediate_size": 128}, None),
        "llama": (_COMMON | _attention() | {"intermediate_size": 128}, None),
    }
)

# Which family a test that exercises the suite's own instruments (not a family mechanic) uses.
ROLES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "quantized_moe": ("qwen3_moe",),  # fake quantization on expert stacks
        "quantized_dense": ("qwen3",),  # fake quantization on dense MLPs
        # trained with every AdamW kernel, torch's clip_grad_norm_, a resume and the planted training bugs: a MoE
        # whose EP plan has no replicated_with_grad_allreduce norm (its gradient accumulation is a known bug)
        "trained_moe": ("mixtral",),
        "trained_dense": ("qwen3",),
        "perturb_expert": ("qwen3_moe", "granitemoe"),  # an expert perturbed on one rank
        "perturb_expert_bias": ("gpt_oss",),  # families with expert biases
        "perturb_correction_bias": ("deepseek_v3",),  # a router correction-bias buffer
        "perturb_router": ("qwen3_moe", "mixtral"),  # a router flipped on one rank
        "scale_expert_gradient": ("qwen3_moe", "deepseek_v3"),  # one rank's expert gradients 1% off (EP)
        "scale_shard_gradient": ("qwen3",),  # one rank's FSDP2 shard of a gradient 1% off
    }
)

# Config values beyond the generic shrink, by family: a validator's constraint, or a mechanic switched on.
OVERRIDES: Mapping[str, dict] = MappingProxyType(
    {
        # defaults leave these None (the modeling code reads them unconditionally)
        "deepseek_ocr2_text": {"mlp_layer_types": ["dense", "sparse", "sparse"]},
        "hunyuan_v1_moe": {"head_dim": 8},
        # its validator: NVFP4 rounding of keys and values needs a head_dim that is a multiple of 16, and at most as
        # many index heads as query heads share a key head (16 of them over 8)
        "kolibri1_1": {"head_dim": 16, "index_num_heads": 2},
        # zero-computation experts (identity rows of the router) off: the routing code scores the routed experts only;
        # its rotary embedding is sized by head_dim, which MLA leaves at the default: the tiny rope head's
        "longcat_flash": {"zero_expert_num": 0, "head_dim": 4},
        "lfm2_moe": {"layer_types": ["full_attention", "conv", "full_attention"]},
        # its sliding layers' MLA sizes are constructor aliases absent from to_dict (swa_*; 64 heads, ranks 1024:
        # 38M parameters unshrunk); tiny, and unlike the indexed layers' (4 rope dims there, 8 here), so a reader of
        # the top-level sizes on a sliding layer still shows
        "dots3_note_text": {"swa_num_attention_heads": 8, "swa_num_key_value_heads": 8, "swa_q_lora_rank": 32,
                            "swa_kv_lora_rank": 16, "swa_head_dim": 16, "swa_qk_nope_head_dim": 8,
                            "swa_v_head_dim": 8},
        "qwen3_omni_moe_talker_text": {"shared_expert_intermediate_size": 32},
        "qwen4_exp_text": {
            "indexer_n_heads": 4,
            "indexer_kv_heads": 1,
            "indexer_head_dim": 8,
            "indexer_budget": 16,
            "indexer_compress_ratio": 4,
        },
        # its third layer's residual stream leaks into the code channels (a centered norm): two layers, both MoE
        "muse_spark_text": {
            "num_hidden_layers": 2,
            "layer_types": ["sliding_attention", "full_attention"],
            "mlp_layer_types": ["sparse", "sparse"],
        },
        # validators: Mamba heads x head size = expand x hidden; mrope sections sum to half the rotary dims
        "granitemoehybrid": {"mamba_d_head": 16},
        "glm4v_moe_text": {
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
                "mrope_section": [1, 0, 0],
            }
        },
        "hy_v4_vl_text": {
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [0, 1, 1]}
        },
        # its 3-D rope takes mrope_section from rope_parameters (not a config key) and pre-rotates the h/w part: the
        # sections (h = w, t >= 1) sum to half the head size, which its config leaves at hidden / heads (4) unless set
        "ernie4_5_vl_moe_text": {
            "head_dim": 8,
            "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0, "mrope_section": [1, 1, 2]},
        },
        # the adapter reads the encoder's width (a validator); a 7x7 RGB patch has 147 >= VOCAB_SIZE pixels, so
        # token t's patch can light pixel t alone (tiny_models.model_inputs)
        "dots3_note_vision_encoder": {"adapter_in_dim": HIDDEN_SIZE, "adapter_out_dim": HIDDEN_SIZE, "patch_size": 7},
        # top-1 only (a validator); a router hidden size as wide as the residual stream, so the router MLP's scoring
        # weight is [experts + skip, hidden] and its other layers can pass the routing code through (ROUTER_MLPS)
        "zaya": {"num_experts_per_tok": 1, "router_hidden_size": HIDDEN_SIZE},
    }
)

# Families whose router is an MLP: its linear layers before the scoring weight, in order (module paths in the router).
# The routing code passes through them unchanged (tiny_models.write_routing_code); the recorder reads the MLP's logits.
ROUTER_MLPS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"zaya": ("down_proj", "router_mlp.fc1", "router_mlp.fc2")}
)

# Families whose model init leaves the expert stacks as torch.empty left them (stale memory, NaN at times): the
# builder draws them as the family's sibling models do, normal(0, initializer_range)
# (upstream/repros/qwen3_omni_talker_uninitialized_experts.py).
UNINITIALIZED_EXPERTS: tuple[str, ...] = ("qwen3_omni_moe_talker_text",)

# How the suite's token ids reach a model that takes no input_ids (tiny_models.model_inputs builds them):
# - "inputs_embeds": embedded by the model's own input embedding outside its forward (a talker embeds codec ids
#   with its codec embedding and adds the thinker's states; its forward has no token embedding)
# - "pixel_patches": a vision encoder; each sequence is one image of SEQUENCE_LENGTH patches, token t's patch
#   lighting pixel t alone, so the patch projection's column t is token t's embedding
INPUT_KINDS = ("input_ids", "inputs_embeds", "pixel_patches")
MODEL_INPUTS: Mapping[str, str] = MappingProxyType(
    {"qwen3_omni_moe_talker_text": "inputs_embeds", "dots3_note_vision_encoder": "pixel_patches"}
)

# Declared families the suite cannot build or run, with the reason. None now.
NOT_COVERED: Mapping[str, str] = MappingProxyType({})

# Generated families whose EP cases run below the EP layout's floor (tf_adapter.LAYOUTS[Layout.EP].floor), from their
# first release declaring an EP plan (ep_floors.py). openai_privacy_filter (5.6.0): its wide EP case ran at 5.6.0,
# 5.6.1, 5.6.2 and 5.7.0 (torch 2.13.0, 2 gloo ranks): load and logits pass, its gradients fail as
# known_bugs._EARLY_RELEASE_BUGS says (5.6-5.16; 5.17.0 passes). gemma4_text (5.6.0): its EP plan TP-shards the dense
# MLP weights as plain tensors ((64, 64) of (128, 64)); the load, gradient and training checks read such a shard as
# its chunk of the whole model's (rank_cases.is_plain_tp_shard, tp_chunk), and its gradients fail as its entries
# say. Not candidates: gpt_oss (5.3.0: EP loading fails for every family at 5.0-5.5, which hand the weight loader
# the TP plan) and llama4_text (4.54.0; its EP forward fails at 5.6-5.7: the EP router hook unpacks three outputs
# from a router returning two).
EARLY_EP: tuple[str, ...] = ("gemma4_text", "gpt_oss", "openai_privacy_filter")


# ---------------------------------------------------------------- the generic shrink


_EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_TOP_KS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_k", "top_k_experts")
_SHARED_EXPERT_COUNTS = ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts")
# Values a tiny model takes wherever its config class has the key (None included: a mechanic turned on).
_TINY = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": HIDDEN_SIZE,
    "num_hidden_layers": NUM_LAYERS,
    "max_position_embeddings": 64,
    "initializer_range": INITIALIZER_RANGE,
    "tie_word_embeddings": False,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "swa_num_attention_heads": 16,
    "swa_num_key_value_heads": 8,
    "num_sliding_attention_heads": 16,
    "sliding_window": 8,
    "n_group": 4,
    "num_expert_group": 4,
    "topk_group": 2,
    "first_k_dense_replace": 1,
    "num_dense_layers": 1,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "router_jitter_noise": 0.0,  # a random router cannot be compared; the whole model and the shards see none
    "index_topk": 16,
    # Mamba-2's torch path pads the sequence to a whole chunk: a 256-token chunk made a 16-token batch 16x the work
    "mamba_chunk_size": 16,
    "chunk_size": 16,  # nemotron_h's name for it
    "mamba_d_state": 16,
    "ssm_state_size": 16,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
# Head sizes, set only where the default is not None (None there means derived, e.g. MLA's head_dim).
_HEAD_SIZES = {
    "head_dim": 8,
    "swa_head_dim": 8,
    "kv_lora_rank": 16,
    "q_lora_rank": 32,
    "o_lora_rank": 16,
    "qk_rope_head_dim": 4,
    "qk_nope_head_dim": 4,
    "v_head_dim": 8,
    "index_n_heads": 4,
    "index_head_dim": 8,
    "indexer_n_heads": 4,
    "indexer_kv_heads": 4,
    "indexer_head_dim": 8,
    "linear_num_key_heads": 8,
    "linear_num_value_heads": 8,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "linear_head_dim": 8,
    "linear_num_heads": 8,
    "mamba_num_heads": 8,
    "mamba_n_heads": 8,
    "mamba_head_dim": 8,
    "mamba_d_head": 8,
    "router_hidden_size": 16,
}
_MLA_DERIVED = ("head_dim", "qk_head_dim")  # MLA computes these from its rope / nope sizes


def config_class(model_type: str):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]


def declared_ep_families() -> list[str]:
    """Every model_type whose config class carries a non-empty EP plan in the installed release."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

    declared = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation notes of configs we only look at
        for model_type in CONFIG_MAPPING_NAMES:
            try:
                config_cls = CONFIG_MAPPING[model_type]
            except (ImportError, AttributeError, KeyError):  # a config needing an extra that is not installed
                continue
            if getattr(config_cls, "base_model_ep_plan", None):
                declared.append(model_type)
    return sorted(declared)


def _one_of_each(types: list, count: int) -> list:
    """`count` layer types covering each distinct type of the default pattern, in order of first appearance."""
    distinct = list(dict.fromkeys(types))
    sparse = [kind for kind in distinct if kind in ("sparse", "moe")]
    chosen = distinct[:count]
    # every pattern keeps at least two MoE layers when the default has any
    while len(chosen) < count:
        chosen.append(sparse[0] if sparse else types[-1])
    if sparse and chosen.count(sparse[0]) < 2:
        chosen[-1] = sparse[0]
    return chosen


def tiny_config_kwargs(model_type: str) -> dict:
    """The tiny config's keyword arguments: the class's defaults shrunk by key, then the family's overrides."""
    if model_type in MECHANICS:
        return dict(MECHANICS[model_type][0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        defaults = config_class(model_type)().to_dict()
    mla = defaults.get("kv_lora_rank") is not None
    tiny: dict = {}
    for key, value in defaults.items():
        if key in _EXPERT_COUNTS:
            tiny[key] = NUM_EXPERTS
        elif key in _TOP_KS:
            tiny[key] = TOP_K
        elif key in _SHARED_EXPERT_COUNTS:
            tiny[key] = 1  # shared experts on: the checkpoints people use have them
        elif key.startswith("enable_moe"):
            tiny[key] = True
        elif key in _TINY:
            tiny[key] = _TINY[key]
        elif key in _HEAD_SIZES and value and not (mla and key in _MLA_DERIVED):
            tiny[key] = _HEAD_SIZES[key]
        elif "vocab_size" in key and isinstance(value, int):
            tiny[key] = VOCAB_SIZE
        elif key.endswith(("intermediate_size", "ffn_hidden_size")) or key in ("share_expert_dim", "moe_hidden_size"):
            size = 32 if any(part in key for part in ("moe", "shared", "expert")) else 128
            if isinstance(value, list):
                tiny[key] = [size] * len(value)
            elif value is not None or key.startswith("moe"):  # an MoE size left None: the MoE block switched on
                tiny[key] = size
        elif key in ("layer_types", "mlp_layer_types") and isinstance(value, list):
            tiny[key] = _one_of_each(value, NUM_LAYERS)
    if mla:
        tiny["num_key_value_heads"] = tiny.get("num_attention_heads", 16)  # MLA has no grouped kv heads
    return tiny | OVERRIDES.get(model_type, {})


def tiny_config(model_type: str):
    return accepted_tiny_config(model_type, tiny_config_kwargs(model_type))


def accepted_tiny_config(model_type: str, kwargs: Mapping):
    """The config class built from the suite's tiny values; a class that refuses them (its validation) leaves the
    family not built: the values are the suite's, not a checkpoint anyone ships."""
    cls = config_class(model_type)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cls(**kwargs)
    except Exception as error:  # any refusal: the class's validation raises what it likes
        # a validator nests its cause on the lines after the first
        words = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
        raise NotBuilt(f"{model_type}: {cls.__name__} refuses the suite's tiny config: {type(error).__name__}: "
                       f"{words}") from error


def not_built_reason(model_type: str) -> str | None:
    """Why the suite cannot build the family on the installed release (NotBuilt), or None."""
    try:
        family(model_type)
    except NotBuilt as error:
        return str(error)
    return None


def model_class(config):
    """The class the family loads through: the Auto class its config maps to (causal LM first, then the base
    model); for a sub-config no Auto class maps (a VL model's text part), its modeling module's own class."""
    from transformers.models.auto import modeling_auto

    for mapping in (modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING, modeling_auto.MODEL_MAPPING):
        try:
            return mapping[type(config)]
        except KeyError:
            continue
    module = importlib.import_module(type(config).__module__.replace(".configuration_", ".modeling_"))
    candidates = [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and getattr(value, "config_class", None) is type(config)
        and not value.__name__.endswith("PreTrainedModel")
        and value.__name__.endswith(("ForCausalLM", "Model"))
    ]
    if not candidates:
        raise NotBuilt(f"no model class for {type(config).__name__} in {module.__name__}")
    return min(candidates, key=lambda cls: (not cls.__name__.endswith("ForCausalLM"), cls.__name__))


# ---------------------------------------------------------------- module paths, read


def _built_paths(model) -> tuple[str, str, str, tuple[str, ...]]:
    """(layer list, moe block, experts attribute, expert stacks) of a built model, for a release whose config
    declares no EP plan for the family (its EP cases skip, but its checkpoint is still built): the first `experts`
    module of a decoder layer and its stacked [experts, ...] parameters."""
    pattern = re.compile(r"(?:.*\.)?layers\.\d+\.(?P<block>.*?)\.?(?P<experts>experts)")
    for name, module in model.named_modules():
        match = pattern.fullmatch(name)
        if match is not None:
            stacks = tuple(
                param_name
                for param_name, param in module.named_parameters(recurse=False)
                if param.dim() >= 2 and param.shape[0] == NUM_EXPERTS
            )
            return "layers", match["block"] or "", match["experts"], stacks
    raise NotBuilt(f"no experts module under layers.N in {type(model).__name__}")


def _plan_paths(model_type: str) -> tuple[str, str, str, tuple[str, ...]] | None:
    """(layer list, moe block, experts attribute, expert stacks) from the EP plan:
    `<layers>.*.<block>.<experts>[.<stack>]` (the list is `layers`, or a vision encoder's `blocks`); None when the
    installed release declares no plan for it."""
    plan = dict(getattr(config_class(model_type), "base_model_ep_plan", None) or {})
    dispatch = [key for key, style in plan.items() if style == "ep_dispatch_experts"]
    if not dispatch:
        return None
    # one experts module per layer (the first when a layer has several, as a VL model's text/vision MoE)
    experts_key = dispatch[0]
    match = re.fullmatch(r"(?:.*\.)?(?P<layers>[^.*]+)\.\*\.(?:(?P<block>.*)\.)?(?P<experts>[^.]+)", experts_key)
    if match is None:
        raise NotBuilt(f"{model_type}: the EP plan's experts key {experts_key!r} is not under a layer list (.*)")
    stacks = tuple(
        key.removeprefix(experts_key + ".")
        for key, style in plan.items()
        if key.startswith(experts_key + ".") and style == "grouped_gemm"
    )
    return match["layers"], match["block"], match["experts"], stacks


def _read_layout(model, model_type: str, layers: str, block: str, experts: str) -> tuple[str, tuple[int, ...], str]:
    """(decoder layers prefix, MoE layer indices, router attribute) of a built model."""
    suffix = ".".join(part for part in (block, experts) if part)
    pattern = re.compile(rf"(?P<prefix>(?:.*\.)?{re.escape(layers)})\.(?P<layer>\d+)\.{re.escape(suffix)}")
    found: dict[int, str] = {}
    prefix = None
    for name, _ in model.named_modules():
        match = pattern.fullmatch(name)
        if match is not None:
            prefix = prefix or match["prefix"]
            if match["prefix"] == prefix:
                found[int(match["layer"])] = name
    if not found:
        raise NotBuilt(f"{model_type}: no module ends in {layers}.N.{suffix} in {type(model).__name__}")
    first = model.get_submodule(found[min(found)].rsplit(".", 1)[0])
    routers = [name for name, child in first.named_children() if name != experts and router_weight(child) is not None]
    if len(routers) != 1:
        raise NotBuilt(
            f"{model_type}: expected one router beside {suffix} (a child holding a [{NUM_EXPERTS}, {HIDDEN_SIZE}] "
            f"weight), found {routers or 'none'}"
        )
    assert prefix is not None  # set by the first module found, and found is not empty
    return prefix, tuple(sorted(found)), routers[0]


def router_weight(module):
    """(name, parameter, transposed) of the [experts, hidden] (or [hidden, experts]) weight a router scores
    tokens with, searched in the module and its children; None when it holds none."""
    # a router may also score shared experts (one more row each): the routed experts' rows come first
    routed_rows = range(NUM_EXPERTS, NUM_EXPERTS + 3)
    for name, param in module.named_parameters():
        if param.dim() != 2:
            continue
        if param.shape[0] in routed_rows and param.shape[1] == HIDDEN_SIZE:
            return name, param, False
        if param.shape[0] == HIDDEN_SIZE and param.shape[1] in routed_rows:
            return name, param, True
    return None


def _early_ep_floor(model_type: str) -> str | None:
    """A family's EP floor below the layout's: its first release declaring an EP plan, where its EP cases were run
    there (EARLY_EP); else None (a mechanics family's hand floor, or the layout's, holds)."""
    return ep_floors.first_ep_release(model_type) if model_type in EARLY_EP else None


@functools.cache
def family(model_type: str) -> Family:
    """The registry's entry: hand data where there is some, the rest read from the release and a meta-device build.
    A variant's name (`variant(model_type, kind)`) gives the family's entry for that variant's config."""
    base, kind = split_variant(model_type)
    if kind is not None:
        return _variant_family(base, kind)
    if model_type in NOT_COVERED:
        raise ValueError(f"family {model_type!r} is not covered: {NOT_COVERED[model_type]}")
    if model_type in MECHANICS and MECHANICS[model_type][1] is None:  # a dense family
        return Family(model_type, MappingProxyType(tiny_config_kwargs(model_type)), deep=True)
    kwargs = tiny_config_kwargs(model_type)
    return Family(
        model_type,
        MappingProxyType(kwargs),
        ep_floor=_early_ep_floor(model_type) or (MECHANICS[model_type][1] if model_type in MECHANICS else None),
        deep=model_type in MECHANICS,
        router_mlp=ROUTER_MLPS.get(model_type, ()),
        inputs=MODEL_INPUTS.get(model_type, "input_ids"),
        **_built_layout(model_type, kwargs),
    )


def _built_layout(model_type: str, kwargs: dict) -> dict:
    """The Family fields read from the model that `kwargs` builds on the meta device: where its decoder layers,
    MoE blocks, routers and expert stacks are, and its top-k."""
    import torch

    config = accepted_tiny_config(model_type, kwargs)
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = model_class(config)(config)
    layers, block, experts, stacks = _plan_paths(model_type) or _built_paths(model)
    prefix, moe_layers, router = _read_layout(model, model_type, layers, block, experts)
    return {"layers_prefix": prefix, "moe_block": block, "router": router, "experts": experts,
            "expert_params": stacks, "moe_layers": moe_layers,
            "top_k": next((kwargs[key] for key in _TOP_KS if key in kwargs), TOP_K)}


# ---------------------------------------------------------------- variants: a family's tiny config, more switched on

# A variant is named `<model_type>+<kind>` (a checkpoint, a Case and the test ids carry that name); its Family keeps the
# model_type transformers spells and holds the variant's config, its module paths read from that config's model.
VARIANT_SEPARATOR = "+"
SWITCHES_ON = "switches"  # every switch models/config_switches.py keeps, flipped from the tiny config's value
VARIANT_KINDS = (SWITCHES_ON,)


def variant(model_type: str, kind: str) -> str:
    if kind not in VARIANT_KINDS:
        raise ValueError(f"unknown variant {kind!r}; known: {VARIANT_KINDS}")
    return f"{model_type}{VARIANT_SEPARATOR}{kind}"


def split_variant(name: str) -> tuple[str, str | None]:
    """(model_type, variant kind or None) of a registry name."""
    base, separator, kind = name.partition(VARIANT_SEPARATOR)
    return (base, kind) if separator else (name, None)


def variant_config_kwargs(model_type: str, kind: str) -> dict:
    """The variant's tiny config: for SWITCHES_ON, the family's tiny config with every kept switch flipped."""
    if kind != SWITCHES_ON:
        raise ValueError(f"unknown variant {kind!r} of {model_type}; known: {VARIANT_KINDS}")
    from models import (
        config_switches,  # here, not at the top: it imports this module (rank_cases imports it for the ranks)
    )

    return config_switches.switches_on_kwargs(model_type)


def _variant_family(model_type: str, kind: str) -> Family:
    """The family's entry with the variant's config and the module paths its model has (a switch can add a router
    bias or move a norm, never the family's floor or inputs)."""
    import dataclasses

    entry = family(model_type)
    kwargs = variant_config_kwargs(model_type, kind)
    if not entry.is_moe:
        return dataclasses.replace(entry, config=MappingProxyType(kwargs), deep=False)
    return dataclasses.replace(entry, config=MappingProxyType(kwargs), deep=False,
                               **_built_layout(model_type, kwargs))


# ---------------------------------------------------------------- what the tests parametrize over


def deep_moe() -> list[str]:
    return sorted(name for name, (_, floor) in MECHANICS.items() if floor is not None)


def dense() -> list[str]:
    return sorted(name for name, (_, floor) in MECHANICS.items() if floor is None)


@functools.cache
def wide_moe() -> list[str]:
    """Declared EP families beyond the mechanics ones, each run wide and shallow (not-covered ones left out)."""
    return [name for name in declared_ep_families() if name not in MECHANICS and name not in NOT_COVERED]


@functools.cache
def wide_implementation(model_type: str) -> str | None:
    """The experts implementation a wide case runs: WIDE_EXPERTS_IMPLEMENTATION, or None (the model's own
    forward) for a model class that does not let one be set."""
    model = model_class(tiny_config(model_type))
    can_set = getattr(model, "_can_set_experts_implementation", None)
    return WIDE_EXPERTS_IMPLEMENTATION if can_set is None or can_set() else None


def role(name: str) -> list[str]:
    return list(ROLES[name])
