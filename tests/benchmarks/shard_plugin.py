"""A pytest plugin for the benchmarks: keep only this process's share of the collected tests.

`HARNESS_BENCH_SHARD=K/N` keeps every N-th test from the K-th (0-based), so N processes run the whole
selection between them, each on a similar mix of families and layouts. `HARNESS_BENCH_SAMPLE=M` first keeps
every M-th test of the selection: a smaller suite of the same mix, for a machine with little time. Loaded
with `-p shard_plugin` and tests/benchmarks on PYTHONPATH (bench_pool.py --shards or --sample does both)."""

from __future__ import annotations

import os

SHARD_ENV = "HARNESS_BENCH_SHARD"
SAMPLE_ENV = "HARNESS_BENCH_SAMPLE"


def parse_shard(value: str) -> tuple[int, int]:
    index, _, count = value.partition("/")
    shard, shards = int(index), int(count)
    if not 0 <= shard < shards:
        raise ValueError(f"{SHARD_ENV}={value!r}: expected K/N with 0 <= K < N")
    return shard, shards


def pytest_collection_modifyitems(config, items):
    value, sample = os.environ.get(SHARD_ENV), int(os.environ.get(SAMPLE_ENV) or 1)
    if not value and sample == 1:
        return
    shard, shards = parse_shard(value) if value else (0, 1)
    sampled = items[::sample]
    kept = [item for index, item in enumerate(sampled) if index % shards == shard]
    kept_ids = {id(item) for item in kept}
    dropped = [item for item in items if id(item) not in kept_ids]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept
