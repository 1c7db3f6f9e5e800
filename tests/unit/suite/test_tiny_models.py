"""The suite's own instruments, without ranks: the router's margins, the check messages, fake quantization."""

from __future__ import annotations

import pytest
import torch
from checks import fake_quant, tolerances, verdicts
from checks.rank_cases import DTYPES, summarize
from checks.routing import RoutingRecorder
from loading.tf_adapter import load_whole, transformers_version
from models import ep_coverage, families, tiny_models
from packaging.version import Version

from harness import contract

TOP1_SHARE = tolerances.TOP_WEIGHT_RANGE  # one chosen expert: no share to check (its weight alone is the gate)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "checkpoint",
    [pytest.param(name, marks=pytest.mark.deep) for name in families.deep_moe()]
    + [pytest.param(name, marks=pytest.mark.wide) for name in families.wide_moe()],
    indirect=True,
)
def test_router_decides_clearly_on_the_test_batch(checkpoint, record_property, dtype):
    """Token t goes to experts t % 8 and secondary_expert(t) in every MoE layer, by the margins the suite
    relies on, as each family's own router decides it (bias, sigmoid, groups and correction bias included)."""
    family = families.family(checkpoint.family)
    if family.ep_floor and transformers_version() < Version(family.ep_floor):
        # only EP cases rely on the routing code, and older releases' routers return other things
        pytest.skip(f"needs transformers>={family.ep_floor} for expert parallelism of {family.model_type}")
    model = load_whole(checkpoint.path, getattr(torch, dtype), torch.device("cpu"))
    recorder = RoutingRecorder(model, family)
    batch = tiny_models.make_batch()
    with torch.no_grad():
        tiny_models.run_model(model, batch)  # as the family takes token ids (ids, embeddings, patches)
    tokens = batch.flatten().tolist()
    chosen = (tiny_models.primary_expert, tiny_models.secondary_expert)[: family.top_k]
    expected = torch.tensor([sorted(expert(t) for expert in chosen) for t in tokens])
    assert len(recorder.layers) == len(family.moe_layers)
    for layer, routing in enumerate(recorder.layers):
        assert torch.equal(routing.experts.sort(dim=-1).values, expected), f"layer {layer} routes off the code"
        assert routing.margin > tolerances.ROUTING_MARGIN_MIN, f"layer {layer}: margin {routing.margin:.3f}"
        low, high = routing.top_weight_range if family.top_k > 1 else TOP1_SHARE
        assert tolerances.TOP_WEIGHT_RANGE[0] <= low <= high <= tolerances.TOP_WEIGHT_RANGE[1], (
            f"layer {layer}: top routing weight in [{low:.3f}, {high:.3f}]"
        )
    record_property(contract.ROUTING_MARGIN, min(routing.margin for routing in recorder.layers))
    record_property(contract.CASE_DTYPE, dtype)


def test_registry_ep_floors_match_the_installed_release():
    """A mechanics family's EP cases run exactly when the installed release declares an EP plan for it."""
    declared = set(ep_coverage.suite_properties()[contract.EP_FAMILIES_DECLARED].split(","))
    installed = transformers_version()
    for family in map(families.family, families.deep_moe()):
        has_floor = installed >= Version(family.ep_floor)
        assert has_floor == (family.model_type in declared), (
            f"{family.model_type}: ep_floor {family.ep_floor} but transformers {installed} "
            f"{'does not declare' if has_floor else 'declares'} an EP plan for it"
        )


def test_ep_coverage_counts_every_declared_family_but_the_listed_ones(monkeypatch):
    monkeypatch.setattr(families, "NOT_COVERED", {"b_moe": "cannot be built: a reason"})
    assert ep_coverage.covered_ep_families(["a_moe", "b_moe", "c_moe"]) == ["a_moe", "c_moe"]
    assert ep_coverage.not_covered_ep_families(["a_moe", "b_moe"]) == {"b_moe": "cannot be built: a reason"}


def test_routing_check_fails_when_no_layer_was_recorded():
    with pytest.raises(AssertionError, match="routing not recorded: the sharded model routed in 0 MoE layers"):
        verdicts.check_routing([], [])


