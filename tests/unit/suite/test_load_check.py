"""The load check's reading of a plain-tensor TP shard (rank_cases.tp_chunk, plan_style, check_load's plain-tensor
path): which chunk of the whole parameter a rank holds, by the plan's style, as transformers' ColwiseParallel and
RowwiseParallel cut it (torch.chunk semantics, as DTensor's Shard)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from checks.rank_cases import _plain_tp_share_problems, plan_style, tp_chunk

WHOLE = torch.arange(128 * 64, dtype=torch.float32).reshape(128, 64)


@pytest.mark.parametrize("rank", [0, 1])
def test_colwise_gives_each_rank_its_rows_of_a_weight_and_of_a_bias(rank):
    assert torch.equal(tp_chunk(WHOLE, "colwise", rank, 2), WHOLE[rank * 64 : (rank + 1) * 64])
    bias = torch.arange(10.0)
    assert torch.equal(tp_chunk(bias, "colwise", rank, 2), bias[rank * 5 : (rank + 1) * 5])


@pytest.mark.parametrize("rank", [0, 1])
def test_rowwise_gives_each_rank_its_columns_and_leaves_a_bias_whole(rank):
    whole = WHOLE.T.contiguous()  # a down projection: (hidden, intermediate)
    assert torch.equal(tp_chunk(whole, "rowwise", rank, 2), whole[:, rank * 64 : (rank + 1) * 64])
    assert tp_chunk(torch.arange(10.0), "rowwise", rank, 2) is None


def test_uneven_chunks_are_ceil_sized_and_a_trailing_rank_is_empty():
    whole = torch.arange(16.0 * 3).reshape(16, 3)
    sizes = [tp_chunk(whole, "colwise", rank, 3).shape[0] for rank in range(3)]
    assert sizes == [6, 6, 4]
    sizes = [tp_chunk(whole, "colwise", rank, 14).shape for rank in range(14)]
    assert sizes[:8] == [(2, 3)] * 8 and sizes[8:] == [(0, 3)] * 6


def test_a_local_style_shards_as_its_plain_one_and_others_are_not_read():
    assert torch.equal(tp_chunk(WHOLE, "local_colwise", 1, 2), WHOLE[64:])
    for style in ("packed_colwise", "ep_router", "grouped_gemm", None):
        assert tp_chunk(WHOLE, style, 0, 2) is None, style


def test_the_style_is_the_parameters_key_or_its_modules_with_layer_numbers_as_stars():
    model = SimpleNamespace(
        _ep_plan={"model.layers.*.mlp.gate_proj": "colwise", "model.layers.*.mlp.experts.down_proj": "grouped_gemm"}
    )
    assert plan_style(model, "model.layers.2.mlp.gate_proj.weight") == "colwise"
    assert plan_style(model, "model.layers.10.mlp.experts.down_proj") == "grouped_gemm"
    assert plan_style(model, "model.layers.0.mlp.up_proj.weight") is None
    assert plan_style(object(), "model.layers.0.mlp.gate_proj.weight") is None  # no plan on the model


def test_a_plain_shard_passes_only_as_its_ranks_chunk_bit_for_bit():
    name = "model.layers.0.mlp.gate_proj.weight"
    assert _plain_tp_share_problems(name, WHOLE[64:].clone(), WHOLE, "colwise", 1, 2) == []
    (wrong_chunk,) = _plain_tp_share_problems(name, WHOLE[:64].clone(), WHOLE, "colwise", 1, 2)
    assert wrong_chunk.startswith(f"rank 1's TP shard of {name} is not its colwise chunk of the whole model's "
                                  "((64, 64) of (128, 64) over 2 ranks; largest difference 4.1e+03)")
    off = WHOLE[64:].clone()
    off[3, 5] += 1e-6 * off[3, 5]
    assert _plain_tp_share_problems(name, off, WHOLE, "colwise", 1, 2)
    (no_style,) = _plain_tp_share_problems(name, WHOLE[64:].clone(), WHOLE, None, 1, 2)
    assert "differs from the whole model's after loading (a plain tensor of shape (64, 64)" in no_style
    (wrong_dim,) = _plain_tp_share_problems(name, WHOLE[:, :32].clone(), WHOLE, "colwise", 0, 2)
    assert "largest difference shape (128, 32) vs (64, 64)" in wrong_dim
