"""The suite's fixtures: the plugin that runs ranks (harness/ranks/plugin.py) and the tiny checkpoints."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

SUITE_DIR = Path(__file__).resolve().parent
# The ranks import the suite's helper modules (rank_cases, tiny_models, ...) by name: a spawned rank
# inherits this sys.path, whatever pytest's import mode.
if str(SUITE_DIR) not in sys.path:
    sys.path.insert(0, str(SUITE_DIR))
# Everything is built locally; never reach for the Hub, in this process or the ranks it starts.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The ranks fixture and its rank pool (HARNESS_RANKS_POOL=0 turns the pool off). An installed harness
# registers the plugin through its pytest11 entry point, `harness run` with `-p`; this covers a checkout
# on PYTHONPATH alone (where its options, such as --no-ranks-pool, arrive too late to be parsed).
PLUGIN = "harness.ranks.plugin"


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin(PLUGIN):
        config.pluginmanager.import_plugin(PLUGIN)


@pytest.fixture(scope="session")
def moe_checkpoint(tmp_path_factory) -> str:
    import tiny_models

    return str(tiny_models.build_moe(tmp_path_factory.mktemp("qwen3-moe")))


@pytest.fixture(scope="session")
def dense_checkpoint(tmp_path_factory) -> str:
    import tiny_models

    return str(tiny_models.build_dense(tmp_path_factory.mktemp("qwen3")))


@pytest.fixture
def run_case(ranks):
    """Run a `rank_cases.Case` on N ranks, record its metrics as JUnit properties, and return them.

    Skips with `needs transformers>=X for ...` below the release that introduced the case's layout.
    """
    import rank_cases
    import tf_adapter

    def run(world_size: int, checkpoint: str, case) -> dict:
        reason = tf_adapter.missing_feature(case.layout)
        if reason is not None:
            pytest.skip(reason)
        metrics = rank_cases.summarize(ranks.run(world_size, rank_cases.run_case, checkpoint, case))
        ranks.record(**metrics)
        return metrics

    return run