@pytest.mark.parametrize("dtype", DTYPES)
def test_bounds_are_a_stated_multiple_of_the_runs_own_rounding(dtype):
    """The whole model's own error against float64, times the factor; never below the floor of a few ulps, so a
    gradient the whole model gets exactly (or luckily close) still leaves rounding its room."""
    factor, floor = tolerances.FACTOR[dtype], tolerances.FLOOR_ULPS * tolerances.ulp(dtype)
    assert 1 < factor <= 10  # a real defect in float32 (1e-2) stays >= 100x over a float32 bound
    assert tolerances.gradient_bound(dtype, 1e-3) == pytest.approx(factor * max(1e-3, floor))
    assert tolerances.gradient_bound(dtype, 0.0) == pytest.approx(factor * floor)
    assert tolerances.gradient_bound(dtype, float("nan")) == pytest.approx(factor * floor)
    assert tolerances.logits_bound(dtype, 0.0, 4.0) == pytest.approx(factor * floor * 4.0)
    assert tolerances.logits_bound(dtype, 1.0, 4.0) == pytest.approx(factor * max(1.0, floor * 4.0))


def test_a_dtype_without_a_rounding_model_is_named():
    with pytest.raises(ValueError, match="'float16'"):
        tolerances.gradient_bound("float16", 1e-3)


def test_secondary_expert_is_never_the_primary():
    for token in range(families.VOCAB_SIZE):
        assert tiny_models.secondary_expert(token) != tiny_models.primary_expert(token)


def _routing(experts: list[list[int]]) -> verdicts.LayerRouting:
    chosen = torch.tensor(experts)
    logits = torch.zeros(len(experts), families.NUM_EXPERTS).scatter(1, chosen, 3.0)
    return verdicts.LayerRouting(logits, chosen)


def test_routing_check_names_the_layer_and_counts_the_tokens():
    whole = [_routing([[0, 1], [2, 3], [4, 5], [6, 7]])] * 2
    # layer 1: the second token swaps an expert, the third only reorders its two (not a difference)
    sharded = [whole[0], _routing([[0, 1], [2, 4], [5, 4], [6, 7]])]
    with pytest.raises(AssertionError) as failure:
        verdicts.check_routing(sharded, whole)
    assert str(failure.value) == "routing differs: layer 1 sends 1 of 4 tokens to other experts than the whole model"
    verdicts.check_routing(whole, whole)


def test_routing_margin_is_the_gap_between_the_lowest_chosen_and_the_best_unchosen_logit():
    logits = torch.tensor([[5.0, 4.0, 1.5, 0.0], [3.0, 0.0, 2.5, 2.2]])
    assert verdicts.LayerRouting(logits, logits.topk(2).indices).margin == pytest.approx(0.3)
    # the router's own choice, not the logits' top k: a bias that picks expert 2 over 1 shows as a negative gap
    assert verdicts.LayerRouting(logits[:1], torch.tensor([[0, 2]])).margin == pytest.approx(-2.5)


def test_gradient_check_lists_the_worst_parameters_over_the_bound():
    whole = {"a": torch.ones(4), "b": torch.ones(4), "c": None}
    sharded = {"a": torch.ones(4), "b": torch.ones(4) * 1.5, "c": None}
    errors = verdicts.gradient_errors(sharded, whole)
    assert errors == {"a": 0.0, "b": pytest.approx(0.5), "c": 0.0}
    bounds = dict.fromkeys(errors, 3e-2)
    with pytest.raises(AssertionError, match=r"1 of 3 parameters exceed their bound .*: b 0.5 \(its bound 0.03\)$"):
        verdicts.check_gradients(errors, bounds)
    assert verdicts.gradient_errors({"a": None}, {"a": torch.ones(1)}) == {"a": float("inf")}
    with pytest.raises(AssertionError, match=r"b 0.5 \(its bound 0.03\) \(1.5 times the whole model's gradient\)$"):
        verdicts.check_gradients(errors, bounds, {"b": "1.5 times the whole model's gradient"})
    # each parameter is held to its own bound: b is within a looser one, a over a zero-width one is not
    with pytest.raises(AssertionError, match=r"1 of 2 parameters exceed their bound .*: a 0.1 \(its bound 0\)$"):
        verdicts.check_gradients({"a": 0.1, "b": 0.5}, {"a": 0.0, "b": 1.0})


