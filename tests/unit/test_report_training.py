"""A failing training case's per-step loss and gradient norm in the PR comment (a table) and the HTML report (a
table and a plot), read from its JUnit properties as untrusted input."""

from __future__ import annotations

import re

from markup_helpers import TagCollector
from report_helpers import cell, make_test

from harness import contract
from harness.report.render import render
from harness.results import Outcome, ResultSet
from harness.results.training import MAX_STEPS, training_curve


def curve_properties(losses, whole, norms, resumed_at=None) -> dict:
    properties = {contract.TRAIN_STEPS: len(losses)}
    for step, (loss, whole_loss, norm) in enumerate(zip(losses, whole, norms, strict=True), start=1):
        properties[contract.LOSS_STEP.format(step=step)] = loss
        properties[contract.WHOLE_LOSS_STEP.format(step=step)] = whole_loss
        properties[contract.GRAD_NORM_STEP.format(step=step)] = norm
    if resumed_at is not None:
        properties[contract.RESUMED_AT_STEP] = resumed_at
    return properties


def failing_training(**properties) -> ResultSet:
    test = make_test(0, Outcome.FAILED, name="test_training_steps[qwen3_moe-ep-2-float32]",
                     message="step 3: updated parameters differ from the whole model's", **properties)
    return ResultSet((cell("cpu-2rank", test),))


def test_a_failing_training_case_shows_each_steps_loss_beside_the_whole_models():
    results = failing_training(**curve_properties([4.851234567, 4.80000001, 4.9], [4.851234566, 4.80000002, 4.7],
                                                  [38.5, 12.25, 3.0], resumed_at=2))
    comment = render(results, "pr-comment")
    assert "| step | loss, sharded | loss, whole model | gradient norm, sharded |" in comment
    assert "| 1 | 4.85123457 | 4.85123457 | 38.5 |" in comment
    assert "| 3 (resumed) | 4.9 | 4.7 | 3 |" in comment
    html = render(results, "html")
    parser = TagCollector()
    parser.feed(html)
    assert "Loss per step" in html and 'class="resumed"' in html
    assert len(re.findall(r'<circle class="sharded"', html)) == 3 == len(re.findall(r'<circle class="whole"', html))


def test_a_passing_training_case_adds_nothing_and_a_case_without_steps_has_no_curve():
    passing = make_test(0, **curve_properties([1.0], [1.0], [1.0]))
    assert "loss, sharded" not in render(ResultSet((cell("c", passing),)), "pr-comment")
    assert training_curve({}) is None
    assert training_curve({contract.TRAIN_STEPS: "0"}) is None


def test_a_hostile_curve_is_bounded_labelled_and_escaped():
    hostile = "<script>alert(1)</script>| x |"
    assert training_curve({contract.TRAIN_STEPS: str(10**9)}) is None  # past any count a run records
    curve = training_curve({contract.TRAIN_STEPS: str(MAX_STEPS * 50), contract.LOSS_STEP.format(step=1): hostile,
                            contract.LOSS_STEP.format(step=2): "nan", contract.RESUMED_AT_STEP: "-1"})
    assert curve.steps == MAX_STEPS and curve.losses[0] is None and curve.resumed_at is None
    assert training_curve({contract.TRAIN_STEPS: "1e9"}) is None
    assert training_curve({contract.TRAIN_STEPS: "3.0"}) is None
    results = failing_training(**{contract.TRAIN_STEPS: 4, contract.LOSS_STEP.format(step=1): hostile,
                                  contract.WHOLE_LOSS_STEP.format(step=1): "inf",
                                  contract.LOSS_STEP.format(step=2): "1e400", contract.RESUMED_AT_STEP: 9})
    comment = render(results, "pr-comment")
    assert "<script>" not in comment and "| x |" not in comment
    assert len(comment) <= contract.COMMENT_LIMIT
    html = render(results, "html")
    parser = TagCollector()
    parser.feed(html)
    assert "script" not in parser.tags and 'class="resumed"' not in html
