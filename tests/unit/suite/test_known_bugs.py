"""The known-bugs table and its marking: a covered case is xfailed only for the failure its entry names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from checks.rank_cases import Case
from models import families
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from rank_failures import REDUCE_VALUE, rank_raised
from upstream import known_bugs

from harness.ranks.failures import Died, failure_error
from harness.ranks.raised import NO_MESSAGE, RaisingFrame
from harness.results import read_junit_tests, triage

pytest_plugins = ["pytester"]
SUITE_CONFTEST = str(Path(known_bugs.__file__).resolve().parents[1] / "conftest.py")


def a_bug(**fields) -> known_bugs.KnownBug:
    return known_bugs.KnownBug(
        **{
            "key": "a-bug",
            "transformers": ">=5.13,<5.20",
            "torch": ">=2.11,<2.14",
            "torch_verified": "2.11.0 and 2.13.0",
            "layouts": ("ep",),
            "checks": ("gradients",),
            "raises": "RuntimeError",
            "match": r"Class values must be smaller than num_classes",
            "cause": "a cause",
            "reproduced": "a place",
            "bisected": (),
            **fields,
        }
    )


ELSEWHERE = RaisingFrame("checks/verdicts.py", "check_gradients", 88)  # a bare assert of the suite's own
BOTH = {"transformers": "5.19.0", "torch": "2.13.0"}


def test_known_bug_covers_its_cases_only_within_its_transformers_and_torch_releases():
    bug = a_bug(implementations=("batched_mm",))
    case = Case(families.deep_moe()[0], "ep", ("gradients",), experts_implementation="batched_mm")
    assert bug.covers(case, BOTH, "cpu")
    assert bug.covers(case, {"transformers": "5.19.0", "torch": "2.11.0"}, "cpu")
    assert not bug.covers(case, {**BOTH, "transformers": "5.20.0"}, "cpu")
    assert not bug.covers(case, {**BOTH, "torch": "2.14.0"}, "cpu")  # from its fix on, the case runs uncovered
    assert not bug.covers(case, {**BOTH, "torch": "2.10.0"}, "cpu")
    assert not bug.covers(case, {"transformers": "5.19.0"}, "cpu")  # torch unknown: not covered
    assert not bug.covers(
        Case(families.deep_moe()[0], "ep", ("load", "logits"), experts_implementation="batched_mm"), BOTH, "cpu"
    )
    eager = Case(families.deep_moe()[0], "ep", ("gradients",), experts_implementation="eager")
    assert not bug.covers(eager, BOTH, "cpu")
    assert bug.reason.startswith("known upstream bug: transformers >=5.13,<5.20, torch >=2.11,<2.14 (not yet seen by "
                              "`harness known-bugs verify`): a cause")


def test_known_bug_of_one_device_type_covers_cases_on_that_device_only():
    case = Case(families.deep_moe()[0], "ep", ("gradients",), experts_implementation="batched_mm")
    assert a_bug().covers(case, BOTH, "cpu") and a_bug().covers(case, BOTH, "cuda")  # None: every device
    on_cuda = a_bug(devices=("cuda",))
    assert on_cuda.covers(case, BOTH, "cuda")
    assert not on_cuda.covers(case, BOTH, "cpu")  # the same case on a CPU host runs and shows its own verdict


def test_an_entry_names_the_releases_of_both_packages():
    for package in ("transformers", "torch"):
        fields = {name: value for name, value in vars(a_bug()).items() if name != package}
        with pytest.raises(TypeError, match=f"'{package}'"):
            known_bugs.KnownBug(**fields)
        with pytest.raises(ValueError,
                           match=rf"known bug a-bug \[every MoE family; ep; RuntimeError; .*{package}=''"):
            a_bug(**{package: ""})  # an empty set would hold for every release
        with pytest.raises(ValueError, match=rf"{package}='5.13' is not a PEP 440 range"):
            a_bug(**{package: "5.13"})


@pytest.mark.parametrize("package", ["transformers", "torch"])
@pytest.mark.parametrize("capped", ["<=5.24.0", ">=5.23,<=5.24.0", "==5.24.0", "~=5.24", "===5.24.0"])
def test_a_live_range_is_never_capped_at_the_last_release_checked(package, capped):
    with pytest.raises(ValueError, match=rf"{package} .* caps the range at a release: a range stays open"):
        a_bug(**{package: capped})
    assert a_bug(**{package: ">=5.23"}) and a_bug(**{package: ">=5.23,<5.26"})  # open, or closed by its fix


def test_a_torch_bug_names_no_transformers_range_and_holds_for_every_transformers():
    bug = a_bug(transformers=None)
    case = Case(families.deep_moe()[0], "ep", ("gradients",), experts_implementation="batched_mm")
    for transformers in ("4.57.0", "5.24.0", "5.25.0", "6.0.0"):
        assert bug.covers(case, {"transformers": transformers, "torch": "2.13.0"}, "cpu")
    assert not bug.covers(case, {"transformers": "5.25.0", "torch": "2.14.0"}, "cpu")
    assert bug.reason.startswith("known upstream bug: torch >=2.11,<2.14 (")
    with pytest.raises(ValueError, match="torch=None is not a PEP 440 range"):
        a_bug(torch=None)


def test_every_entry_has_its_newest_release_seen_and_it_lies_in_its_range():
    from packaging.specifiers import SpecifierSet

    verified = known_bugs.verified_releases()
    keys = {bug.key for bug in known_bugs.KNOWN_BUGS}
    assert set(verified) == keys, (sorted(keys - set(verified)), sorted(set(verified) - keys))
    for bug in known_bugs.KNOWN_BUGS:  # a new entry starts empty: `harness known-bugs verify` fills it from results
        assert set(verified[bug.key]) <= {"transformers", "torch"}, bug.key
        for package, release in verified[bug.key].items():
            text = getattr(bug, package)
            assert text is None or release in SpecifierSet(text), (bug.key, package, text)
        if verified[bug.key]:
            assert bug.seen.startswith(f"last seen on transformers {verified[bug.key]['transformers']}, torch ")


@pytest.mark.parametrize("key", ["", "Upper", "two words", "a,b", "-lead", "trail-", "x" * 65, "k\u00e9y"])
def test_an_entry_key_is_of_the_shape_triage_reads(key):
    with pytest.raises(ValueError, match="a key is lower-case words joined by"):
        a_bug(key=key)


def test_every_entry_has_its_own_key():
    keys = [bug.key for bug in known_bugs.KNOWN_BUGS]
    assert len(set(keys)) == len(keys), sorted(key for key in keys if keys.count(key) > 1)


def test_an_entry_for_an_exception_without_a_message_must_name_where_it_is_raised():
    with pytest.raises(ValueError, match=r"known bug a-bug \[alpha_moe; ep; AssertionError; transformers "
                       r">=5.23, torch >=2.13.0\]: match .* accepts an exception without a message"):
        a_bug(transformers=">=5.23", torch=">=2.13.0", families=("alpha_moe",), raises="AssertionError",
              match=r"^\(no message\)$")
    with pytest.raises(ValueError, match="accepts an exception without a message"):
        a_bug(match=r"")  # a pattern that takes any message takes none too
    assert a_bug(raises="AssertionError", match=r"^\(no message\)$", raised_at=REDUCE_VALUE.location)


def test_a_rank_failure_is_matched_on_the_ranks_own_exception_type_and_message():
    bug = a_bug()
    assert bug.explains(rank_raised("RuntimeError", "Class values must be smaller than num_classes."))
    assert not bug.explains(rank_raised("AssertionError", "Class values must be smaller than num_classes."))
    assert not bug.explains(rank_raised("RuntimeError", "Could not resolve the process group"))
    died = failure_error(2, {}, {0: Died(exit_code=-9, last_stack="")}, {})
    assert known_bugs.failure_of(died) == known_bugs.Failure(None, "exited by signal SIGKILL without a result", None)
    assert not bug.explains(died)
    assert bug.explains(RuntimeError("Class values must be smaller than num_classes.\nmore"))  # not through ranks


def test_a_bare_assert_is_the_known_bug_only_where_the_entry_says_it_is_raised():
    bug = a_bug(raises="AssertionError", match=r"^\(no message\)$", raised_at=REDUCE_VALUE.location)
    assert bug.explains(rank_raised("AssertionError", NO_MESSAGE, REDUCE_VALUE))
    # the line is not part of it: it moves between patch releases
    assert bug.explains(rank_raised("AssertionError", NO_MESSAGE, RaisingFrame(REDUCE_VALUE.file, "_reduce_value", 9)))
    assert not bug.explains(rank_raised("AssertionError", NO_MESSAGE, ELSEWHERE))  # the suite's own bare assert
    assert not bug.explains(rank_raised("AssertionError", NO_MESSAGE, RaisingFrame(REDUCE_VALUE.file, "_split", 1)))
    assert not bug.explains(rank_raised("AssertionError", NO_MESSAGE))  # where unknown: not this bug
    different = bug.verdict(rank_raised("AssertionError", NO_MESSAGE, ELSEWHERE))
    assert isinstance(different, known_bugs.DifferentFailure)
    assert str(different) == (
        "failed differently from its known bug (transformers >=5.13,<5.20, torch >=2.11,<2.14: AssertionError "
        r"matching '^\\(no message\\)$' raised in torch/distributed/tensor/placement_types.py:_reduce_value): "
        "AssertionError: (no message) (raised at checks/verdicts.py:88 in check_gradients)"
    )


def test_a_case_covered_by_several_entries_is_xfailed_for_any_of_their_failures_and_red_for_another():
    """A training case runs the one-step checks, then trains: an entry for each can cover it."""
    one_step = a_bug(checks=("gradients",), raises="AssertionError", match="gradients differ")
    training = a_bug(checks=("train",), raises="AssertionError", match=r"^step \d+: ")
    both = (one_step, training)
    assert isinstance(known_bugs.verdict(both, rank_raised("AssertionError", "gradients differ from the whole "
                                                           "model's: 1 of 9")), known_bugs.KnownBugFailure)
    assert isinstance(known_bugs.verdict(both, rank_raised("AssertionError", "step 2: loss 1.0 differs")),
                      known_bugs.KnownBugFailure)
    different = known_bugs.verdict(both, rank_raised("RuntimeError", "Class values must be smaller"))
    assert isinstance(different, known_bugs.DifferentFailure)
    assert "nor the other entries covering it" in str(different) and r"'^step \\d+: '" in str(different)


def test_a_bare_assert_raised_here_travels_with_where_it_was_raised():
    def bare_assert():
        raise AssertionError  # as torch raises it (an `assert` here would be rewritten by pytest to say more)

    try:
        bare_assert()
    except AssertionError as error:
        failure = known_bugs.failure_of(error)
    assert (failure.error_type, failure.message) == ("AssertionError", NO_MESSAGE)
    assert failure.raised_at.location == "test_known_bugs.py:bare_assert"


@pytest.mark.parametrize(
    "bug", known_bugs.KNOWN_BUGS, ids=[f"{index}-{bug.layouts[0]}" for index, bug in enumerate(known_bugs.KNOWN_BUGS)]
)
def test_every_entry_is_open_while_live_named_and_bisected(bug):
    """A live entry's range is open above (the next release runs the case covered and shows whether the bug is still
    there) and says so; a closed one ends at its fix. Every entry names the failure it expects and records the
    bisects that measured its range."""
    live = bug.transformers is None or Version("999.0") in SpecifierSet(bug.transformers)
    upper = [line for line in bug.bisected if line.startswith("upper end: ")]
    assert live == any(line.startswith("upper end: none, the bug is live") for line in upper), (bug.key, upper)
    # a torch range open below says so where it says which torch releases were run
    assert (Version("0.1") in SpecifierSet(bug.torch)) == ("open below" in bug.torch_verified), bug.torch_verified
    assert bug.torch_verified and bug.raises and re.compile(bug.match).pattern
    # both ends of the transformers range: a bisect's command and answer, or why an end has none (a feature's
    # floor, the newest release, a range measured on another torch)
    ends = {line.split(": ", 1)[0] for line in bug.bisected if line.startswith(("lower end: ", "upper end: "))}
    assert any(line.startswith("harness bisect ") for line in bug.bisected) or ends == {"lower end", "upper end"}
    assert len(bug.bisected) >= 2
    assert all(line.startswith(("harness bisect ", "lower end: ", "upper end: ")) for line in bug.bisected)


# What the covered cases raised on the failing rank in the bisects' probes (results/.../junit.xml, first line),
# by the index of the entry that covers them: each entry names exactly its own failures, and the halving entry
# does not take the router's wrong gradient.
CLASS_VALUES = ("RuntimeError", "Class values must be smaller than num_classes.")
OPF_ROUTERS = (
    "gradients differ from the whole model's: 48 of 53 parameters exceed their bound (rounding measured in this run): "
    "layers.0.mlp.router.weight 0.822 (its bound 4.91e-06); layers.2.mlp.router.weight 0.655 (its bound 4.08e-06); "
    "layers.2.mlp.router.bias 0.605 (its bound 3.84e-06); layers.0.post_attention_layernorm.weight 0.604 (its bound "
    "4.47e-06); layers.0.mlp.router.bias 0.762 (its bound 5.69e-06); and 43 more"
)
OPF_NAN_BIAS = (
    "gradients differ from the whole model's: 49 of 53 parameters exceed their bound (rounding measured in this run): "
    "layers.2.mlp.experts.gate_up_proj_bias nan (its bound 4.16e-06) (the sharded gradient holds NaN or inf); "
    "layers.0.mlp.experts.gate_up_proj_bias 805 (its bound 4.57e-06); layers.0.mlp.router.weight 0.822 (its bound "
    "4.91e-06); layers.2.mlp.router.weight 0.655 (its bound 4.08e-06); layers.2.mlp.router.bias 0.605 (its bound "
    "3.84e-06); and 44 more"
)
# Entries whose messages overlap but whose cases cannot (either way round): (one, other) -> why no case is covered by
# both
DISJOINT_CASES = {
    (15, 34): "entry 15 holds for openai_privacy_filter and zaya from 5.23, entry 34 for dots3_note_vision_encoder, "
    "whose TP plan 5.25.0 emptied",
    (17, 33): "entry 17 holds for the families whose TP plans had replicated_with_grad_allreduce norms at 5.24.0, "
    "entry 33 for afmoe, hunyuan_v1_moe and lfm2_moe, which got them at 5.25.0",
    (1, 23): "entry 1 holds for the batched_mm experts implementation, entry 23 for openai_privacy_filter's wide "
    "case (grouped_mm)",
    (1, 24): "entry 1 holds for batched_mm, entry 24 for openai_privacy_filter's wide case (grouped_mm)",
    (1, 25): "entry 1 holds for batched_mm, entry 25 for gemma4_text's wide case (grouped_mm)",
    (1, 26): "entry 1 holds for batched_mm, entry 26 for gemma4_text's wide case (grouped_mm)",
    (1, 27): "entry 1 holds for batched_mm, entry 27 for grouped_mm",
    (5, 26): "entry 5 holds for Qwen3-VL/Omni text (and GLM-4-MoE's switched q/k norms) from 5.23, entry 26 for "
    "gemma4_text at 5.8-5.15",
    (1, 32): "entry 1 holds from 5.7, entry 32 (gpt_oss) at 5.6",
    (23, 32): "entry 23 holds for openai_privacy_filter, entry 32 for gpt_oss",
    (24, 32): "entry 24 holds for openai_privacy_filter, entry 32 for gpt_oss",
    (27, 32): "entry 27 holds from 5.7, entry 32 (gpt_oss) at 5.6",
}
MEASURED_FAILURES = (
    (0, *CLASS_VALUES),  # qwen3_moe eager, 5.17.0 (and every other family's there)
    (  # qwen3_moe batched_mm, 5.17.0
        1,
        "AssertionError",
        "gradients differ from the whole model's: 21 of 25 parameters exceed relative error 2.853e-05: "
        "model.layers.0.mlp.gate.weight 0.547; model.layers.1.mlp.gate.weight 0.448; "
        "model.layers.0.post_attention_layernorm.weight 0.402; model.layers.1.post_attention_layernorm.weight 0.124; "
        "model.embed_tokens.weight 0.0114; and 16 more",
    ),
    (  # gpt_oss batched_mm, 5.17.0: its router is `router`
        1,
        "AssertionError",
        "gradients differ from the whole model's: 31 of 37 parameters exceed relative error 2.853e-05: "
        "model.layers.0.post_attention_layernorm.weight 2.28; model.layers.0.mlp.router.bias 1.49; "
        "model.layers.0.mlp.router.weight 0.962; model.layers.1.mlp.router.weight 0.758; "
        "model.layers.1.mlp.router.bias 0.745; and 26 more",
    ),
    (2, *CLASS_VALUES),  # gpt_oss eager, 5.18.0
    (  # qwen3_moe FSDP2 + EP, 5.20.0
        3,
        "AssertionError",
        "gradients differ from the whole model's: 4 of 25 parameters exceed relative error 2.853e-05: "
        "model.layers.1.mlp.experts.gate_up_proj 0.5 (0.5 times the whole model's gradient); "
        "model.layers.0.mlp.experts.gate_up_proj 0.5 (0.5 times the whole model's gradient); "
        "model.layers.1.mlp.experts.down_proj 0.5 (0.5 times the whole model's gradient); "
        "model.layers.0.mlp.experts.down_proj 0.5 (0.5 times the whole model's gradient)",
    ),
    (4, *CLASS_VALUES),  # gpt_oss eager, 5.23.0
    # the wide sweep's, at 5.24.0 (2 gloo ranks): the failing rank's exception type and first message line
    (
        5,
        "AssertionError",
        "gradients differ from the whole model's: 6 of 35 parameters exceed relative error 2.853e-05: "
        "layers.2.self_attn.k_norm.weight 0.688; layers.2.self_attn.q_norm.weight 0.674; "
        "layers.0.self_attn.q_norm.weight 0.619; layers.0.self_attn.k_norm.weight 0.581; "
        "layers.1.self_attn.k_norm.weight 0.526; and 1 more",
    ),
    (  # glm4_moe's switched config (use_qk_norm=True) EP, 5.23.0 and 5.24.0 (the bisect's probes)
        5,
        "AssertionError",
        "gradients differ from the whole model's: 6 of 50 parameters exceed their bound (rounding measured in this "
        "run): model.layers.1.self_attn.k_norm.weight 0.661 (its bound 3.81e-06) (0.341 times the whole model's "
        "gradient); model.layers.1.self_attn.q_norm.weight 0.651 (its bound 3.81e-06); "
        "model.layers.2.self_attn.q_norm.weight 0.41 (its bound 3.81e-06); model.layers.2.self_attn.k_norm.weight "
        "0.401 (its bound 3.81e-06); model.layers.0.self_attn.k_norm.weight 0.365 (its bound 3.81e-06); and 1 more",
    ),
    (
        6,
        "AssertionError",
        "load: rank 1's FSDP shard of model.layers.0.self_attn.conv1d.weight is not its share of the whole model's "
        "(placements (Shard(dim=0),) over mesh (2,)); rank 1's model.layers.0.self_attn.conv1d.weight differs from "
        "the whole model's after loading (largest difference 0.306)",
    ),
    (
        7,
        "RuntimeError",
        "Cannot concatenate overlapping meshes: [DeviceMesh((fsdp=2), 'cpu', stride=(1,)), "
        "DeviceMesh((ep=2), 'cpu', stride=(1,))]",
    ),
    (
        8,
        "RuntimeError",
        "We encountered some issues during automatic conversion of the weights. For details look at the "
        "`CONVERSION` entries of the above report!",
    ),
    (
        9,
        "RuntimeError",
        "We encountered some issues during automatic conversion of the weights. For details look at the "
        "`CONVERSION` entries of the above report!",
    ),
    (
        9,
        "RuntimeError",
        "You set `ignore_mismatched_sizes` to `False`, thus raising an error. For details look at the above report!",
    ),
    (
        10,
        "AmbiguousGlobalPerLayerAttributeError",
        "'qk_rope_head_dim' is a per-layer attribute and may vary across layers. Access it via the individual layer "
        "configs instead (e.g. config.per_layer_config[i].qk_rope_head_dim).",
    ),
    (11, "RuntimeError", "mat1 and mat2 shapes cannot be multiplied (128x64 and 32x64)"),
    (11, "RuntimeError", "shape '[128, 32]' is invalid for input of size 8192"),
    (12, "AssertionError", NO_MESSAGE, REDUCE_VALUE),  # inkling_text, torch 2.13.0
    (13, "AssertionError", NO_MESSAGE, REDUCE_VALUE),  # muse_spark_text, torch 2.11.0 and 2.13.0
    (  # inkling_text, torch 2.11.0
        14,
        "RuntimeError",
        "aten.mul.Tensor got mixed torch.Tensor and DTensor, need to convert all torch.Tensor to DTensor before "
        "calling distributed operators!",
    ),
    (
        15,
        "ValueError",
        "`tp_size=2` was requested, but `OpenAIPrivacyFilterModel` has no `tp_plan`. Pass `tp_plan` in "
        "`DistributedConfig`, add `base_model_tp_plan` to the model's config, or set `tp_size=1`.",
    ),
    (  # zaya EP, 5.23.0 and 5.24.0 (the bisect's probes)
        15,
        "ValueError",
        "`tp_size=2` was requested, but `ZayaForCausalLM` has no `tp_plan`. Pass `tp_plan` in `DistributedConfig`, "
        "add `base_model_tp_plan` to the model's config, or set `tp_size=1`.",
    ),
    (  # deepseek_v3 bfloat16 on the H200, every experts implementation, transformers 5.24.0
        16,
        "AssertionError",
        "logits differ from the whole model's: 171 of 16384 values farther than 0.311 from the float64 reference "
        "(the whole model's own rounding: 0.00838); largest difference 0.71",
    ),
    (  # qwen3_moe EP training, transformers 5.23.0 and 5.24.0 (the bisect's probes)
        17,
        "AssertionError",
        "step 1: gradients differ from the whole model's: 4 of 25 parameters exceed their bound (rounding measured "
        "in this run): model.layers.1.self_attn.k_norm.weight 0.535 (its bound 3.81e-06); "
        "model.layers.1.self_attn.q_norm.weight 0.527 (its bound 3.81e-06); model.layers.0.self_attn.k_norm.weight "
        "0.456 (its bound 4.1e-06); model.layers.0.self_attn.q_norm.weight 0.559 (its bound 5.68e-06) "
        "(accumulated over 2 micro-batches)",
    ),
    (  # qwen3_vl_moe_text EP training, 5.23.0 and 5.24.0
        18,
        "AssertionError",
        "step 1: parameter layers.0.self_attn.q_norm.weight differs across ranks (rank 1 vs rank 0: 0.000999)",
    ),
    (  # mixtral EP, torch's clip_grad_norm_, 5.16.0-5.24.0
        19,
        "RuntimeError",
        "aten._foreach_norm.Scalar got mixed torch.Tensor and DTensor, need to convert all torch.Tensor to DTensor "
        "before calling distributed operators!",
    ),
    (  # the same, torch 2.11.0 (the GPU host's CPU)
        19,
        "RuntimeError",
        "aten._foreach_norm.Scalar: got mixed torch.Tensor and DTensor, need to convert all torch.Tensor to DTensor "
        "before calling distributed operators! Please see https://docs.pytorch.org/docs/main/distributed.tensor.html"
        "#mixed-tensor-and-dtensor-operations for more details.",
    ),
    (  # mixtral FSDP2+EP, torch's clip_grad_norm_, 5.20.0 and 5.24.0
        20,
        "RuntimeError",
        "All operands in aten.stack.default must have the same mesh, but got DeviceMesh((efsdp=1, ep=2), 'cpu', "
        "stride=((), 1)) and DeviceMesh((fsdp=2), 'cpu', stride=(1,)).",
    ),
    (  # mixtral EP, AdamW(fused=True), 5.16.0-5.24.0
        21,
        "RuntimeError",
        "aten._fused_adamw_.default got mixed torch.Tensor and DTensor, need to convert all torch.Tensor to DTensor "
        "before calling distributed operators!",
    ),
    (  # qwen3 under bare fully_shard, save_pretrained, 5.1.0-5.24.0 (the bisect's probes)
        22,
        "RuntimeError",
        "Attempted to access the data pointer on an invalid python storage.",
    ),
    (  # openai_privacy_filter EP, 5.6.0-5.7.0 (harness run per release)
        23,
        "AssertionError",
        OPF_ROUTERS,
    ),
    # openai_privacy_filter EP, 5.8.0-5.16.1: both bugs in one message (the wrong routers of entry 23 and the
    # unwritten expert bias gradient of entry 24); either entry explains it
    (23, "AssertionError", OPF_NAN_BIAS),
    (24, "AssertionError", OPF_NAN_BIAS),
    (  # gemma4_text EP, 5.6.0-5.7.0 and 5.16.0-5.16.1
        25,
        "AssertionError",
        "gradients differ from the whole model's: 63 of 78 parameters exceed their bound (rounding measured in this "
        "run): model.layers.2.router.per_expert_scale 0.607 (its bound 7.67e-06); model.layers.2.router.proj.weight "
        "0.497 (its bound 7.27e-06); model.layers.2.router.scale 0.473 (its bound 7.84e-06); "
        "model.layers.1.router.proj.weight 0.539 (its bound 3.13e-05); model.layers.0.router.proj.weight 0.55 (its "
        "bound 3.82e-05); and 58 more",
    ),
    (  # gemma4_text EP, 5.8.0-5.15.0
        26,
        "AssertionError",
        "gradients differ from the whole model's: 63 of 78 parameters exceed their bound (rounding measured in this "
        "run): model.per_layer_projection_norm.weight nan (its bound 2.07e-05) (the sharded gradient holds NaN or "
        "inf); model.per_layer_model_projection.weight nan (its bound 2.09e-05) (the sharded gradient holds NaN or "
        "inf); model.layers.1.self_attn.v_proj.weight nan (its bound 2.33e-05) (the sharded gradient holds NaN or "
        "inf); model.layers.1.self_attn.q_proj.weight nan (its bound 5.6e-05) (the sharded gradient holds NaN or "
        "inf); model.layers.1.self_attn.q_norm.weight nan (its bound 5.77e-05) (the sharded gradient holds NaN or "
        "inf); and 58 more",
    ),
    (27, "AssertionError", OPF_ROUTERS),  # openai_privacy_filter's wide case is grouped_mm: both bugs in it
    (27, "AssertionError", OPF_NAN_BIAS),
    (  # qwen3_moe EP grouped_mm, 5.7.0 (the bisect's good end, which fails)
        27,
        "AssertionError",
        "gradients differ from the whole model's: 21 of 25 parameters exceed their bound (rounding measured in this "
        "run): model.layers.0.mlp.gate.weight 0.657 (its bound 4.57e-06); model.layers.0.post_attention_layernorm."
        "weight 0.564 (its bound 5.67e-06); model.layers.1.post_attention_layernorm.weight 0.531 (its bound "
        "5.36e-06); model.layers.1.mlp.gate.weight 0.623 (its bound 6.5e-06); model.embed_tokens.weight 0.0181 (its "
        "bound 3.81e-06); and 16 more",
    ),
    (  # the same, torch 2.11.0
        21,
        "RuntimeError",
        "aten._fused_adamw_.default: got mixed torch.Tensor and DTensor, need to convert all torch.Tensor to DTensor "
        "before calling distributed operators! Please see https://docs.pytorch.org/docs/main/distributed.tensor.html"
        "#mixed-tensor-and-dtensor-operations for more details.",
    ),
    (28, "IndexError", "index 4 is out of bounds for dimension 0 with size 4"),  # nemotron_h EP eager, 5.23.0-5.24.0
    # gpt_oss EP below the EP layout's floor: 5.3.0; 5.4.0-5.5.4; 5.6.0-5.6.2
    (29, "UnboundLocalError", "cannot access local variable 'tp_plan_alt' where it is not associated with a value"),
    (
        30,
        "AssertionError",
        "load: rank 0 holds 8 experts of model.layers.0.mlp.experts.gate_up_proj, expected 4 (1/2 of 8); rank 0 holds "
        "8 experts of model.layers.0.mlp.experts.gate_up_proj_bias, expected 4 (1/2 of 8)",
    ),
    (31, *CLASS_VALUES),
    (
        32,
        "AssertionError",
        "gradients differ from the whole model's: 31 of 37 parameters exceed their bound (rounding measured in this "
        "run): model.layers.1.mlp.router.bias 0.699 (its bound 3.84e-06); model.layers.1.mlp.router.weight 0.63 (its "
        "bound 4.31e-06)",
    ),
    # transformers 5.25.0, torch 2.13.0 CPU, 2 gloo ranks: the EP training cases of afmoe, hunyuan_v1_moe, lfm2_moe
    (
        33,
        "AssertionError",
        "step 1: gradients differ from the whole model's: 6 of 53 parameters exceed their bound (rounding measured in "
        "this run): model.layers.1.self_attn.k_norm.weight 0.599 (its bound 5.43e-06); model.layers.1.self_attn."
        "q_norm.weight 0.599 (its bound 5.71e-06); and 4 more (accumulated over 2 micro-batches)",
    ),
    (
        33,
        "AssertionError",
        "step 1: gradients differ from the whole model's: 6 of 45 parameters exceed their bound (rounding measured in "
        "this run): model.layers.1.self_attn.query_layernorm.weight 0.558 (its bound 3.81e-06); model.layers.1."
        "self_attn.key_layernorm.weight 0.558 (its bound 3.81e-06); and 4 more (accumulated over 2 micro-batches)",
    ),
    (
        33,
        "AssertionError",
        "step 1: gradients differ from the whole model's: 4 of 33 parameters exceed their bound (rounding measured in "
        "this run): model.layers.2.self_attn.q_layernorm.weight 0.681 (its bound 3.81e-06); model.layers.2."
        "self_attn.k_layernorm.weight 0.692 (its bound 4.15e-06); and 2 more (accumulated over 2 micro-batches)",
    ),
    (  # dots3_note_vision_encoder EP, 5.25.0
        34,
        "ValueError",
        "`tp_size=2` was requested, but `Dots3NoteVisionModel` has no `tp_plan`. Pass `tp_plan` in "
        "`DistributedConfig`, add `base_model_tp_plan` to the model's config, or set `tp_size=1`.",
    ),
    (  # param2moe EP and FSDP2+EP, 5.25.0
        35,
        "RuntimeError",
        "We encountered some issues during automatic conversion of the weights. For details look at the `CONVERSION` "
        "entries of the above report!",
    ),
    (  # ergo FSDP2+EP, 5.25.0
        36,
        "RuntimeError",
        "You set `ignore_mismatched_sizes` to `False`, thus raising an error. For details look at the above report!",
    ),
)


# Bare asserts measured elsewhere: the same words as entry 12's failure, raised somewhere else.
OTHER_BARE_ASSERTS = ((None, "AssertionError", NO_MESSAGE, ELSEWHERE), (None, "AssertionError", NO_MESSAGE))


def test_each_entry_names_the_failures_its_bisects_measured():
    assert {measured[0] for measured in MEASURED_FAILURES} == set(range(len(known_bugs.KNOWN_BUGS)))
    for index, bug in enumerate(known_bugs.KNOWN_BUGS):
        own = {measured[1:] for measured in MEASURED_FAILURES if measured[0] == index}
        for other, *failure in (*MEASURED_FAILURES, *OTHER_BARE_ASSERTS):
            explained = bug.explains(rank_raised(*failure))
            if explained and {(index, other), (other, index)} & DISJOINT_CASES.keys():
                continue
            assert explained == (tuple(failure) in own), (
                f"entry {index} {'explains' if explained else 'does not explain'} entry {other}'s {failure[:2]!r}"
            )


EXPECTING_CONFTEST = f"""
import importlib.util
import sys

