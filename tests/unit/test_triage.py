"""The nightly triage: the classifier's table (one case per pattern, and what must stay a real failure),
new reds against the night before, and the bisect plan, over results folders written to disk."""

from __future__ import annotations

import json

import pytest
from triage_helpers import GRAD, junit_case, write_cell

from harness import contract
from harness.cli import main
from harness.results import Outcome, TestResult, load_results, triage
from harness.results.nightly_records import BisectRecord, TriageRecord
from harness.results.triage import Triage, classify_text

# (text a red carries, class, pattern). Texts are what torch, NCCL, gloo, pip, uv, the rank launcher,
# run.py and the Actions runner print.
CASES = [
    (
        "[XPASS(strict)] known upstream bug: transformers 5.20-5.22 halves FSDP2+EP expert gradients",
        Triage.KNOWN_UPSTREAM,
        "known upstream bug",
    ),
    ("known upstream bug: fixed upstream: remove the entry", Triage.KNOWN_UPSTREAM, "known upstream bug"),
    (  # the suite's strict XPASS of an entry naming both packages' releases (tests/gpu/conftest.py)
        "[XPASS(strict)] fixed upstream: remove the entry in tests/gpu/known_bugs.py: known upstream bug: "
        "transformers >=5.23,<=5.24.0, torch ==2.13.0: a DTensor reaches a plain RMSNorm",
        Triage.KNOWN_UPSTREAM,
        "known upstream bug",
    ),
    # A crash is how an indexing bug upstream shows on CUDA: real, bisected (infrastructure only if the last
    # good build crashes too).
    ("RankFailedError: rank 1 exited by signal SIGKILL without a result", Triage.REAL, triage.CRASH_CAUSE),
    ("RankFailed: rank 1 died killed by signal SIGKILL", Triage.REAL, triage.CRASH_CAUSE),
    ("ChildFailedError: process 3 exited with exitcode -9", Triage.REAL, triage.CRASH_CAUSE),
    ("Fatal Python error: Signal 11 (SIGSEGV) received", Triage.REAL, triage.CRASH_CAUSE),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", Triage.REAL, triage.CRASH_CAUSE),
    ("RuntimeError: CUDA error: device-side assert triggered", Triage.REAL, triage.CRASH_CAUSE),
    (
        "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600000 ms",
        Triage.INFRASTRUCTURE,
        "NCCL or gloo timeout",
    ),
    (
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Timed out waiting 1800000ms for recv "
        "operation to complete (gloo)",
        Triage.INFRASTRUCTURE,
        "NCCL or gloo timeout",
    ),
    (
        "torch.distributed.DistStoreError: Timed out after 301 seconds waiting for clients. 1/2 clients joined.",
        Triage.INFRASTRUCTURE,
        "NCCL or gloo timeout",
    ),
    (
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error",
        Triage.INFRASTRUCTURE,
        "communicator error",
    ),
    (
        "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
        Triage.INFRASTRUCTURE,
        "communicator error",
    ),
    ("RuntimeError: NCCL communicator was aborted on rank 1.", Triage.INFRASTRUCTURE, "communicator error"),
    (
        "RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/pair.cc:446] op.preamble.length <= "
        "op.nbytes",
        Triage.INFRASTRUCTURE,
        "communicator error",
    ),
    ("RuntimeError: CUDA error: unspecified launch failure", Triage.INFRASTRUCTURE, "CUDA error"),
    (
        "RuntimeError: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx( handle, opa, opb, m, n, k)`",
        Triage.INFRASTRUCTURE,
        "CUDA error",
    ),
    (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 47 GiB",
        Triage.INFRASTRUCTURE,
        "out of memory",
    ),
    # run.py's words are no cause: env.json's error_kind is (see test_an_errored_cell_is_classified_by_its_kind)
    ("environment: uv exited 1: error: No solution found when resolving dependencies", None, None),
    ("ERROR: No matching distribution found for torch==2.99.0", Triage.INFRASTRUCTURE, "install failure"),
    (
        "The runner has received a shutdown signal. This can happen when the runner service is stopped",
        Triage.INFRASTRUCTURE,
        "runner lost",
    ),
    ("The self-hosted runner: gpu-h200-03 lost communication with the server.", Triage.INFRASTRUCTURE, "runner lost"),
    # Real failures: what the suite says when the model is wrong must never read as the machine.
    ("expert gradients differ: max relative error 0.5 > bound 1e-05", None, None),
    ("routing differs: layer 1 sends 12 of 64 tokens to other experts than the whole model", None, None),
    ("logits differ: max abs difference nan > bound 1e-05", None, None),
    ("timed out after 60 min; killed", None, None),
    ("AssertionError: rank 1 holds 8 experts, expected 4", None, None),
]


