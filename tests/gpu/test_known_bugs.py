"""The known-bugs table and its marking: a covered case is xfailed only for the failure its entry names."""

from __future__ import annotations

import re
from xml.etree import ElementTree

import families
import known_bugs
import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from rank_cases import Case

from harness import triage
from harness.ranks.protocol import Died, Failed, failure_error

pytest_plugins = ["pytester"]
SUITE_CONFTEST = known_bugs.__file__.replace("known_bugs.py", "conftest.py")


def a_bug(**fields) -> known_bugs.KnownBug:
    return known_bugs.KnownBug(
        **{
            "package": "transformers",
            "versions": ">=5.13,<5.20",
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


def rank_raised(error_type: str, message: str):
    """The ranks fixture's error for a launch in which rank 1 raised `error_type: message`."""
    failure = Failed(failed_at=1.0, error_type=error_type, error_message=message, traceback="Traceback: ...")
    return failure_error(2, {}, {1: failure}, {})


def test_known_bug_covers_its_cases_only_within_its_versions():
    bug = a_bug(implementations=("batched_mm",))
    case = Case(families.deep_moe()[0], "ep", ("gradients",), experts_implementation="batched_mm")
    assert bug.covers(case, {"transformers": "5.19.0"})
    assert not bug.covers(case, {"transformers": "5.20.0"})
    assert not bug.covers(
        Case(families.deep_moe()[0], "ep", ("load", "logits"), experts_implementation="batched_mm"),
        {"transformers": "5.19.0"},
    )
    assert not bug.covers(
        Case(families.deep_moe()[0], "ep", ("gradients",), experts_implementation="eager"), {"transformers": "5.19.0"}
    )
    assert bug.reason.startswith("known upstream bug: transformers >=5.13,<5.20: a cause")


def test_a_rank_failure_is_matched_on_the_ranks_own_exception_type_and_message():
    bug = a_bug()
    assert bug.explains(rank_raised("RuntimeError", "Class values must be smaller than num_classes."))
    assert not bug.explains(rank_raised("AssertionError", "Class values must be smaller than num_classes."))
    assert not bug.explains(rank_raised("RuntimeError", "Could not resolve the process group"))
    died = failure_error(2, {}, {0: Died(exit_code=-9, last_stack="")}, {})
    assert known_bugs.failure_of(died) == (None, "exited by signal SIGKILL without a result")
    assert not bug.explains(died)
    assert bug.explains(RuntimeError("Class values must be smaller than num_classes.\nmore"))  # not through ranks


@pytest.mark.parametrize(
    "bug", known_bugs.KNOWN_BUGS, ids=[f"{index}-{bug.layouts[0]}" for index, bug in enumerate(known_bugs.KNOWN_BUGS)]
)
def test_every_entry_is_bounded_named_and_bisected(bug):
    """No range covers releases nobody ran (a newer release must show its own verdict); every entry names
    the failure it expects and records the bisects that measured its range."""
    versions = SpecifierSet(bug.versions)
    assert Version("999.0") not in versions, f"{bug.versions}: bound it at the newest release verified"
    assert bug.raises and re.compile(bug.match).pattern
    # both ends: a bisect's command and answer, or why an end has none (a feature's floor, the newest release)
    assert len(bug.bisected) >= 2 and any(line.startswith("harness bisect ") for line in bug.bisected)
    assert all(line.startswith(("harness bisect ", "lower end: ", "upper end: ")) for line in bug.bisected)


# What the covered cases raised on the failing rank in the bisects' probes (results/.../junit.xml, first line),
# by the index of the entry that covers them: each entry names exactly its own failures, and the halving entry
# does not take the router's wrong gradient.
CLASS_VALUES = ("RuntimeError", "Class values must be smaller than num_classes.")
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
    (12, "AssertionError", "(no message)"),
    (
        13,
        "ValueError",
        "`tp_size=2` was requested, but `OpenAIPrivacyFilterModel` has no `tp_plan`. Pass `tp_plan` in "
        "`DistributedConfig`, add `base_model_tp_plan` to the model's config, or set `tp_size=1`.",
    ),
)


def test_each_entry_names_the_failures_its_bisects_measured():
    assert {index for index, _, _ in MEASURED_FAILURES} == set(range(len(known_bugs.KNOWN_BUGS)))
    for index, bug in enumerate(known_bugs.KNOWN_BUGS):
        own = {(error_type, message) for other, error_type, message in MEASURED_FAILURES if other == index}
        for other, error_type, message in MEASURED_FAILURES:
            explained = bug.explains(rank_raised(error_type, message))
            assert explained == ((error_type, message) in own), (
                f"entry {index} {'explains' if explained else 'does not explain'} entry {other}'s {message[:60]!r}"
            )


EXPECTING_CONFTEST = f"""
import importlib.util
import sys

import pytest
import families
import known_bugs

# The suite's own report hook (the fixed-upstream message), not a copy of it.
_spec = importlib.util.spec_from_file_location("suite_conftest", {SUITE_CONFTEST!r})
_suite = sys.modules["suite_conftest"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_suite)
pytest_runtest_makereport = _suite.pytest_runtest_makereport

BUG = known_bugs.KnownBug(package="transformers", versions=">=5.13,<5.20", layouts=("ep",), checks=("logits",),
                          raises="RuntimeError", match="Class values must be smaller than num_classes",
                          cause="a cause", reproduced="a place", bisected=())


@pytest.fixture
def known(request):
    return lambda: known_bugs.expecting(request, BUG)
"""


def test_a_covered_case_is_xfailed_only_for_the_failure_its_entry_names(pytester):
    pytester.makeconftest(EXPECTING_CONFTEST)
    pytester.makepyfile(
        """
        import pytest
        from test_known_bugs import rank_raised

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
        """
    )
    junit = pytester.path / "junit.xml"
    # in-process: the suite directory is on sys.path
    result = pytester.runpytest("-p", "no:cacheprovider", "-rA", f"--junitxml={junit}")
    result.assert_outcomes(failed=3, xfailed=1, skipped=1)
    # A summary line carries " - <reason>" only when the terminal is wide enough: every pattern ends open.
    result.stdout.fnmatch_lines_random(
        [
            "XFAIL *::test_the_known_failure - known upstream bug: transformers >=5.13,<5.20: a cause*",
            "FAILED *::test_another_message*",
            "FAILED *::test_another_exception*",
            "FAILED *::test_fixed*",
            "E * known_bugs.DifferentFailure: failed differently from its known bug (transformers >=5.13,<5.20: "
            "RuntimeError matching 'Class values must be smaller than num_classes'): "
            "RuntimeError: Could not resolve the process group registered under the name 11",
            "E * known_bugs.DifferentFailure: failed differently from its known bug (*): "
            "AssertionError: gradients differ from the whole model's: 1 of 9 parameters",
            "[[]XPASS(strict)[]] fixed upstream: remove the entry in tests/gpu/known_bugs.py: known upstream bug:*",
        ]
    )
    # Nightly triage reads the failure's text: a different failure must not pass for the known bug.
    testcases = ElementTree.parse(junit).iter("testcase")
    different = [case for case in testcases if case.get("name").startswith("test_another")]
    assert len(different) == 2
    for testcase in different:
        failure = testcase.find("failure")
        text = f"{failure.get('message')}\n{failure.text}"
        assert triage.classify_text(text) != (triage.Triage.KNOWN_UPSTREAM, triage.KNOWN_UPSTREAM.name), text