import pytest
from models import families
from upstream import known_bugs

# The suite's own report hook (the fixed-upstream message), not a copy of it.
_spec = importlib.util.spec_from_file_location("suite_conftest", {SUITE_CONFTEST!r})
_suite = sys.modules["suite_conftest"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_suite)
pytest_runtest_makereport = _suite.pytest_runtest_makereport

BUG = known_bugs.KnownBug(key="class-values", transformers=">=5.13,<5.20", torch=">=2.11,<2.14",
                          torch_verified="2.11.0, 2.13.0", layouts=("ep",), checks=("logits",), raises="RuntimeError",
                          match="Class values must be smaller than num_classes", cause="a cause", reproduced="a place",
                          bisected=())
BARE_ASSERT_BUG = known_bugs.KnownBug(
    key="bare-assert", transformers=">=5.23", torch=">=2.13.0", torch_verified="2.13.0", layouts=("ep",),
    checks=("load",),
    raises="AssertionError", match=r"^\\(no message\\)$",
    raised_at="torch/distributed/tensor/placement_types.py:_reduce_value", cause="a bare assert in torch",
    reproduced="a place", bisected=())


@pytest.fixture
def known(request):
    return lambda: known_bugs.expecting(request, (BUG,))


@pytest.fixture
def known_bare_assert(request):
    return lambda: known_bugs.expecting(request, (BARE_ASSERT_BUG,))