@pytest.mark.parametrize(("text", "expected", "pattern"), CASES)
def test_the_classifier_table(text, expected, pattern):
    assert classify_text(text) == (None if expected is None else (expected, pattern))


def test_every_infrastructure_pattern_has_a_case():
    covered = {pattern for _, expected, pattern in CASES if expected is Triage.INFRASTRUCTURE}
    assert covered == {pattern.name for pattern in triage.INFRASTRUCTURE}


def failing_test(message: str, excerpt: str) -> TestResult:
    return TestResult(test_id="tests/gpu/test_ep.py::test_x[2]", name="test_x[2]", outcome=Outcome.FAILED,
                      message=message, excerpt=excerpt)


GRADIENT_FAILURE = "AssertionError: expert gradients differ: max relative error 0.5 > bound 1e-05"


@pytest.mark.parametrize(("text", "expected", "pattern"), [case for case in CASES if case[1] is not None])
def test_a_pattern_in_the_tests_source_never_classifies_its_failure(text, expected, pattern):
    """Every pattern, written in the test's source (a comment, an except clause, a rank's traceback frame), beside
    a real gradient regression: the red stays real, so it is bisected."""
    excerpt = "\n".join([
        "    def test_x(ranks):",
        "        try:",
        "            ranks.run(2, check)",
        f"        except MemoryError:  # {text}",
        "            raise",
        f">       assert error < bound  # {text}",
        f"E   RankFailedError: rank 1 raised {GRADIENT_FAILURE}",
        "E   Traceback (most recent call last):",
        'E     File "tests/gpu/rank_cases.py", line 40, in check',
        f"E       grads = backward(model)  # {text}",
        "E               ^^^^^^^^^^^^^^^",
        f"E   {GRADIENT_FAILURE}",
        "tests/gpu/test_ep.py:12: RankFailedError",
    ])
    assert triage.classify_test(failing_test(f"RankFailedError: rank 1 raised {GRADIENT_FAILURE}", excerpt)) == \
        (Triage.REAL, "no infrastructure pattern matched")


@pytest.mark.parametrize(("text", "expected", "pattern"), [case for case in CASES if case[1] is not None])
def test_a_pattern_in_the_failures_own_e_lines_classifies_it(text, expected, pattern):
    excerpt = f">       ranks.run(2, check)\nE   {text}\ntests/gpu/test_ep.py:12: RankFailedError"
    assert triage.classify_test(failing_test("RankFailedError: rank 1 failed", excerpt)) == (expected, pattern)


