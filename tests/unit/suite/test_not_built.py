"""*Not built*: where the suite's own reading of a release fails (its tiny config refused by the config class, an
experts layout or router the registry cannot find), a family's cases say so with the reason, as a property and a
skip: never a red of the code under test, never a pass. Where transformers raises on a config its class accepted,
that stays a red."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree

import pytest
from models import families

from harness.contract import FAMILY, NOT_BUILT, NOT_BUILT_PREFIX

pytest_plugins = ["pytester"]


class RefusingConfig:
    """A config class whose validation refuses the suite's tiny values."""

    def __init__(self, **kwargs) -> None:
        raise ValueError("`num_experts` (8) must be divisible by `expert_groups` (3)\nmore lines")


def test_a_tiny_config_the_class_refuses_is_not_built_with_the_classes_words(monkeypatch):
    monkeypatch.setattr(families, "config_class", lambda model_type: RefusingConfig)
    with pytest.raises(families.NotBuilt) as raised:
        families.accepted_tiny_config("alpha_moe", {"num_experts": 8})
    assert str(raised.value) == ("alpha_moe: RefusingConfig refuses the suite's tiny config: ValueError: "
                                 "`num_experts` (8) must be divisible by `expert_groups` (3) more lines")


def test_a_registry_lookup_that_fails_is_not_built_and_still_a_lookup_error():
    assert issubclass(families.NotBuilt, LookupError)  # callers that read a family defensively keep working


def test_a_family_the_registry_cannot_read_is_not_built_and_a_built_one_is_none():
    assert families.not_built_reason("qwen3_moe") is None


NOT_BUILT_CONFTEST = """
import pytest
from models import families
from models.checkpoint_fixtures import built_checkpoint


@pytest.fixture
def checkpoints():
    def get(model_type):
        if model_type == "crashing_moe":
            raise RuntimeError("transformers raised on a config its class accepted")
        return model_type
    return get


@pytest.fixture
def checkpoint(request, checkpoints, monkeypatch):
    readable = families.family("qwen3_moe")

    def family(model_type):
        if model_type == "unreadable_moe":
            raise families.NotBuilt("unreadable_moe: expected one router beside mlp.experts, found none")
        return readable
    monkeypatch.setattr(families, "family", family)
    return built_checkpoint(request, checkpoints, request.param)
"""


def test_a_case_whose_family_is_not_built_is_a_skip_with_the_property_and_a_transformers_error_stays_red(pytester):
    pytester.makeconftest(NOT_BUILT_CONFTEST)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.parametrize("checkpoint", ["unreadable_moe", "crashing_moe", "qwen3_moe"], indirect=True)
        def test_case(checkpoint):
            pass
        """
    )
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest("-p", "no:cacheprovider", f"--junitxml={junit}", "-o", "junit_family=xunit1", "-rs")
    result.assert_outcomes(passed=1, skipped=1, errors=1)
    result.stdout.fnmatch_lines([f"SKIPPED * {NOT_BUILT_PREFIX}unreadable_moe: expected one router beside *"])
    cases = {case.get("name"): case for case in ElementTree.parse(junit).getroot().iter("testcase")}
    properties = {prop.get("name"): prop.get("value") for prop in cases["test_case[unreadable_moe]"].iter("property")}
    assert properties[NOT_BUILT] == "unreadable_moe: expected one router beside mlp.experts, found none"
    assert properties[FAMILY] == "unreadable_moe"  # coverage names the family it could not build
    assert not any(prop.get("name") == NOT_BUILT for prop in cases["test_case[crashing_moe]"].iter("property"))
