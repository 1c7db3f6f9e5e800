"""The nightly's training trends: each training case's per-step curve kept in the digest of a night (built from its
results folder, keyed by cell and test), and the summary's section listing the cases whose final-step loss, or its gap
to the whole model's, moved beyond the threshold since the night before, or that are new or gone. The values come
from JUnit properties: untrusted, so hostile ones must neither crash the section nor add markup to it."""

from __future__ import annotations

import json
from pathlib import Path
from xml.sax.saxutils import quoteattr

from markup_helpers import TagCollector
from report_helpers import cell, make_test

from harness import contract
from harness.cli import main
from harness.report.filters import code_span
from harness.report.render import render
from harness.results import (
    DIGEST_TAG,
    CellStatus,
    ResultSet,
    decode_digest,
    digest,
    encode_digest,
    load_baseline,
    load_results,
)
from harness.results.training import MAX_STEPS
from harness.results.training_trends import DTYPE_THRESHOLDS, THRESHOLD, training_trends

CELL = "h200-2gpu-torch2.11.0-tf5.18.0"
DRIFT = "test_training_steps[qwen3_moe-ep-2-float32]"
STEADY = "test_training_steps[qwen3_moe-fsdp_ep-2-float32]"


def curve(losses, whole=None, norms=None, **extra) -> dict:
    """A training case's properties as tests/gpu/training/steps.py records them."""
    whole = losses if whole is None else whole
    norms = norms or [1.0] * len(losses)
    properties = {contract.TRAIN_STEPS: len(losses), **extra}
    for step, (loss, whole_loss, norm) in enumerate(zip(losses, whole, norms, strict=True), start=1):
        properties[contract.LOSS_STEP.format(step=step)] = loss
        properties[contract.WHOLE_LOSS_STEP.format(step=step)] = whole_loss
        properties[contract.GRAD_NORM_STEP.format(step=step)] = norm
    return properties


def night(*cases: tuple[str, dict], cell_id: str = CELL) -> ResultSet:
    return ResultSet((cell(cell_id, *(make_test(index, name=name, **properties)
                                      for index, (name, properties) in enumerate(cases))),))


def section(text: str) -> str:
    """The training trends section of a rendered Markdown report, up to the next heading."""
    start = text.index("#### Training trends")
    end = text.find("\n####", start + 1)
    return text[start:] if end < 0 else text[start:end]


LAST_NIGHT = night((DRIFT, curve([4.85, 4.5, 4.25], [4.85, 4.5, 4.2500001])),
                   (STEADY, curve([3.5, 3.25, 3.0])),
                   ("test_training_steps[gone-ep-2-float32]", curve([2.0, 1.5, 1.25])))
TONIGHT = night((DRIFT, curve([4.85, 4.5, 4.3], [4.85, 4.5, 4.3000001])),  # +1.18% at step 3
                (STEADY, curve([3.5, 3.25, 3.0000001])),  # +3.3e-8: rounding
                ("test_training_steps[new-ep-2-float32]", curve([2.0, 1.5, 1.125])))


def test_a_drifted_loss_is_listed_with_both_nights_and_a_steady_one_is_only_counted():
    text = section(render(TONIGHT, "summary", baseline=digest(LAST_NIGHT)))
    lines = text.splitlines()
    assert "2 training cases compared at the final step with the baseline: 1 moved by more than 0.1% " \
           "(float32; bfloat16 1.6%, float16 0.2%), 1 new, 1 gone." in lines
    [drifted] = [line for line in lines if DRIFT in line]
    assert drifted.startswith("- 📈 ") and f"in `{CELL}`" in drifted
    assert "loss at step 3: 4.25 → 4.3 (+1.2%)" in drifted
    assert STEADY not in text
    [new] = [line for line in lines if "[new-" in line]
    assert "(new)" in new and "— → 1.125" in new
    [gone] = [line for line in lines if "[gone-" in line]
    assert "(gone)" in gone and "1.25 → —" in gone


def test_the_gap_to_the_whole_model_is_compared_on_its_own():
    """The sharded loss stayed; the whole model's moved by 0.5%: the gap between them grew past 0.1% of the loss."""
    before = night((DRIFT, curve([2.0, 1.0], [2.0, 1.0])))
    after = night((DRIFT, curve([2.0, 1.0], [2.0, 1.005])))
    trends = training_trends(after, digest(before))
    [trend] = trends.trends
    assert trend.moved == ("gap",) and trend.loss_change == 0.0
    assert "gap to the whole model 0.00e+00 → 4.98e-03" in section(render(after, "summary", baseline=digest(before)))