"""


def test_a_covered_case_is_xfailed_only_for_the_failure_its_entry_names(pytester):
    pytester.makeconftest(EXPECTING_CONFTEST)
    pytester.makepyfile(
        """
        import pytest
        from rank_failures import REDUCE_VALUE, rank_raised

        from harness.ranks.raised import NO_MESSAGE

        def test_the_known_failure(known):
            with known():
                raise rank_raised("RuntimeError", "Class values must be smaller than num_classes.")

        def test_another_message(known):
            with known():
                raise rank_raised("RuntimeError", "Could not resolve the process group registered under the name 11")

        def test_another_exception(known):
            with known():
                raise rank_raised("AssertionError", "gradients differ from the whole model's: 1 of 9 parameters")

        def test_fixed(known):
            with known():
                pass

        def test_a_skip_inside_stays_a_skip(known):
            with known():
                pytest.skip("needs 4 ranks")

        def test_the_known_bare_assert(known_bare_assert):
            with known_bare_assert():
                raise rank_raised("AssertionError", NO_MESSAGE, REDUCE_VALUE)

        def test_another_bare_assert(known_bare_assert):
            with known_bare_assert():
                raise AssertionError

        def test_passes_the_block_then_fails_saying_fixed_upstream(known):
            with known():
                pass
            assert False, "[XPASS(strict)] known upstream bug: fixed upstream: close the range"
        """
    )
    junit = pytester.path / "junit.xml"
    # in-process: the suite's directory (tests/gpu) and this one are on sys.path
    result = pytester.runpytest("-p", "no:cacheprovider", "-rA", f"--junitxml={junit}")
    result.assert_outcomes(failed=5, xfailed=2, skipped=1)
    # A summary line carries " - <reason>" only when the terminal is wide enough: every pattern ends open.
    result.stdout.fnmatch_lines_random(
        [
            "XFAIL *::test_the_known_failure - known upstream bug: transformers >=5.13,<5.20, torch >=2.11,<2.14 (*): "
            "a cause*",
            "XFAIL *::test_the_known_bare_assert - known upstream bug: transformers >=5.23, torch >=2.13.0 (*): *",
            "FAILED *::test_another_message*",
            "FAILED *::test_another_exception*",
            "FAILED *::test_fixed*",
            "FAILED *::test_another_bare_assert*",
            "E * upstream.entry.DifferentFailure: failed differently from its known bug "
            "(transformers >=5.13,<5.20, "
            "torch >=2.11,<2.14: RuntimeError matching 'Class values must be smaller than num_classes'): "
            "RuntimeError: Could not resolve the process group registered under the name 11",
            "E * upstream.entry.DifferentFailure: failed differently from its known bug (*): "
            "AssertionError: gradients differ from the whole model's: 1 of 9 parameters",
            "E * upstream.entry.DifferentFailure: failed differently from its known bug (* raised in "
            "torch/distributed/tensor/placement_types.py:_reduce_value): AssertionError: (no message) (raised at "
            "test_*.py:* in test_another_bare_assert)",
            "[[]XPASS(strict)[]] fixed upstream: close the range in tests/gpu/upstream/known_bugs.py: "
            "known upstream bug:*",
        ]
    )
    # The properties the suite recorded, as harness reads junit.xml, and nightly triage's class from them alone.
    tests = {test.name: test for test in read_junit_tests(junit)}
    assert (tests["test_the_known_failure"].known_bug, tests["test_the_known_bare_assert"].known_bug) == \
        (("class-values",), ("bare-assert",))
    assert tests["test_fixed"].known_bug_fixed == ("class-values",)
    assert triage.classify_test(tests["test_fixed"]).triage is triage.Triage.KNOWN_UPSTREAM
    # A different failure, and a failure after the covered block (its words saying "fixed upstream"), carry no
    # property: real, with the words as a label only.
    for name in ("test_another_message", "test_another_exception", "test_another_bare_assert",
                 "test_passes_the_block_then_fails_saying_fixed_upstream"):
        assert (tests[name].known_bug, tests[name].known_bug_fixed) == ((), ()), name
        assert triage.classify_test(tests[name]).triage is triage.Triage.REAL, name
    assert triage.label_text(triage.failure_text(tests["test_passes_the_block_then_fails_saying_fixed_upstream"])) \
        == "says it is a known upstream bug, but no known-bugs entry matched"


def test_a_release_day_replay_keeps_the_entries_known_by_then():
    first_at_5_24 = a_bug(key="first-at-5-24", transformers=">=5.24")
    older = a_bug(key="older", transformers=">=5.20")
    fixed = a_bug(key="fixed", transformers=">=5.7,<5.18")
    of_torch = a_bug(key="of-torch", transformers=None)
    table = (first_at_5_24, older, fixed, of_torch)
    assert known_bugs.known_as_of(table, "5.23.0") == (older, fixed, of_torch)
    assert known_bugs.known_as_of(table, "5.24.0") == table
    assert known_bugs.known_as_of(table, None) == table
