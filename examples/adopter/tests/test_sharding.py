"""tinyshard's own tests: one on a single process, one on 2 ranks through harness's `ranks` fixture."""

from __future__ import annotations

import pytest
import tinyshard


def test_row_ranges_cover_every_row_once():
    for rows in range(0, 12):
        ranges = [tinyshard.row_range(rows, rank, 3) for rank in range(3)]
        assert [r for start, stop in ranges for r in range(start, stop)] == list(range(rows))


@pytest.mark.parametrize("world_size", [2])
def test_sharded_column_sum_matches_the_whole(ranks, world_size):
    errors = ranks.run(world_size, tinyshard.column_sum_error, 7, 5)
    ranks.record(max_column_sum_error=max(errors))
    assert max(errors) < 1e-12, errors