def test_a_bfloat16_case_has_its_dtypes_threshold_and_a_changed_step_count_is_a_change():
    name = "test_training_steps[qwen3_moe-ep-2-bfloat16]"
    before = night((name, curve([2.0, 1.0], dtype="bfloat16")), (DRIFT, curve([2.0, 1.0])))
    half_percent = night((name, curve([2.0, 1.005], dtype="bfloat16")), (DRIFT, curve([2.0, 1.0, 1.0])))
    trends = training_trends(half_percent, digest(before))
    assert THRESHOLD < 0.005 < DTYPE_THRESHOLDS["bfloat16"]
    assert [(trend.test_id.split("::")[1], trend.moved) for trend in trends.trends] == [(DRIFT, ("steps",))]
    assert "loss at step 2 → 3: 1 → 1 (+0%)" in section(render(half_percent, "summary", baseline=digest(before)))


def test_a_digest_keeps_the_whole_curve_by_cell_and_test_and_a_comment_carries_none():
    kept = digest(LAST_NIGHT).cells[CELL].training
    assert set(kept) == {test.test_id for test in LAST_NIGHT.cells[0].tests}
    assert kept[f"tests/gpu/test_ep.py::{DRIFT}"].whole_losses == (4.85, 4.5, 4.2500001)
    # A comment's digest is bounded for the next push's deltas: it carries no curves, and its reader says so.
    from_comment = decode_digest(f"{DIGEST_TAG} {encode_digest(digest(LAST_NIGHT), 16_000)}")
    assert from_comment == digest(LAST_NIGHT) and from_comment.cells[CELL].training is None
    assert training_trends(TONIGHT, from_comment) is None
    assert "Training trends" not in render(TONIGHT, "pr-comment", baseline=from_comment)


def test_no_training_case_on_either_night_adds_no_section():
    plain = ResultSet((cell(CELL, make_test(0)),))
    assert training_trends(plain, digest(plain)) is None
    assert "Training trends" not in render(plain, "summary", baseline=digest(plain))


def test_cells_one_night_cannot_tell_are_counted_not_listed_case_by_case():
    errored = ResultSet((cell(CELL, status=CellStatus.ERRORED, reason="timeout"),
                         cell("h200-2gpu-torch2.11.0-tf5.19.0", make_test(0, name=DRIFT, **curve([1.0])))))
    trends = training_trends(errored, digest(LAST_NIGHT))
    assert trends.compared == 0 and trends.trends == ()
    text = section(render(errored, "summary", baseline=digest(LAST_NIGHT)))
    assert f"`{CELL}`: no tests tonight; 3 training cases not compared" in text
    assert "`h200-2gpu-torch2.11.0-tf5.19.0`: not in the night before's results; 1 training case not compared" in text


# ---------------------------------------------------------------------------------------------
# Hostile values, through real JUnit files and `harness report --baseline FOLDER`, as the nightly runs it


def write_night(root: Path, cases: dict[str, dict[str, object]], cell_id: str = CELL) -> Path:
    folder = root / cell_id
    folder.mkdir(parents=True)
    (folder / "env.json").write_text(json.dumps({
        "schema": 1, "cell": {"id": cell_id, "gpu": "h200", "gpus": 2, "matrix": "nightly"}, "status": "failed",
        "exit_code": 1, "git_sha": "4f1c2a9e7d3b8a6c5e0f1d2c3b4a59687766aabb"}))
    testcases = "".join(
        f'<testcase classname="tests.gpu.test_training" name={quoteattr(name)} time="1.0"><properties>'
        + "".join(f"<property name={quoteattr(key)} value={quoteattr(str(value))}/>" for key, value in props.items())
        + "</properties></testcase>"
        for name, props in cases.items())
    (folder / "junit.xml").write_text('<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">'
                                      f"{testcases}</testsuite></testsuites>")
    return root


HOSTILE_NAME = "test_training_steps[<img src=x onerror=alert(1)>|`@team ](http://evil)]"
HOSTILE_LOSS = "<script>alert(1)</script>| x |"


