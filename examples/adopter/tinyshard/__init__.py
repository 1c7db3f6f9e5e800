"""Row sharding of a tensor across ranks: the small distributed code this example repository tests."""

from __future__ import annotations

import torch
import torch.distributed as dist


def row_range(rows: int, rank: int, world_size: int) -> tuple[int, int]:
    """The rows [start, stop) that `rank` holds: contiguous blocks, the first `rows % world_size` one longer."""
    base, extra = divmod(rows, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def shard_rows(tensor: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    start, stop = row_range(tensor.shape[0], rank, world_size)
    return tensor[start:stop]


def sharded_column_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The column sums of `tensor`, each rank adding only its own rows, then one all-reduce."""
    partial = shard_rows(tensor, dist.get_rank(), dist.get_world_size()).sum(dim=0)
    dist.all_reduce(partial)
    return partial


def column_sum_error(rows: int, columns: int) -> float:
    """Runs on every rank (through harness's `ranks` fixture): the largest difference between the sharded
    column sum and the whole tensor's."""
    torch.manual_seed(0)  # every rank builds the same tensor
    whole = torch.randn(rows, columns, dtype=torch.float64)
    return (sharded_column_sum(whole) - whole.sum(dim=0)).abs().max().item()
