"""pytest plugin: `--random-order SEED` runs the collected tests in an order drawn from SEED, so that a verdict
that depends on the tests before it shows (the rank pool must not let one). The same seed gives the same
order; the header names it so a red can be run again in its order. Loaded by harness.ranks.plugin.
Needs the standard library and pytest.
"""

from __future__ import annotations

import random

import pytest

RANDOM_ORDER_HELP = "run the tests in a random order drawn from SEED (an integer); the same seed, the same order"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("harness").addoption("--random-order", type=int, metavar="SEED", default=None,
                                         dest="random_order", help=RANDOM_ORDER_HELP)


@pytest.hookimpl(trylast=True)  # after every plugin that orders or deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seed = config.getoption("random_order")
    if seed is not None:
        random.Random(seed).shuffle(items)


def pytest_report_header(config: pytest.Config) -> str | None:
    seed = config.getoption("random_order")
    return None if seed is None else f"random order: seed {seed} (--random-order {seed} runs this order again)"
