"""A parameter or gradient as this rank holds it, or whole: the two views every check takes of a DTensor."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: gathered when it is a DTensor (a collective: every rank must call it)."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
