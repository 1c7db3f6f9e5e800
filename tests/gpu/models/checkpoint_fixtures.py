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
    from models import families, tiny_models

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
    return built_checkpoint(request, checkpoints, request.param)


def built_checkpoint(request, checkpoints, model_type: str) -> Checkpoint:
    """The family's checkpoint; not run below its EP floor; *not built* (contract.NOT_BUILT: the reason as a
    property, a skip saying so) where the suite's own reading of the release fails (families.NotBuilt)."""
    from loading import tf_adapter

    from harness.contract import FAMILY, NOT_BUILT, NOT_BUILT_CHARS, NOT_BUILT_PREFIX
    from models import families

    try:
        below = tf_adapter.below_ep_floor(families.family(model_type))
        if below:
            pytest.skip(below)
        return checkpoints(model_type)
    except families.NotBuilt as error:
        reason = str(error)[:NOT_BUILT_CHARS]
        # the family too, so coverage says which family was not built (a skip never counts it as covered)
        request.node.user_properties += [(FAMILY, families.split_variant(model_type)[0]), (NOT_BUILT, reason)]
        pytest.skip(f"{NOT_BUILT_PREFIX}{reason}")
