"""A pytest plugin for the benchmarks: keep only this process's share of the collected tests.

`HARNESS_BENCH_SHARD=K/N` keeps every N-th test from the K-th (0-based), so N processes run the whole
selection between them, each on a similar mix of families and layouts. Loaded with `-p shard_plugin` and
tests/benchmarks on PYTHONPATH (bench_pool.py --shards does both)."""

from __future__ import annotations

import os

SHARD_ENV = "HARNESS_BENCH_SHARD"


def parse_shard(value: str) -> tuple[int, int]:
    index, _, count = value.partition("/")
    shard, shards = int(index), int(count)
    if not 0 <= shard < shards:
        raise ValueError(f"{SHARD_ENV}={value!r}: expected K/N with 0 <= K < N")
    return shard, shards


def pytest_collection_modifyitems(config, items):
    value = os.environ.get(SHARD_ENV)
    if not value:
        return
    shard, shards = parse_shard(value)
    kept = [item for index, item in enumerate(items) if index % shards == shard]
    dropped = [item for index, item in enumerate(items) if index % shards != shard]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept
