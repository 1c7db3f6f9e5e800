"""models/ep_plan_history.json (each model type's first release declaring an EP plan, read from the releases' sources)
against the installed transformers, the reader on small sources, the choice of releases, and the EP floors the
suite takes from the table."""

from __future__ import annotations

import json
import re

import pytest
from loading import tf_adapter
from models import ep_floors, ep_plan_history, families
from packaging.version import Version

# ---------------------------------------------------------------- the committed table


def test_the_table_is_well_formed():
    table = json.loads(ep_plan_history.HISTORY_PATH.read_text())
    assert set(table) == {"generated_from", "first_release"}
    releases = table["generated_from"]
    assert all(re.fullmatch(r"\d+\.\d+\.\d+", release) for release in releases), releases
    assert [Version(release) for release in releases] == sorted(set(map(Version, releases))), "oldest first, once"
    assert table["first_release"], "no model type"
    for model_type, release in table["first_release"].items():
        assert re.fullmatch(r"[a-z0-9_]+", model_type), model_type
        assert release in releases, f"{model_type}: {release} was not read"
        assert release != releases[0], f"{model_type}: the oldest release read is the one kept without EP plans"


def test_every_family_the_installed_release_declares_has_a_first_release_no_later_than_it():
    installed = tf_adapter.transformers_version()
    missing, later = [], []
    for model_type in families.declared_ep_families():
        first = ep_floors.first_ep_release(model_type)
        if first is None:
            missing.append(model_type)
        elif Version(first) > installed:
            later.append(f"{model_type} ({first})")
    assert not missing, f"declared by transformers {installed}, absent from models/ep_plan_history.json: {missing}"
    assert not later, f"declared by transformers {installed}, first release after it: {later}"


def test_the_table_read_the_installed_release_as_the_installed_release_declares_it():
    """Where the table read the installed release, its reading of the source equals transformers' own classes."""
    installed = str(tf_adapter.transformers_version())
    if installed not in ep_floors.releases_read():
        pytest.skip(f"models/ep_plan_history.json did not read transformers {installed}")
    first = ep_floors.history()["first_release"]
    declared_by_then = {name for name, release in first.items() if Version(release) <= Version(installed)}
    assert set(families.declared_ep_families()) <= declared_by_then


def test_a_model_type_no_release_declares_has_no_first_release():
    assert ep_floors.first_ep_release("no_such_model_type") is None


# ---------------------------------------------------------------- the reader, on small sources

BASE = "transformers.models.base_moe.configuration_base_moe"
OTHER = "transformers.models.other_moe.configuration_other_moe"


def _declared(sources: dict[str, str]) -> set[str]:
    return ep_plan_history.Release(sources).ep_families()


def test_a_class_level_plan_declares_its_model_type():
    source = 'class A(PreTrainedConfig):\n    model_type = "a_moe"\n    base_model_ep_plan = {"k": "v"}\n'
    assert _declared({BASE: source}) == {"a_moe"}


@pytest.mark.parametrize(
    "plan",
    ["None", "{}", "dict()"],
)
def test_an_empty_plan_declares_nothing(plan):
    source = f'class A(PreTrainedConfig):\n    model_type = "a_moe"\n    base_model_ep_plan = {plan}\n'
    assert _declared({BASE: source}) == set()


def test_an_annotated_plan_and_a_module_constant_count():
    source = (
        'PLAN = {"layers.*.experts": "x"}\n'
        'class A(PreTrainedConfig):\n    model_type: str = "a_moe"\n    base_model_ep_plan: dict = PLAN\n'
    )
    assert _declared({BASE: source}) == {"a_moe"}


def test_a_plan_is_inherited_in_the_file_and_switched_off_by_none():
    source = (
        'class A(PreTrainedConfig):\n    model_type = "a_moe"\n    base_model_ep_plan = {"k": "v"}\n'
        'class B(A):\n    model_type = "b_moe"\n'
        'class C(A):\n    model_type = "c_dense"\n    base_model_ep_plan = None\n'
    )
    assert _declared({BASE: source}) == {"a_moe", "b_moe"}


def test_a_plan_is_inherited_from_a_config_class_imported_from_another_model():
    base = 'class A(PreTrainedConfig):\n    model_type = "a_moe"\n    base_model_ep_plan = {"k": "v"}\n'
    other = 'from ..base_moe.configuration_base_moe import A\nclass D(A):\n    model_type = "d_moe"\n'
    assert _declared({BASE: base, OTHER: other}) == {"a_moe", "d_moe"}