@pytest.mark.parametrize(("kind", "expected", "crash"), [
    (contract.ERROR_ENVIRONMENT, Triage.INFRASTRUCTURE, False),
    (contract.ERROR_INTERRUPTED, Triage.INFRASTRUCTURE, False),
    (contract.ERROR_TIMEOUT, Triage.REAL, True),
    (contract.ERROR_SIGNAL, Triage.REAL, True),
    (contract.ERROR_COLLECTION, Triage.REAL, False),
])
def test_an_errored_cell_is_classified_by_its_kind_and_a_hang_or_crash_is_bisected(tmp_path, kind, expected, crash):
    before, after = tmp_path / "b", tmp_path / "a"
    write_cell(before, "2.13.0", "5.19.0", [junit_case("test_x[2]", "passed")], status="passed")
    # The words say the opposite of the kind: the kind decides.
    write_cell(after, "2.13.0", "5.20.0", [], status="errored", error="environment: CUDA out of memory; killed by "
               "signal SIGKILL", error_kind=kind)
    (red,) = triage.triage(load_results([after]), load_results([before]))
    assert (red.triage, red.crash) == (expected, crash)
    plan = triage.bisect_plan([red], {"h200": ["gpu-h200"]}, {red.cell_id: "h200"})
    if expected is Triage.REAL:
        assert (red.good, red.bad) == ({"torch": "2.13.0", "transformers": "5.19.0"},
                                       {"torch": "2.13.0", "transformers": "5.20.0"})
        assert [(job.cell, job.tests) for job in plan] == [(red.cell_id, "[]")]  # no test: the cell's whole suite
    else:
        assert plan == []


def test_a_crash_that_the_last_good_build_shows_too_is_infrastructure():
    red = triage.Red(cell_id="c", test_id="t", test_name="t", message="rank 1 exited by signal SIGSEGV",
                     triage=Triage.REAL, cause=triage.CRASH_CAUSE, good={"torch": "1"}, bad={"torch": "2"}, crash=True)
    (row,) = triage.with_bisects([red], {"c": BisectRecord(cell="c", same_verdict="fail", error="both fail")})
    assert (row.triage_class, row.cause) == ("infrastructure", "crashes on the last good build too")


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
    answer = BisectRecord(cell="c", pytest_args=["-k", "x"], error="both pass", exit_code=2, same_verdict="pass")
    assert list(answer.to_json()) == ["cell", "pytest_args", "error", "exit_code", "same_verdict"]
    assert BisectRecord.from_json(answer.to_json()) == answer


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
                "test_known[2]", "failed", "[XPASS(strict)] known upstream bug: fixed upstream: remove the entry"
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
        (h200, "test_ep_load[2]"): Triage.INFRASTRUCTURE,
        (h200, "test_known[2]"): Triage.KNOWN_UPSTREAM,
        (h200, "test_wobbly[2]"): Triage.FLAKY,
        ("ada-2gpu-torch2.13.0-tf5.20.0", None): Triage.INFRASTRUCTURE,
    }  # test_old_red failed the night before too: not new
    real = reds[h200, "test_fsdp_ep_moe[2-float32]"]
    assert (real.good, real.bad) == (
        {"torch": "2.13.0", "transformers": "5.19.0"},
        {"torch": "2.13.0", "transformers": "5.20.0"},
    )
    assert reds["ada-2gpu-torch2.13.0-tf5.20.0", None].cause == "install failure"


def test_a_real_red_with_the_same_versions_is_this_repository(tmp_path):
    before, after = tmp_path / "b", tmp_path / "a"
    write_cell(before, "2.13.0", "5.24.0", [junit_case("test_x[2]", "passed")], status="passed")
    write_cell(after, "2.13.0", "5.24.0", [junit_case("test_x[2]", "failed", GRAD)])
    (red,) = triage.triage(load_results([after]), load_results([before]))
    assert red.triage is Triage.REAL and red.good is None
    assert red.cause == "same torch and transformers as the night before: a change in this repository"


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
                "tests": '["tests/gpu/test_fsdp2.py::test_fsdp_ep_moe[2-float32]"]',
            }
        ]
    }
    rows = {row["name"]: row for row in json.loads(out.read_text())["reds"]}
    assert rows["test_fsdp_ep_moe[2-float32]"]["bisect"] == line
    table = capsys.readouterr().out
    assert table.startswith("### Triage: 5 new reds\n")
    assert "| real failure |" in table and "first bad: transformers 5.20.0 (last good 5.19.0)" in table
    assert "| infrastructure |" in table and "| known upstream bug |" in table and "| flaky |" in table


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
