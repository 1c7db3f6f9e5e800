"""Every mechanic of every family, not only its defaults: each declared EP family's "switches on" tiny config (every
config switch models/config_switches.py keeps flipped: a bias, a norm, tied embeddings, a gate variant) loaded EP and
FSDP2+EP with every portable experts implementation the release offers, against the whole model: load, logits,
routing and gradients, float32, 2 ranks. The defaults configs run elsewhere (test_training.py: wide and deep
cases, per experts implementation); here they add the experts implementations the wide EP cases leave out (those run
grouped_mm alone).

Collection reads the registry's names only (as test_training.py: building a family's models belongs to its cases).
A family whose switches change nothing skips, naming why; so does an implementation its model class does not let be
set, beyond the first (which then runs the model's own forward: its metrics say "default").
"""

from __future__ import annotations

import pytest
from checks.kinds import Check, Layout
from loading import tf_adapter
from models import checkpoint_fixtures, families
from models.checkpoint_fixtures import Checkpoint

LAYOUTS = (Layout.EP, Layout.FSDP_EP)
WORLD_SIZE = 2
pytestmark = pytest.mark.world_size(WORLD_SIZE)  # packing gives each test its 2 ranks' cores or GPUs
CHECKS = (Check.LOAD, Check.LOGITS, Check.GRADIENTS)
MARKS = (pytest.mark.wide, pytest.mark.switches)
# Beyond every cell's share (each family's switches on, EP, the wide implementation): the nightly's (`-m exhaustive`
# selects them; pyproject's addopts leave them out elsewhere). Measured on 2 CPU cores: about 2.5 s a case, 69 cases
# in every cell against 564 in all.
EXHAUSTIVE = (*MARKS, pytest.mark.exhaustive)
IMPLEMENTATIONS = tf_adapter.experts_implementations()


def _in_every_cell(layout: Layout, implementation: str) -> bool:
    return layout == Layout.EP and implementation == families.WIDE_EXPERTS_IMPLEMENTATION


SWITCHED = [
    pytest.param(families.variant(name, families.SWITCHES_ON), layout, implementation,
                 marks=MARKS if _in_every_cell(layout, implementation) else EXHAUSTIVE,
                 id=f"{families.variant(name, families.SWITCHES_ON)}-{layout}-{implementation}")
    for name in families.wide_moe() + families.deep_moe()
    for layout in LAYOUTS
    for implementation in IMPLEMENTATIONS
]
OTHER_IMPLEMENTATIONS = [
    pytest.param(name, implementation, marks=EXHAUSTIVE, id=f"{name}-{Layout.EP}-{implementation}")
    for name in families.wide_moe()
    for implementation in IMPLEMENTATIONS
    if implementation != families.WIDE_EXPERTS_IMPLEMENTATION
]


def _settable(name: str) -> bool:
    """Whether the family's model class lets an experts implementation be set (families.wide_implementation)."""
    return families.wide_implementation(families.split_variant(name)[0]) is not None


@pytest.fixture
def switched_checkpoint(request, checkpoints) -> Checkpoint:
    """The switches-on checkpoint of a variant name (`<family>+switches`); skips a family none of whose switches
    changes its model, before building anything but the meta-device models of config_switches."""
    from models import config_switches

    base, _ = families.split_variant(request.param)
    found = config_switches.family_switches(base)
    if not found.kept:
        reasons = "; ".join(f"{verdict.switch.name}: {verdict.reason}" for verdict in found.dropped) or "none found"
        pytest.skip(f"no switch of {base} changes its model ({reasons})")
    return checkpoint_fixtures.built_checkpoint(request, checkpoints, request.param)


def _implementation_or_skip(name: str, implementation: str) -> str | None:
    if _settable(name):
        return implementation
    if implementation != IMPLEMENTATIONS[0]:
        pytest.skip(f"{families.split_variant(name)[0]} does not let an experts implementation be set: its own "
                    f"forward runs once, in the {IMPLEMENTATIONS[0]} case")
    return None


@pytest.mark.parametrize(("switched_checkpoint", "layout", "experts_implementation"), SWITCHED,
                         indirect=["switched_checkpoint"])
def test_switches_on_load_logits_and_gradients(run_case, switched_checkpoint, layout, experts_implementation):
    """With every kept switch flipped: each rank holds its share of the experts (and under FSDP2 its shard of the
    rest); logits match; routing identical in every MoE layer; every gradient within float32's bound."""
    run_case(WORLD_SIZE, switched_checkpoint, layout, CHECKS, dtype="float32",
             experts_implementation=_implementation_or_skip(switched_checkpoint.family, experts_implementation))


@pytest.mark.parametrize(("checkpoint", "experts_implementation"), OTHER_IMPLEMENTATIONS, indirect=["checkpoint"])
def test_defaults_other_implementations_ep(run_case, checkpoint, experts_implementation):
    """A wide family's defaults config under EP with the experts implementations its wide case does not run."""
    if not _settable(checkpoint.family):
        pytest.skip(f"{checkpoint.family} does not let an experts implementation be set: its wide case runs its own "
                    "forward")
    run_case(WORLD_SIZE, checkpoint, Layout.EP, CHECKS, dtype="float32", experts_implementation=experts_implementation)
