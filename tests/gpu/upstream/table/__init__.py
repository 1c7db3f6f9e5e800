"""The known-bugs table, one module per group of entries (what found them, and when); ENTRIES is all of them, in
the order a covered case's entries are tried. upstream/known_bugs.py reads it; nothing here matches a failure."""

from __future__ import annotations

from upstream.entry import KnownBug
from upstream.table import (
    early_releases,
    exhaustive_tier,
    gpt_oss,
    grouped_mm,
    new_in_5_25,
    one_step,
    training_steps,
)

ENTRIES: tuple[KnownBug, ...] = (
    one_step.ENTRIES
    + training_steps.ENTRIES
    + early_releases.ENTRIES
    + grouped_mm.ENTRIES
    + exhaustive_tier.ENTRIES
    + gpt_oss.ENTRIES
    + new_in_5_25.ENTRIES
)
