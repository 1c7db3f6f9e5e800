"""How many of a long list of failures one rendering lists: at most so many per cell and so many in all, the rest
counted ("…and N more"). A night of 300,000 failures still renders a page a person can open; the full list stays
where machines read it (triage.json, each cell's junit.xml)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

Item = TypeVar("Item")


@dataclass(frozen=True, slots=True)
class Listed(Generic[Item]):
    """The items a rendering lists, in their order, and how many it leaves out."""

    shown: tuple[Item, ...]
    left_out: int


def listed(items: Sequence[Item], cells_of: Callable[[Item], Iterable[str]], *, per_cell: int,
           total: int) -> Listed[Item]:
    """The first items, in order, while fewer than `total` are listed, each taking a place in every one of its
    cells (`cells_of`): one is listed where some cell of it has fewer than `per_cell` listed yet (a failure grouped
    across many cells is not dropped for one full cell). The walk stops at `total`, whatever the list's length."""
    shown: list[Item] = []
    counts: dict[str, int] = {}
    for item in items:
        if len(shown) >= total:
            break
        cells = tuple(cells_of(item))
        if cells and all(counts.get(cell, 0) >= per_cell for cell in cells):
            continue
        shown.append(item)
        for cell in cells:
            counts[cell] = counts.get(cell, 0) + 1
    return Listed(shown=tuple(shown), left_out=len(items) - len(shown))
