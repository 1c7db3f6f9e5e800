"""models/config_switches.py without ranks: its introspection finds a family's known switches, ignores a flag
that changes nothing, and its switches-on config is the family's tiny config with those switches flipped."""

from __future__ import annotations

import pytest
from models import config_switches, families
from models.config_switches import BOOL, CHOICE, INERT, candidates, family_switches


def _verdict(model_type: str, name: str) -> config_switches.Verdict:
    return next(verdict for verdict in family_switches(model_type).verdicts if verdict.switch.name == name)


def test_finds_a_qk_norm_switch_and_keeps_it():
    """glm4_moe's use_qk_norm (default False) adds q/k norms to every attention."""
    verdict = _verdict("glm4_moe", "use_qk_norm")
    assert verdict.switch.kind == BOOL and verdict.switch.default is False
    assert verdict.kept and verdict.on is True
    assert "q_norm" in verdict.reason
    assert family_switches("glm4_moe").kwargs["use_qk_norm"] is True


def test_keeps_a_switch_on_by_default_flipped_off():
    """lfm2_moe's use_expert_bias defaults on: flipped, its router's expert-bias buffer goes."""
    verdict = _verdict("lfm2_moe", "use_expert_bias")
    assert verdict.kept and verdict.on is False
    assert verdict.reason.startswith("removes buffer") and "expert_bias" in verdict.reason


def test_ignores_a_flag_that_changes_nothing():
    """norm_topk_prob and use_cache change the forward or generation, never the model's modules or plans."""
    for name in ("norm_topk_prob", "use_cache", "output_router_logits"):
        verdict = _verdict("qwen3_moe", name)
        assert not verdict.kept and verdict.reason == INERT, name
    assert "norm_topk_prob" not in {verdict.switch.name for verdict in family_switches("qwen3_moe").kept}


def test_a_switch_the_config_refuses_is_dropped_with_its_reason():
    verdict = _verdict("laguna", "moe_apply_router_weight_on_input")
    assert not verdict.kept
    assert verdict.reason.startswith("the config refuses it (NotImplementedError: ")


def test_reads_choices_from_literal_annotations_only():
    found = {switch.name: switch for switch in candidates(families.config_class("gemma4_text"))}
    choice = found["use_bidirectional_attention"]
    assert choice.kind == CHOICE and choice.default is None and set(choice.values) == {"all", "vision"}
    # PreTrainedConfig's own arguments are the same for every family: not a family's switches
    assert "return_dict" not in found and "output_hidden_states" not in found


def test_the_switches_on_config_is_the_tiny_config_with_the_kept_switches_flipped():
    result = family_switches("qwen3_moe")
    tiny = families.tiny_config_kwargs("qwen3_moe")
    flipped = {verdict.switch.name: verdict.on for verdict in result.kept}
    assert flipped == {"tie_word_embeddings": True, "attention_bias": True}
    assert dict(result.kwargs) == tiny | flipped


def test_the_variant_family_reads_its_layout_from_the_switched_model():
    name = families.variant("lfm2_moe", families.SWITCHES_ON)
    entry = families.family(name)
    assert entry.model_type == "lfm2_moe" and not entry.deep
    assert entry.config["use_expert_bias"] is False
    assert entry.moe_layers == families.family("lfm2_moe").moe_layers
    assert families.split_variant(name) == ("lfm2_moe", families.SWITCHES_ON)
    with pytest.raises(ValueError, match="unknown variant"):
        families.variant("lfm2_moe", "everything")


def test_the_command_prints_kept_and_dropped(capsys):
    assert config_switches.main(["laguna"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("laguna: 6 found, 3 kept")
    assert "kept     gating=False (default True)" in out
    assert "dropped  moe_apply_router_weight_on_input (default False): the config refuses it" in out
    assert config_switches.main(["no_such_family"]) == 2