def test_logits_check_measures_against_the_float64_reference_and_names_the_noise_it_allowed():
    reference = torch.linspace(-3, 3, 12, dtype=torch.float64).reshape(3, 4)
    close = reference.float() + 1e-6
    assert verdicts.check_close_to_reference("logits", close, reference, bound=2e-6, whole_difference=1e-6) == (
        pytest.approx(1e-6, rel=0.1)
    )
    far = close.clone()
    far[1, 2] += 1e-3
    with pytest.raises(AssertionError, match=r"^logits differ from the whole model's: 1 of 12 values farther than "
                       r"2e-06 from the float64 reference \(the whole model's own rounding: 1e-06\)"):
        verdicts.check_close_to_reference("logits", far, reference, bound=2e-6, whole_difference=1e-6)
    not_a_number = close.clone()
    not_a_number[1, 1] = float("nan")
    with pytest.raises(AssertionError, match="1 of 12 values"):  # NaN is never within a bound
        verdicts.check_close_to_reference("logits", not_a_number, reference, bound=10.0, whole_difference=0.0)


def test_gradient_notes_say_what_a_wrong_gradient_looks_like():
    expected = torch.randn(8, generator=torch.Generator().manual_seed(0))
    whole = {"halved": expected, "nan": expected, "missing": expected, "noisy": expected}
    sharded = {"halved": expected / 2, "nan": expected * float("nan"), "missing": None, "noisy": expected.flip(0)}
    errors = verdicts.gradient_errors(sharded, whole)
    assert verdicts.gradient_notes(sharded, whole, errors, dict.fromkeys(errors, 3e-2)) == {
        "halved": "0.5 times the whole model's gradient",
        "nan": "the sharded gradient holds NaN or inf",
        "missing": "no gradient in the sharded model",
    }


def test_a_gradient_off_by_a_factor_is_recognised_as_scaled():
    expected = torch.randn(64, generator=torch.Generator().manual_seed(0))
    assert verdicts.gradient_scale(0.5 * expected, expected) == pytest.approx(0.5)
    assert verdicts.gradient_scale(expected + torch.randn(64), expected) is None
    assert verdicts.gradient_scale(torch.ones(3), torch.zeros(3)) is None


def test_fp8_rowwise_values_lie_on_the_e4m3_grid_of_their_row_scale():
    weight = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    quantized = fake_quant.fp8_rowwise(weight)
    scale = weight.abs().amax(dim=-1, keepdim=True) / fake_quant.FP8_E4M3_MAX
    on_grid = (quantized / scale).to(torch.float8_e4m3fn).float() * scale
    assert torch.equal(quantized, on_grid)
    assert torch.allclose(quantized.abs().amax(dim=-1), weight.abs().amax(dim=-1), rtol=1e-6)  # amax kept
    assert (quantized - weight).abs().max() <= weight.abs().max() * 2**-4  # 3 mantissa bits
    assert not torch.equal(quantized, weight)


def test_nvfp4_blocks_hold_e2m1_multiples_of_an_e4m3_scale():
    weight = torch.randn(2, 4, 32, generator=torch.Generator().manual_seed(0))
    quantized = fake_quant.nvfp4(weight, fake_quant.global_amax(weight, "per_expert"))
    blocks = quantized.reshape(2, 4, 2, fake_quant.NVFP4_BLOCK)
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    for block in blocks.reshape(-1, fake_quant.NVFP4_BLOCK):
        steps = block.abs() / block.abs().max() * 6.0  # the largest value of a block maps to 6
        assert torch.isclose(steps.unsqueeze(-1), grid, atol=1e-5).any(dim=-1).all()
    assert (quantized - weight).norm() / weight.norm() < 0.15


def test_nvfp4_scale_over_a_local_shard_differs_from_per_expert():
    stack = torch.randn(4, 8, 32, generator=torch.Generator().manual_seed(0))
    stack[0] *= 10  # expert 0 dominates the shard's amax
    per_expert = fake_quant.quantize(stack, "nvfp4", "per_expert")
    local_shard = fake_quant.quantize(stack, "nvfp4", "local_shard")
    assert torch.equal(per_expert[0], local_shard[0])  # the expert that sets the amax agrees
    assert not torch.equal(per_expert[1:], local_shard[1:])
    # per expert, an expert's quantization does not depend on its neighbours
    assert torch.equal(fake_quant.quantize(stack[2:], "nvfp4", "per_expert"), per_expert[2:])


