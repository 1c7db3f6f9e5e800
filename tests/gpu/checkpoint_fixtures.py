"""Each family's tiny checkpoint as a fixture. The suite's conftest takes these fixtures from here, and so does the
suite's self-test conftest (tests/unit/suite/conftest.py), whose router tests build the same checkpoints."""

from __future__ import annotations

from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Checkpoint:
    family: str  # a key of families.FAMILIES
    path: str


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """Each family's tiny checkpoint, built the first time a test asks for it."""
    import families
    import tiny_models

    built: dict[str, Checkpoint] = {}

    def get(model_type: str) -> Checkpoint:
        if model_type not in built:
            path = tiny_models.build_checkpoint(families.family(model_type), tmp_path_factory.mktemp(model_type))
            built[model_type] = Checkpoint(model_type, str(path))
        return built[model_type]

    return get


@pytest.fixture
def checkpoint(request, checkpoints) -> Checkpoint:
    """Parametrize indirectly with a family's model_type: `parametrize("checkpoint", [...], indirect=True)`."""
    import families
    import tf_adapter

    below = tf_adapter.below_ep_floor(families.family(request.param))
    if below:
        pytest.skip(below)
    return checkpoints(request.param)
