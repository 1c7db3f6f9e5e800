"""The names a case is made of and the known-bugs table matches on: its layout (`Layout`) and the checks it runs
(`Check`). Spelled once here, so a misspelt name is an AttributeError where it is written, not a known-bugs entry
that silently covers nothing. Imports nothing of the suite: every package may use it.

Each member is a `str` equal to its value, hashing as it does, so a member and its plain string are the same key of
a dict or a set (tf_adapter.LAYOUTS, KnownBug.covers), and `str()`, f-strings, `format()`, `%s` and json write the
plain value: test ids, JUnit properties and results read as they did with string literals. Python 3.12 changed
`format()` of a `(str, Enum)` member to its `Class.MEMBER` name, hence `__str__` and `__format__` written out
(`enum.StrEnum` needs 3.11).
"""

from __future__ import annotations

import enum


class PlainName(str, enum.Enum):
    """A name that reads as its plain value wherever it is written (its repr stays the enum's, for debugging)."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, format_spec: str) -> str:
        return str.__format__(self, format_spec)


class Layout(PlainName):
    """How a case lays the model out over its ranks: the keys of tf_adapter.LAYOUTS (what transformers' distributed
    loading or torch's fully_shard makes), and the one-device tier's own (training/device_cases.py)."""

    EP = "ep"
    FSDP = "fsdp"
    FSDP_EP = "fsdp_ep"
    FULLY_SHARD = "fully_shard"
    ONE_DEVICE = "one_device"


class Check(PlainName):
    """What a case runs, as the known-bugs table names it (KnownBug.checks, matched against a case's `checks`)."""

    # a rank's one-step checks (rank_cases.CHECKS, in the order they run); routing is checked within GRADIENTS
    LOAD = "load"
    LOGITS = "logits"
    QUANTIZED = "quantized"
    GRADIENTS = "gradients"
    # a training case's (training/steps.py TrainCase.checks; user loops and checkpoint cases train too)
    TRAIN = "train"
    TORCH_CLIP = "torch_clip"
    FUSED_ADAMW = "fused_adamw"
    MIXED_PRECISION = "mixed_precision"
    # a checkpoint case's: its kind (training/checkpointing.py KINDS), `_full_state_dict` where it passes one
    RESUME_OTHER_WORLD = "resume_other_world"
    SAVE_PRETRAINED = "save_pretrained"
    SAVE_PRETRAINED_FULL_STATE_DICT = "save_pretrained_full_state_dict"
