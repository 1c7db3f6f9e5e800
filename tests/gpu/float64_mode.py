"""Keeps the float64 reference in float64 where a model casts to float32 on purpose.

Many modeling files compute a part in float32 whatever the model's dtype (a router "runs in fp32, as in the
original": `hidden.float()`, `softmax(..., dtype=torch.float32)`, `.to(torch.float32)`), next to parameters that
are float64 in the reference: the product then fails (`expected m1 and m2 to have the same dtype`), or the
reference silently loses its digits there. Inside `stay_float64()`, such a cast of a float64 tensor keeps
float64, so the reference is float64 throughout and the models under test keep their own casts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode

_NARROWER = (torch.float32, torch.float16, torch.bfloat16)


def _is_float64(value) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype == torch.float64


def _widened(value):
    return torch.float64 if value in _NARROWER else value


class StayFloat64(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in (torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16) and _is_float64(args[0]):
            return args[0]
        if any(_is_float64(arg) for arg in args):
            if func is torch.Tensor.to:
                args = tuple(_widened(arg) if isinstance(arg, torch.dtype) else arg for arg in args)
            if "dtype" in kwargs:
                kwargs["dtype"] = _widened(kwargs["dtype"])
        return func(*args, **kwargs)


@contextlib.contextmanager
def stay_float64() -> Iterator[None]:
    with StayFloat64():
        yield
