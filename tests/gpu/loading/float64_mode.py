"""Keeps the float64 reference in float64 where a model asks for a narrower float on purpose.

Many modeling files compute a part in float32 whatever the model's dtype (a router "runs in fp32, as in the
original": `hidden.float()`, `softmax(..., dtype=torch.float32)`, `.type(torch.float32)`; rotary embeddings:
`position_ids.float()`), next to parameters that are float64 in the reference: the product then fails
(`expected m1 and m2 to have the same dtype`; transformers 5.17's rotary embeddings multiply a float64
`inv_freq` by `position_ids.float()`: `expected scalar type Double but found Float`), or the reference silently
loses its digits there. Inside `stay_float64()`, every float the code asks for is float64: a cast to float32,
float16 or bfloat16 (`.float()`, `.to(dtype)`, `.type(dtype)`, a `dtype=` argument) of any tensor, integer ones
included, gives float64. Only the reference's forward runs inside it; the models under test keep their own casts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode

_NARROWER = (torch.float32, torch.float16, torch.bfloat16)
_NARROWING_METHODS = (torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16)


def _widened(value):
    return torch.float64 if value in _NARROWER else value


class StayFloat64(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in _NARROWING_METHODS:
            return args[0].to(torch.float64)  # the mode is off inside its own handler: this is a plain cast
        if func in (torch.Tensor.to, torch.Tensor.type):
            args = tuple(_widened(arg) if isinstance(arg, torch.dtype) else arg for arg in args)
        if "dtype" in kwargs:
            kwargs["dtype"] = _widened(kwargs["dtype"])
        return func(*args, **kwargs)


@contextlib.contextmanager
def stay_float64() -> Iterator[None]:
    with StayFloat64():
        yield