def hostile_nights(tmp_path: Path) -> tuple[Path, Path]:
    last = {
        "test_nan_stays_nan": curve([1.0, "nan"]),
        "test_nan_becomes_a_number": curve([1.0, "nan"]),
        "test_inf_whole_loss": curve([1.0, 2.0], [1.0, "inf"]),
        "test_a_string_where_a_loss_belongs": curve([1.0, HOSTILE_LOSS]),
        "test_a_loss_beyond_float": curve([1.0, "1e400"]),
        "test_out_of_range_both_ends": curve([1.0, "1e300"], [1.0, "1e-300"]),
        "test_zero_whole_loss": curve([1.0, 0.5], [1.0, 0.0]),
        "test_missing_steps": {contract.TRAIN_STEPS: 3, contract.LOSS_STEP.format(step=3): 1.5},
        "test_huge_step_count": {contract.TRAIN_STEPS: MAX_STEPS * 1000, contract.LOSS_STEP.format(step=1): 1.0},
        "test_steps_past_any_run": {contract.TRAIN_STEPS: "9" * 400},
        "test_steps_not_a_count": {contract.TRAIN_STEPS: "3.0e0", contract.LOSS_STEP.format(step=1): 1.0},
        HOSTILE_NAME: curve([1.0, 2.0]),
    }
    tonight = {
        **last,
        "test_nan_becomes_a_number": curve([1.0, 1.0]),
        "test_a_loss_beyond_float": curve([1.0, "-1e400"]),
        "test_out_of_range_both_ends": curve([1.0, "-1e300"], [1.0, "1e-300"]),
        "test_missing_steps": {contract.TRAIN_STEPS: 3, contract.LOSS_STEP.format(step=2): 1.5},
        HOSTILE_NAME: curve([1.0, 3.0]),
    }
    return write_night(tmp_path / "baseline", last), write_night(tmp_path / "results", tonight)


def test_hostile_values_neither_crash_the_trends_nor_add_markup(tmp_path):
    baseline, results = hostile_nights(tmp_path)
    trends = training_trends(load_results([results]), load_baseline(baseline))
    # nan to nan, an unchanged inf, a string read as no value on both nights and a final step recorded on neither are
    # unchanged; a label that changed, a value that appeared or vanished, moved; a zero whole loss gives no gap (no
    # division by it); the two without a readable step count are no training cases.
    assert {trend.test_id.split("::")[1]: trend.moved for trend in trends.trends} == {
        "test_nan_becomes_a_number": ("loss", "gap"), "test_a_loss_beyond_float": ("loss",),
        "test_out_of_range_both_ends": ("loss",), "test_missing_steps": ("loss",), HOSTILE_NAME: ("loss",)}
    assert trends.compared == 10
    outputs = {}
    for fmt in ("summary", "pr-comment", "html", "terminal"):
        output = tmp_path / f"out.{fmt}"
        assert main(["report", str(results), "--baseline", str(baseline), "--format", fmt, "-o", str(output)]) == 0
        outputs[fmt] = output.read_text(encoding="utf-8")
    text = section(outputs["summary"])
    assert "10 training cases compared" in text and "5 moved" in text
    assert "loss at step 2: nan → 1; gap" in text  # no relative change from a label
    assert "loss at step 2: inf → -inf;" in text
    assert "loss at step 2: 1e+300 → -1e+300 (-2e+02%); gap to the whole model inf → inf" in text
    assert "loss at step 3: 1.5 → —;" in text
    # The hostile name only inside a code span, as every test id: no link, image, mention or table cell of its own.
    assert f"- 📈 {code_span(f'tests.gpu.test_training::{HOSTILE_NAME}', 500)} in `{CELL}`" in text
    assert all("<script>" not in rendered for rendered in outputs.values())
    parser = TagCollector()
    parser.feed(outputs["html"])
    assert "script" not in parser.tags and "img" not in parser.tags


def test_a_huge_step_count_keeps_the_record_bounded(tmp_path):
    baseline, _ = hostile_nights(tmp_path)
    kept = load_baseline(baseline).cells[CELL].training
    huge = kept["tests.gpu.test_training::test_huge_step_count"]
    assert huge.steps == MAX_STEPS and huge.losses[-1] is None
    assert not any("test_steps_past_any_run" in key or "test_steps_not_a_count" in key for key in kept)
