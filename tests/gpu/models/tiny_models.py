"""Tiny checkpoints of every family in models/families.py, built from configs at test time and saved with
`save_pretrained` (no download), with a router that decides clearly by construction.

Hidden channels 0..7 carry a routing code: token `t`'s embedding holds PRIMARY_CODE in channel `t % 8` and
SECONDARY_CODE in channel `secondary_expert(t)`, zero in the other six. Nothing else writes those channels:
every module that adds to the residual stream (attention's o_proj, dense and shared MLPs' down_proj, the
expert stacks' down projection and its bias) has zero output rows there, so every layer's router sees the
same code, scaled by the RMS norm. The code carries most of the hidden state's norm, so that scale varies by
a few percent only. Each router row reads only its own channel, so token `t` goes to experts `t % 8` and
`secondary_expert(t)` in every MoE layer with logits near 5.4 and 4.7, the other six near 0: the third
score is about 4 below the top two, and the top routing weight's share stays well under 1 (bounds in
checks/tolerances.py, asserted on the suite's batch by tests/unit/suite/test_tiny_models.py). A router that scales what
it reads has its code raised until its margin clears the bound with room (calibrate_router_gain); a hash router's
token table is written with the same experts.

A router that is an MLP (families.ROUTER_MLPS) has each layer before its scoring weight copy the code channels
through, so its scoring weight reads the code as a plain router's does. A family fed no token ids
(families.MODEL_INPUTS) gets them another way: a talker through its own input embedding, at the start of its forward;
a vision encoder as one image per sequence whose patch for token t lights pixel t alone, so the patch projection's
column t plays token t's embedding row (token_table). Every forward of the suite goes through run_model.

The families' own extras keep their part in the decision without changing it: GPT-OSS's router bias and
DeepSeek-V3's correction-bias buffer get small distinct values (0.05 at most, far below the margin), so a
rank that loads them wrong shows in the load check and, if large enough, in routing.
"""

from __future__ import annotations

from pathlib import Path

import torch
from checks import routing, tolerances

from models import families

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
    config = families.accepted_tiny_config(family.model_type, family.config)
    torch.manual_seed(WEIGHTS_SEED)
    model = families.model_class(config)(config)
    if family.is_moe:
        with torch.no_grad():
            if family.model_type in families.UNINITIALIZED_EXPERTS:
                _draw_expert_stacks(model, family, config.initializer_range)
            write_routing_code(model, family)
            calibrate_router_gain(model, family)
    model.save_pretrained(path)
    return path


def _draw_expert_stacks(model, family: families.Family, std: float) -> None:
    """Expert stacks the model's own init never writes (families.UNINITIALIZED_EXPERTS), drawn normal(0, std)."""
    for layer in family.moe_layers:
        experts = model.get_submodule(f"{family.block_path(layer)}.{family.experts}")
        for name in family.expert_params:
            experts.get_parameter(name).normal_(0.0, std)  # a stack may sit in a child (`post_expert_norm.weight`)


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
            stack = experts.get_parameter(name)
            if not name.startswith("down_proj"):
                continue
            if stack.dim() == 2:  # a bias [experts, hidden]
                stack[:, CODE_CHANNELS] = 0.0
            elif getattr(experts, "is_transposed", False):  # [experts, intermediate, hidden]
                stack[:, :, CODE_CHANNELS] = 0.0
            else:  # [experts, hidden, intermediate]
                stack[:, CODE_CHANNELS, :] = 0.0


def token_table(model, family: families.Family) -> torch.Tensor:
    """[tokens, hidden]: what the model adds to the residual stream for each token id, as a view of its weights
    (writing it writes them): the input embedding's table, or for a vision encoder the patch projection's columns
    (token t's patch lights pixel t alone: model_inputs)."""
    embedding = model.get_input_embeddings()
    if family.inputs != "pixel_patches":
        return embedding.weight
    return _patch_weight(model).flatten(1).T[: families.VOCAB_SIZE]


def _patch_projection(model) -> torch.nn.Conv2d | torch.nn.Conv3d | torch.nn.Linear:
    """The patch embedding's projection: its one convolution or linear layer over the pixels of a patch."""
    layers = [
        module
        for module in model.get_input_embeddings().modules()
        if isinstance(module, (torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.Linear))
    ]
    if len(layers) != 1:
        raise families.NotBuilt(
            f"expected one projection in {type(model.get_input_embeddings()).__name__}, found {layers}"
        )
    return layers[0]


def _patch_weight(model) -> torch.Tensor:
    """The patch projection's weight (a Tensor, as mypy cannot tell from nn.Module's attributes)."""
    return _patch_projection(model).weight