@pytest.mark.parametrize("recipe", fake_quant.RECIPES)
def test_straight_through_passes_the_gradient_unchanged(recipe):
    weight = torch.randn(4, 32, requires_grad=True)
    quantized = fake_quant.quantize(weight, recipe)
    output = fake_quant.straight_through(weight, quantized)
    assert torch.equal(output.detach(), quantized)
    upstream = torch.randn(4, 32)
    output.backward(upstream)
    assert torch.equal(weight.grad, upstream)


def test_fake_quantizer_swaps_the_weight_for_the_forward_only():
    layer = torch.nn.Linear(32, 4, bias=False)
    quantizer = fake_quant.FakeQuantizer("fp8")
    quantizer.attach("layer", layer, ("weight",))
    original = layer.weight
    inputs = torch.randn(3, 32)
    output = layer(inputs)
    expected = inputs @ fake_quant.quantize(original, "fp8").T
    assert torch.allclose(output, expected)
    assert layer.weight is original
    output.sum().backward()
    assert torch.allclose(original.grad, inputs.sum(0).expand(4, 32))
    assert torch.equal(quantizer.quantized[("layer", "weight")], fake_quant.quantize(original, "fp8"))


def test_metrics_of_all_ranks_are_summarized_by_their_worst():
    ranks = [
        {contract.CASE_DTYPE: "float32", contract.GRAD_ERROR: 1e-7, contract.GRAD_ERROR_PARAM: "a",
         contract.ROUTING_MARGIN: 3},
        {contract.CASE_DTYPE: "float32", contract.GRAD_ERROR: 2e-7, contract.GRAD_ERROR_PARAM: "b",
         contract.ROUTING_MARGIN: 4},
    ]
    assert summarize(ranks) == {
        contract.CASE_DTYPE: "float32",
        contract.GRAD_ERROR: 2e-7,
        contract.GRAD_ERROR_PARAM: "b",
        contract.ROUTING_MARGIN: 3,
    }


def test_an_error_is_summarized_with_its_own_bound_from_the_rank_where_it_is_worst_against_it():
    """Each rank measures its own bound: the larger error under a much larger bound is not the worst."""
    ranks = [
        {contract.GRAD_ERROR: 4e-6, contract.GRAD_BOUND: 1e-4, contract.GRAD_ERROR_PARAM: "a",
         contract.WHOLE_GRAD_ERROR: 1e-5, contract.LOGITS_DIFFERENCE: 1e-6, contract.LOGITS_ATOL: 1e-5,
         contract.WHOLE_LOGITS_DIFFERENCE: 2e-6},
        {contract.GRAD_ERROR: 1e-6, contract.GRAD_BOUND: 2e-6, contract.GRAD_ERROR_PARAM: "b",
         contract.WHOLE_GRAD_ERROR: 2e-7, contract.LOGITS_DIFFERENCE: float("nan"), contract.LOGITS_ATOL: 1e-5,
         contract.WHOLE_LOGITS_DIFFERENCE: 3e-6},
    ]
    summary = summarize(ranks)
    assert (summary[contract.GRAD_ERROR], summary[contract.GRAD_BOUND]) == (1e-6, 2e-6)
    assert (summary[contract.GRAD_ERROR_PARAM], summary[contract.WHOLE_GRAD_ERROR]) == ("b", 2e-7)
    assert summary[contract.WHOLE_LOGITS_DIFFERENCE] == 3e-6  # beside the NaN, which counts as the worst


def test_the_float64_reference_keeps_float64_where_a_model_casts_to_float32():
    """A router that computes `linear(hidden.float(), weight)` in float32 on purpose, with a float64 weight."""
    from loading.float64_mode import stay_float64

    weight = torch.randn(4, 8, dtype=torch.float64)
    hidden = torch.randn(3, 8, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.nn.functional.linear(hidden.float(), weight)
    with stay_float64():
        logits = torch.nn.functional.linear(hidden.float(), weight)
        probabilities = torch.softmax(logits, dim=-1, dtype=torch.float32)
        moved, typed = logits.to(torch.float32), logits.type(torch.float32)
        created = torch.ones(2, dtype=torch.float32)
        # transformers 5.17's rotary embeddings: a float64 buffer times integer positions cast to float32
        angles = torch.ones(1, 4, 1, dtype=torch.float64) @ torch.arange(3)[None, None, :].float()
    assert {t.dtype for t in (logits, probabilities, moved, typed, created, angles)} == {torch.float64}
    assert torch.ones(2).float().dtype == torch.float32  # outside it, casts are casts
    assert torch.equal(logits, hidden @ weight.T)