# ---------------------------------------------------------------- which releases are read


def _versions(*minors: tuple[str, int]) -> list[str]:
    return [f"{minor}.{patch}" for minor, count in minors for patch in range(count)]


def test_the_first_minor_is_bisected_and_each_minor_read_at_both_ends():
    versions = _versions(("1.0", 2), ("1.1", 1), ("1.2", 3), ("1.3", 2), ("1.4", 4))
    declared = {"1.2.0": {"a"}, "1.2.1": {"a"}, "1.2.2": {"a"}, "1.3.0": {"a"}, "1.3.1": {"a", "b"}}
    declared |= {f"1.4.{patch}": {"a", "b"} for patch in range(4)}
    read = []

    def reader(version):
        read.append(version)
        return declared.get(version, set())

    table = ep_plan_history.history(versions, reader)
    assert table["generated_from"] == ["1.1.0", "1.2.0", "1.2.2", "1.3.0", "1.3.1", "1.4.0", "1.4.3"]
    assert table["first_release"] == {"a": "1.2.0", "b": "1.3.1"}
    below_the_first_minor = {version for version in read if version.startswith(("1.0.", "1.1."))}
    assert below_the_first_minor <= {"1.0.1", "1.1.0"}, read  # bisected at each minor's last patch
    assert len(set(read)) == len(read), "a release read twice"


def test_a_minor_whose_ends_differ_is_read_at_every_patch():
    versions = _versions(("2.0", 1), ("2.1", 4))
    declared = {"2.0.0": {"a"}, "2.1.0": {"a"}, "2.1.1": {"a"}, "2.1.2": {"a", "b"}, "2.1.3": {"a", "b"}}
    table = ep_plan_history.history(versions, lambda version: declared[version])
    assert table["generated_from"] == ["2.0.0", "2.1.0", "2.1.1", "2.1.2", "2.1.3"]
    assert table["first_release"] == {"a": "2.0.0", "b": "2.1.2"}


# ---------------------------------------------------------------- the EP floors taken from it


def test_an_early_family_runs_ep_from_its_first_release_and_nothing_else_moves(monkeypatch):
    """The mechanism, on a family declared below the layout's floor (the list itself is empty for now: see
    families.EARLY_EP)."""
    layout_floor = tf_adapter.LAYOUTS["ep"].floor
    try:
        with monkeypatch.context() as patch:
            patch.setattr(families, "EARLY_EP", ("gemma4_text",))
            families.family.cache_clear()
            early = [families.family(name) for name in families.EARLY_EP]
            for family in early:
                assert family.ep_floor == ep_floors.first_ep_release(family.model_type) == "5.6.0"
                assert Version(family.ep_floor) < Version(layout_floor)
            patch.setattr(tf_adapter, "transformers_version", lambda: Version("5.6.0"))
            for family in early:
                assert tf_adapter.missing_feature("ep", family) is None, family.model_type
                # the other layouts keep their own floors
                assert tf_adapter.missing_feature("fsdp_ep", family).startswith("needs transformers>=5.20.0")
            for name in families.deep_moe():
                reason = tf_adapter.missing_feature("ep", families.family(name))
                assert reason.startswith(f"needs transformers>={layout_floor}")
            assert tf_adapter.missing_feature("ep").startswith(f"needs transformers>={layout_floor}")
    finally:
        families.family.cache_clear()


def test_every_early_family_is_declared_at_its_first_release_below_the_layout_floor():
    for name in families.EARLY_EP:
        first = ep_floors.first_ep_release(name)
        assert first is not None, name
        assert Version(first) < Version(tf_adapter.LAYOUTS["ep"].floor), f"{name}: {first}"


def test_no_mechanics_floor_lies_below_the_ep_layout_floor_or_its_first_release():
    """A hand floor below the layout's would bypass it (tf_adapter.layout_floor) without an EARLY_EP entry."""
    layout_floor = Version(tf_adapter.LAYOUTS["ep"].floor)
    for name in families.deep_moe():
        floor = Version(families.MECHANICS[name][1])
        assert floor >= layout_floor, name
        assert floor >= Version(ep_floors.first_ep_release(name)), name