def _pass_code_through(router, family: families.Family) -> None:
    """A router that is an MLP: each of its layers before the scoring weight copies the code channels from its
    input (identity there, no bias), so the scoring weight reads the code as a plain router would. The other
    channels keep their weights."""
    for path in family.router_mlp:
        layer = router.get_submodule(path)
        layer.weight[CODE_CHANNELS, :] = 0.0
        layer.weight[CODE_CHANNELS, CODE_CHANNELS] = torch.eye(families.NUM_EXPERTS)
        if layer.bias is not None:
            layer.bias[CODE_CHANNELS] = 0.0


def write_routing_code(model, family: families.Family) -> None:
    embedding = token_table(model, family)
    embedding.normal_(0.0, CONTENT_STD)
    embedding[:, CODE_CHANNELS] = 0.0
    for token in range(embedding.shape[0]):
        embedding[token, primary_expert(token)] = PRIMARY_CODE
        if family.top_k > 1:
            embedding[token, secondary_expert(token)] = SECONDARY_CODE
    _zero_code_outputs(model, family)
    if family.inputs == "pixel_patches":  # the projection's bias adds to every patch: none in the code channels
        bias = _patch_projection(model).bias
        if bias is not None:
            bias[CODE_CHANNELS] = 0.0
    for layer in family.moe_layers:
        router = model.get_submodule(f"{family.block_path(layer)}.{family.router}")
        _pass_code_through(router, family)
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
        run_model(model, make_batch())
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


# ---------------------------------------------------------------- model inputs


def _inputs_kind(model) -> str:
    return families.MODEL_INPUTS.get(str(getattr(model.config, "model_type", "")), "input_ids")


def model_inputs(model, batch: torch.Tensor) -> dict:
    """The keyword arguments that feed the token ids `batch` [sequences, tokens] to the model, as its family takes
    them (families.MODEL_INPUTS): token ids (also for a model embedding them outside its forward: run_model does
    that at the start of the forward); or, for a vision encoder, one image per sequence whose patches light pixel t
    for token t (an image of merge x tokens/merge patches, the grid its spatial merge needs)."""
    kind = _inputs_kind(model)
    if kind in ("input_ids", "inputs_embeds"):
        return {"input_ids": batch, "use_cache": False}  # no generation here: hybrids would build Mamba caches
    if kind == "pixel_patches":
        weight = _patch_weight(model)
        pixels = weight[0].numel()
        patches = torch.nn.functional.one_hot(batch.flatten(), pixels).to(weight.dtype)
        merge = model.config.spatial_merge_size
        sequences, tokens = batch.shape
        if tokens % merge:
            raise ValueError(f"{tokens} patches per image do not form a grid of {merge}-patch rows")
        grid = torch.tensor([[1, merge, tokens // merge]] * sequences, device=batch.device)
        return {"pixel_values": patches, "grid_thw": grid}
    raise ValueError(f"unknown input kind {kind!r}; known: {families.INPUT_KINDS}")


def _embed_input_ids(module, args, kwargs):
    """A forward pre-hook: the token ids embedded by the model's own input embedding (a parameter, so it trains),
    passed on as inputs_embeds. It runs inside the model's call, after FSDP2's pre-forward hook has gathered the
    root's parameters, as the embedding does in the model this one is part of (Qwen3-Omni's talker is fed its codec
    embedding's output by the talker for conditional generation)."""
    kwargs = dict(kwargs)
    kwargs["inputs_embeds"] = module.get_input_embeddings()(kwargs.pop("input_ids"))
    return args, kwargs


def run_model(model, batch: torch.Tensor):
    """The model's output on the token ids `batch`, fed as its family takes them (model_inputs)."""
    if _inputs_kind(model) != "inputs_embeds":
        return model(**model_inputs(model, batch))
    handle = model.register_forward_pre_hook(_embed_input_ids, with_kwargs=True)
    try:
        return model(**model_inputs(model, batch))
    finally:
        handle.remove()


def token_states(model, output, batch: torch.Tensor) -> torch.Tensor:
    """[sequences, tokens, hidden]: a base model's last hidden states per token of `batch`. A vision encoder returns
    its patches flat, and its merger's output (one row per spatial-merge group of patches, the states a text model
    would take) is added to each patch of its group, so the merger is part of what the suite compares."""
    hidden = _whole(output.last_hidden_state)
    if _inputs_kind(model) != "pixel_patches":
        return hidden
    pooled = _whole(output.pooler_output)
    group = hidden.shape[0] // pooled.shape[0]
    return (hidden + pooled.repeat_interleave(group, dim=0)).reshape(*batch.shape, -1)


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
