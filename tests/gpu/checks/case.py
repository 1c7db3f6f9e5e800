"""What every case of the suite names, and checks when it is made: a family, a layout, a dtype, an experts
implementation and a defect planted on purpose. Each kind of case (rank_cases.Case, training/steps.TrainCase,
training/checkpointing.CheckpointCase, training/user_loops.UserLoopCase, training/device_cases.DeviceCase) adds its
own fields, the defects it can plant (checks/planted.py) and its own checks after these."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import ClassVar

from loading import tf_adapter
from models import families

from checks.kinds import Layout


@dataclass(frozen=True)
class SuiteCase:
    family: str  # a key of families.FAMILIES (or a variant of one)
    layout: Layout  # a key of tf_adapter.LAYOUTS
    # Keyword-only, so each kind of case adds its own positional fields after family and layout.
    dtype: str = field(default="float32", kw_only=True)
    experts_implementation: str | None = field(default=None, kw_only=True)  # transformers' (MoE families)
    bug: str | None = field(default=None, kw_only=True)  # a defect planted on purpose: one of BUGS

    BUGS: ClassVar[tuple[str, ...]] = ()  # the defects this kind of case plants (checks/planted.py)
    LAYOUTS: ClassVar[Collection[Layout]] = tf_adapter.LAYOUTS

    @property
    def planted_defect(self) -> str | None:
        """The defect this case plants on purpose (a deliberate-bug or negative test), if any."""
        return self.bug

    def __post_init__(self) -> None:
        families.family(self.family)  # raises naming the known families
        if self.layout not in self.LAYOUTS:
            raise ValueError(f"unknown layout {self.layout!r}; known: {sorted(map(str, self.LAYOUTS))}")
        if self.bug is not None and self.bug not in self.BUGS:
            raise ValueError(f"unknown bug {self.bug!r}; known: {self.BUGS}")
