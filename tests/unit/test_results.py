"""harness.results: cell folders (real pytest output in golden/samples, broken files written here),
the digest a PR comment carries, and the comparison with a baseline."""

from __future__ import annotations

import gc
import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from report_helpers import case_xml, junit_xml

from harness import contract
from harness.errors import ConfigError
from harness.results import (
    DIGEST_TAG,
    BaselineUnreadable,
    CaseCounts,
    CellResult,
    CellStatus,
    NotRun,
    Outcome,
    ResultSet,
    TestResult,
    case_class,
    compare,
    decode_digest,
    digest,
    encode_digest,
    find_cell_folders,
    load_baseline,
    load_results,
    natural_key,
    paused_gc,
    read_cell,
)

SAMPLES = Path(__file__).parent / "golden" / "samples"
RUN = SAMPLES / "run"
BASELINE = SAMPLES / "baseline"
ADA = RUN / "results-ada-2gpu-torch2.11.0-tf5.9.0"  # the artifact folder is the cell folder
CPU = RUN / "results-cpu-2rank-torch2.13.0-tf5.24.0" / "cpu-2rank-torch2.13.0-tf5.24.0"

JUNIT_OK = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="1" time="1.5">
<testcase classname="tests.gpu.test_ep" name="test_ok" file="tests/gpu/test_ep.py" time="1.5"/>
</testsuite></testsuites>
"""


def env_json(**overrides) -> str:
    record = {"schema": 1, "cell": {"id": "ada-2gpu-torch2.11.0-tf5.9.0", "gpu": "ada", "gpus": 2,
                                    "torch": "2.11.0", "transformers": "5.9.0", "matrix": "pr"},
              "status": "passed", "error": None, "exit_code": 0, "duration_s": 12.0,
              "versions": {"torch": "2.11.0", "cuda": None}, "git_sha": "abc",
              "reproduce": "harness run --matrix pr --cell 'ada-2gpu-torch2.11.0-tf5.9.0'"}
    record.update(overrides)
    return json.dumps(record)


def write_cell(folder: Path, **files: str | None) -> Path:
    """A cell folder; `files` maps junit/env/memory/log to text (None: leave the file out)."""
    defaults = {"junit": JUNIT_OK, "env": env_json(), "memory": None, "log": "log line\n"}
    names = {"junit": "junit.xml", "env": "env.json", "memory": "memory.json", "log": "pytest.log"}
    folder.mkdir(parents=True, exist_ok=True)
    for key, text in {**defaults, **files}.items():
        if text is not None:
            (folder / names[key]).write_text(text)
    return folder


# ---------------------------------------------------------------------------------------------
# Real pytest output (golden samples)


def outcomes(cell: CellResult) -> dict[str, tuple[str, int]]:
    return {test.test_id: (test.outcome.value, test.attempts) for test in cell.tests}


def test_reruns_that_flake_stay_red_and_error_are_told_apart():
    cell = read_cell(ADA)
    seen = outcomes(cell)
    assert seen["tests/gpu/test_fsdp.py::test_fsdp_rank_barrier"] == ("flaky", 2)
    assert seen["tests/gpu/test_fsdp.py::test_fsdp_checkpoint_reload"] == ("failed", 3)
    assert seen["tests/gpu/test_fsdp.py::test_fsdp_gradients[2]"] == ("errored", 3)  # broken fixture
    assert seen["tests/gpu/test_fsdp.py::test_fsdp_gradients[4]"] == ("skipped", 1)
    assert seen["tests/gpu/test_ep.py::test_ep_load[2]"] == ("passed", 1)
    assert seen["tests/gpu/test_ep.py::test_ep_gpt_oss_bias"] == ("xfailed", 1)  # a known upstream bug
    assert cell.counts.total == len(seen) == 19  # every test once, however often it ran
    assert (cell.status, cell.reason) == (CellStatus.FAILED, None)


def test_failure_keeps_first_line_and_the_end_of_the_traceback():
    routing = next(t for t in read_cell(ADA).tests if t.test_id.endswith("::test_ep_routing"))
    assert routing.message == ("routing differs: layer 1 sends 1 of 32 tokens to other experts "
                               "than the whole model")
    assert routing.excerpt.endswith("tests/gpu/test_ep.py:45: AssertionError")
    assert routing.property_value("min_routing_margin") == "0.18"


def test_skips_xfail_and_properties_from_a_passing_cell():
    cell = read_cell(CPU)
    by_id = {test.test_id: test for test in cell.tests}
    assert by_id["tests/gpu/test_ep.py::test_ep_load[4]"].message == "needs 4 CPU ranks"
    xfail = by_id["tests/gpu/test_fsdp.py::test_fsdp_fp8"]
    assert (xfail.outcome, xfail.message) == (Outcome.XFAILED, "fp8 fake quant is not implemented for gloo")
    gradients = by_id["tests/gpu/test_fsdp.py::test_fsdp_gradients[2]"]
    assert gradients.number("max_rel_grad_error") == pytest.approx(2.2e-3)
    assert gradients.number("grad_error_bound") == pytest.approx(3e-2)
    assert gradients.peak_allocated_mib == pytest.approx(4216.0)  # the larger of rank0 and rank1
    assert (cell.status, cell.memory, cell.memory_note) == (CellStatus.PASSED, (), "cpu cell: no GPU")


def test_a_cell_where_nothing_distributed_ran_is_not_run_and_says_what_it_needed():
    cell = read_cell(SAMPLES / "notrun" / "cpu-1rank-torch2.13.0-tf5.24.0")
    assert (cell.status, cell.reason) == (CellStatus.NOT_RUN, None)
    assert cell.not_run == NotRun(cases=12, smallest_world=2, largest_world=8, host_ranks=1, host_rank_unit="ranks")
    assert cell.ran_families == ()
    assert cell.counts.failed == cell.counts.errored == 0 and cell.counts.passed > 0  # what one rank can run, ran


def test_a_cell_where_some_distributed_cases_ran_passes_and_counts_the_others():
    cell = read_cell(CPU)
    assert cell.status is CellStatus.PASSED
    assert cell.not_run == NotRun(cases=7, smallest_world=4, largest_world=8, host_ranks=2, host_rank_unit="ranks")
    assert cell.ran_families == ("mixtral", "qwen3_moe")  # gpt_oss has no distributed case in the sample suite


def test_a_failed_distributed_case_counts_as_run_and_its_family_as_covered():
    failed = next(test for test in read_cell(ADA).tests if test.name == "test_ep_gradients[2-bf16]")
    assert (failed.outcome, failed.world_size, failed.family) == (Outcome.FAILED, 2, "qwen3_moe")
    assert failed.ran_distributed and not failed.not_run_for_ranks


def junit_of(*cases: str) -> str:
    """A junit.xml of the given <testcase> bodies (their results and properties), one test each."""
    entries = "".join(f'<testcase classname="tests.gpu.test_ep" name="test_{index}" file="tests/gpu/test_ep.py" '
                      f'time="0.1">{case}</testcase>' for index, case in enumerate(cases))
    return f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{entries}</testsuite></testsuites>'


def props(**values: object) -> str:
    return "<properties>" + "".join(f'<property name="{name}" value="{value}"/>' for name, value in values.items()) + \
        "</properties>"


SKIPPED_FOR_RANKS = props(needs_world_size=4, host_ranks=1, host_rank_unit="GPUs") + \
    '<skipped type="pytest.skip" message="needs 4 GPUs (1 visible)"/>'
RAN_ON_TWO = props(world_size=2, family="mixtral")


@pytest.mark.parametrize(("env_status", "exit_code", "cases", "status"), [
    ("passed", 0, [SKIPPED_FOR_RANKS, ""], "not_run"),  # the folder says passed; its cases say otherwise
    ("not_run", 0, [SKIPPED_FOR_RANKS, ""], "not_run"),
    ("not_run", 0, [""], "not_run"),  # env.json alone is enough never to read green
    ("passed", 0, [SKIPPED_FOR_RANKS, RAN_ON_TWO], "passed"),
    ("passed", 0, [SKIPPED_FOR_RANKS, RAN_ON_TWO + '<skipped type="pytest.xfail" message="known"/>'], "passed"),
    ("failed", 1, [SKIPPED_FOR_RANKS, '<failure message="one is not two"/>'], "failed"),  # red wins
    ("passed", 0, [props(world_size=1), ""], "passed"),  # nothing skipped for ranks: nothing it could not run
    # a skip for another reason (a release floor) says nothing about the host, whatever its words
    ("passed", 0, ['<skipped type="pytest.skip" message="needs 4 GPUs"/>'], "passed"),
    # a case that recorded a world size and then skipped did not run
    ("passed", 0, [SKIPPED_FOR_RANKS, props(world_size=2) + '<skipped type="pytest.skip" message="m"/>'], "not_run"),
])
def test_not_run_comes_from_the_typed_properties(tmp_path, env_status, exit_code, cases, status):
    folder = write_cell(tmp_path / "ada-1gpu-torch2.11.0-tf5.9.0", junit=junit_of(*cases),
                        env=env_json(status=env_status, exit_code=exit_code))
    assert read_cell(folder).status.value == status


# (outcome, message, properties, attempts, the case's class). The class comes from the outcome and the typed
# properties only; each row's words say the opposite of its class where they could.
CASE_CLASSES = [
    ("passed", "", {}, 1, contract.CASE_PASSED),
    ("passed", "", {"not_built": "a case that passed was built"}, 1, contract.CASE_PASSED),
    ("passed", "", {}, 2, contract.CASE_PASSED),  # flaky: failed, then passed on a rerun
    ("failed", "routing differs: layer 1", {}, 1, contract.CASE_NEW_RED),
    ("failed", "[XPASS(strict)] fixed upstream: close the range", {}, 1, contract.CASE_NEW_RED),  # words alone
    ("failed", "[XPASS(strict)] known upstream bug: x", {"known_bug_fixed": "ep-eager-bias"}, 1,
     contract.CASE_FIXED_UPSTREAM),
    ("failed", "passed", {"known_bug_fixed": "ep-eager-bias,fsdp-mask"}, 1, contract.CASE_FIXED_UPSTREAM),
    ("failed", "passed", {"known_bug_fixed": "Not A Key"}, 1, contract.CASE_NEW_RED),  # names no entry
    ("failed", "boom", {"known_bug": "ep-eager-bias"}, 1, contract.CASE_NEW_RED),  # an xfail's key on a failure
    ("errored", "failed on teardown", {"known_bug_fixed": "ep-eager-bias"}, 1, contract.CASE_NEW_RED),
    ("errored", "failed on setup", {}, 1, contract.CASE_NEW_RED),
    ("xfailed", "known upstream bug: x", {"known_bug": "ep-eager-bias"}, 1, contract.CASE_KNOWN_PRESENT),
    ("xfailed", "known upstream bug: x", {}, 1, contract.CASE_PASSED),  # a plain xfail mark: no entry names it
    ("xfailed", "known upstream bug: x", {"known_bug": "<b>x</b>"}, 1, contract.CASE_PASSED),
    ("skipped", "not built: the config class refuses it", {"not_built": "the config class refuses it"}, 1,
     contract.CASE_NOT_BUILT),
    ("skipped", "needs 4 GPUs", {"not_built": ""}, 1, contract.CASE_NOT_BUILT),  # the property, whatever its value
    ("skipped", "not built: the config class refuses it", {}, 1, contract.CASE_NOT_RUN),  # words alone
    ("skipped", "needs 4 GPUs", {"needs_world_size": "4", "host_ranks": "2", "host_rank_unit": "GPUs"}, 1,
     contract.CASE_NOT_RUN),
    ("skipped", "needs torch>=2.14", {}, 1, contract.CASE_NOT_RUN),
]


@pytest.mark.parametrize(("outcome", "message", "properties", "attempts", "expected"), CASE_CLASSES)
def test_each_case_has_one_class_from_its_outcome_and_typed_properties(tmp_path, outcome, message, properties,
                                                                        attempts, expected):
    junit = junit_xml(case_xml("test_x[2]", outcome, message, attempts, **properties))
    cell = read_cell(write_cell(tmp_path / "h200-2gpu-torch2.13.0-tf5.25.0", junit=junit))
    [test] = cell.tests
    assert case_class(test) == expected
    assert cell.case_counts.by_class() == tuple((case, int(case == expected)) for case in contract.CASE_CLASSES)


def test_every_class_is_counted_per_cell_and_per_run_in_the_contracts_order(tmp_path):
    cases = [case_xml(f"test_{index}", outcome, message, attempts, **properties)
             for index, (outcome, message, properties, attempts, _) in enumerate(CASE_CLASSES)]
    first = read_cell(write_cell(tmp_path / "a", junit=junit_xml(*cases)))
    second = read_cell(write_cell(tmp_path / "b", junit=junit_xml(*cases[:4])))
    expected = CaseCounts(new_red=6, known_present=1, fixed_upstream=2, not_built=2, not_run=3, passed=5)
    assert first.case_counts == expected and first.case_counts.total == len(CASE_CLASSES)
    assert ResultSet((first, second)).case_counts == CaseCounts(new_red=7, known_present=1, fixed_upstream=2,
                                                                not_built=2, not_run=3, passed=8)
    assert [case for case, _ in expected.by_class()] == list(contract.CASE_CLASSES)
    assert CaseCounts.from_json(json.loads(json.dumps(expected.to_json()))) == expected


@pytest.mark.parametrize("document", [[], {"new red": -1}, {"new red": 1.5}, {"new red": True}, {"red": 1}])
def test_case_counts_of_another_shape_are_refused(document):
    with pytest.raises(ValueError, match="case count"):
        CaseCounts.from_json(document)


def test_a_not_built_reason_is_bounded_text_whatever_it_holds(tmp_path):
    hostile = "<script>alert(1)</script>\n| x |\n" + "y" * 10_000  # XML carries no escape character: pytest drops it
    junit = junit_xml(case_xml("test_x[2]", "skipped", "not built: x", not_built=hostile))
    [test] = read_cell(write_cell(tmp_path / "c", junit=junit)).tests
    assert case_class(test) == contract.CASE_NOT_BUILT
    assert len(test.not_built) == contract.NOT_BUILT_CHARS and test.not_built.startswith("<script>")


def test_reproduce_selects_the_new_reds_and_leaves_cases_fixed_upstream_out(tmp_path):
    junit = junit_xml(case_xml("test_red", "failed", "boom"),
                      case_xml("test_fixed", "failed", "passed", known_bug_fixed="ep-eager-bias"))
    cell = read_cell(write_cell(tmp_path / "c", junit=junit, env=env_json(status="failed", exit_code=1,
                                                                          pytest_args=[])))
    assert cell.reproduce_command() == "harness run --matrix pr --cell ada-2gpu-torch2.11.0-tf5.9.0 -- -k test_red"


def test_crashed_cell_without_junit_is_errored_with_the_log_tail():
    cell = read_cell(RUN / "results-h200-8gpu-torch2.11.0-tf5.18.0" / "h200-8gpu-torch2.11.0-tf5.18.0")
    assert (cell.status, cell.reason) == (CellStatus.ERRORED, "pytest crashed: killed by signal SIGKILL")
    assert cell.tests == ()
    assert cell.log_tail.endswith("tests/gpu/test_ep.py ..........x")
    assert [gpu.peak_used_mib for gpu in cell.memory][-1] == 41984.0


@pytest.mark.parametrize(("kind", "install_log", "log_tail"), [
    ("busy_gpus", None, None),
    ("environment", "Resolved 12 packages\nerror: no torch==9.9 wheel\n",
     "Resolved 12 packages\nerror: no torch==9.9 wheel"),
])
def test_a_cell_errored_before_pytest_started_misses_no_pytest_file(tmp_path, kind, install_log, log_tail):
    folder = write_cell(tmp_path / "ada-2gpu-torch2.11.0-tf5.9.0", junit=None, log=None,
                        env=env_json(status="errored", error=f"{kind}: why", error_kind=kind, exit_code=None))
    if install_log is not None:
        (folder / "install.log").write_text(install_log)
    cell = read_cell(folder)
    assert (cell.status, cell.reason, cell.error_kind) == (CellStatus.ERRORED, f"{kind}: why", kind)
    # no "junit.xml: missing: pytest never wrote it (crash, kill or timeout)", no "pytest.log: missing"
    assert [str(problem) for problem in cell.problems] == ["memory.json: missing"]
    assert cell.log_tail == log_tail


def test_an_unknown_error_kind_is_one_problem(tmp_path):
    folder = write_cell(tmp_path / "ada-2gpu-torch2.11.0-tf5.9.0", junit=None,
                        env=env_json(status="errored", error="odd", error_kind="gremlins", exit_code=None))
    told = [str(problem) for problem in read_cell(folder).problems]
    assert sum("gremlins" in line for line in told) == 1, told


def test_a_cell_that_timed_out_without_junit_still_says_it_is_missing(tmp_path):
    folder = write_cell(tmp_path / "ada-2gpu-torch2.11.0-tf5.9.0", junit=None,
                        env=env_json(status="errored", error="timeout: 30 min", error_kind="timeout", exit_code=None))
    cell = read_cell(folder)
    assert [str(problem) for problem in cell.problems] == [
        "memory.json: missing", "junit.xml: missing: pytest never wrote it (crash, kill or timeout)"]
    assert cell.log_tail == "log line"


# What pytest's junitxml writes when SIGINT stops it during its second test: the one that ran, then a
# <testcase> with no name for the one that was running.
JUNIT_INTERRUPTED = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest"
errors="0" failures="0" skipped="0" tests="1" time="1.012"><testcase classname="tests.gpu.test_ep" name="test_ok"
file="tests/gpu/test_ep.py" line="1" time="0.001" /><testcase time="0.000" /></testsuite></testsuites>
"""
JUNIT_INTERRUPTED_FIRST = JUNIT_INTERRUPTED.replace(
    '<testcase classname="tests.gpu.test_ep" name="test_ok"\nfile="tests/gpu/test_ep.py" line="1" time="0.001" />', "")
INTERRUPTED_ENV = env_json(status="errored", error="pytest exited 2 (interrupted); see pytest.log", exit_code=2)


@pytest.mark.parametrize(("junit", "running", "passed", "stopped_id"), [
    (JUNIT_INTERRUPTED_FIRST, None, [], "(the test that was running; its name was not recorded)"),
    (JUNIT_INTERRUPTED, "tests/gpu/test_ep.py::test_hangs[2]\n", ["tests/gpu/test_ep.py::test_ok"],
     "tests/gpu/test_ep.py::test_hangs[2]"),
    (None, "tests/gpu/test_ep.py::test_hangs[2]\n", [], "tests/gpu/test_ep.py::test_hangs[2]"),  # killed: no junit
])
def test_a_cell_stopped_mid_test_counts_no_pass_for_it_and_names_it(tmp_path, junit, running, passed, stopped_id):
    folder = write_cell(tmp_path / "c", junit=junit, env=INTERRUPTED_ENV)
    if running is not None:
        (folder / "running-test.txt").write_text(running)
    cell = read_cell(folder)
    assert cell.status is CellStatus.ERRORED
    assert [test.test_id for test in cell.tests if test.outcome is Outcome.PASSED] == passed
    assert [(test.test_id, test.outcome) for test in cell.failing_tests] == [(stopped_id, Outcome.ERRORED)]
    assert "still running when pytest stopped" in cell.failing_tests[0].message


def test_a_running_test_file_that_is_not_a_regular_file_is_ignored(tmp_path):
    folder = write_cell(tmp_path / "c", junit=JUNIT_OK)
    os.mkfifo(folder / "running-test.txt")  # opening it for reading would block
    assert [test.outcome for test in read_cell(folder).tests] == [Outcome.PASSED]


def test_truncated_junit_is_an_errored_row_not_an_exception():
    cell = read_cell(RUN / "results-gb200-4gpu-torch2.12.0-tf5.24.0" / "gb200-4gpu-torch2.12.0-tf5.24.0")
    assert cell.status is CellStatus.ERRORED
    assert cell.reason.startswith("junit.xml: malformed or truncated XML")
    assert [gpu.peak_used_mib for gpu in cell.memory] == [30100.0, 29850.0, None, 30012.0]


# ---------------------------------------------------------------------------------------------
# Finding folders


def test_downloaded_artifacts_nested_one_level(tmp_path):
    write_cell(tmp_path / "artifact-a" / "ada-2gpu-torch2.11.0-tf5.9.0")
    write_cell(tmp_path / "artifact-b", env=env_json(cell={"id": "h200-2gpu-torch2.11.0-tf5.18.0"}))
    (tmp_path / "unrelated" / "deeper").mkdir(parents=True)
    ids = [cell.id for cell in load_results([tmp_path]).cells]
    assert ids == ["ada-2gpu-torch2.11.0-tf5.9.0", "h200-2gpu-torch2.11.0-tf5.18.0"]


def test_the_golden_run_is_found_in_both_artifact_layouts():
    assert [cell.id for cell in load_results([RUN]).cells] == [
        "ada-2gpu-torch2.11.0-tf5.9.0", "cpu-2rank-torch2.13.0-tf5.24.0", "gb200-4gpu-torch2.12.0-tf5.24.0",
        "h200-2gpu-torch2.11.0-tf5.18.0", "h200-8gpu-torch2.11.0-tf5.18.0",
    ]


def test_a_folder_given_twice_is_read_once_and_a_cell_folder_directly(tmp_path):
    folder = write_cell(tmp_path / "cell")
    assert find_cell_folders(folder) == [folder]
    assert len(load_results([folder, tmp_path, str(folder)]).cells) == 1


def test_two_folders_for_one_cell_keep_both_rows_and_say_so(tmp_path):
    write_cell(tmp_path / "a")
    write_cell(tmp_path / "b")
    first, second = load_results([tmp_path]).cells
    assert first.id == second.id and not [p for p in first.problems if "also read" in p.message]
    assert any("also read from" in problem.message for problem in second.problems)


@pytest.mark.parametrize(("make", "message"), [
    (lambda root: root / "missing", "is not a folder"),
    (lambda root: root, "no cell folders under"),
])
def test_bad_results_paths_are_config_errors(tmp_path, make, message):
    with pytest.raises(ConfigError, match=message):
        load_results([make(tmp_path)])


def test_cells_sort_by_numbers_inside_their_ids():
    ids = ["h200-8gpu-torch2.11.0-tf5.9.0", "h200-2gpu-torch2.11.0-tf5.18.0", "h200-2gpu-torch2.9.0-tf5.9.0"]
    assert sorted(ids, key=natural_key) == [
        "h200-2gpu-torch2.9.0-tf5.9.0", "h200-2gpu-torch2.11.0-tf5.18.0", "h200-8gpu-torch2.11.0-tf5.9.0"]


# ---------------------------------------------------------------------------------------------
# Broken files: values, never exceptions

BROKEN_CELLS = [
    # (files, status, reason or problem that must appear)
    ({"junit": None}, "errored", "junit.xml: missing"),
    ({"junit": ""}, "errored", "junit.xml: empty"),
    ({"junit": JUNIT_OK[:90]}, "errored", "junit.xml: malformed or truncated XML"),
    ({"junit": "<html><body>502 Bad Gateway</body></html>"}, "errored", "junit.xml: not JUnit XML"),
    ({"junit": JUNIT_OK.replace('1.5"/>', 'soon"/>')}, "passed", "junit.xml: malformed attribute"),
    ({"junit": "\x00\x01binary"}, "errored", "junit.xml: malformed or truncated XML"),
    ({"env": json.dumps({"schema": 1, "status": "errored", "error": "environment: no torch==9.9 wheel"})},
     "errored", "environment: no torch==9.9 wheel"),
    ({"env": env_json(status="errored", error=None)}, "errored", "env.json says errored and gives no reason"),
    ({"env": env_json(status="failed", exit_code=2)}, "failed", "pytest exited with code 2"),
    ({"env": None}, "errored", "env.json: missing"),
    # a junit.xml that passed but no status: the run was cut short (harness writes one on every way out)
    ({"env": env_json(status=None)}, "errored", "env.json gives no status: the run did not finish"),
    ({"env": "{not json"}, "errored", "env.json: malformed JSON"),
    ({"env": "[1, 2]"}, "errored", "env.json: expected an object, found list"),
    ({"env": env_json(duration_s="ten")}, "passed", "key 'duration_s' is 'ten', expected a number"),
    ({"env": env_json(exit_code=True)}, "passed", "key 'exit_code' is True, expected an integer"),
    ({"env": env_json(status="mostly")}, "errored", "key 'status' is 'mostly', expected passed or failed or"),
    ({"env": env_json(schema=7)}, "passed", "env.json: schema 7, this reader knows 1"),
    ({"memory": '{"schema": 1, "available": true, "gpus": [{"index": 0, "peak_used_mib": "lots"}]}'},
     "passed", "memory.json: gpus[0]: key 'peak_used_mib' is 'lots', expected a number"),
    ({"memory": '{"schema": 1, "available": true, "gpus": ["GPU 0"]}'},
     "passed", "memory.json: gpus[0]: value is 'GPU 0', expected an object"),
]


@pytest.mark.parametrize(("files", "status", "text"), BROKEN_CELLS)
def test_broken_files_become_values(tmp_path, files, status, text):
    cell = read_cell(write_cell(tmp_path / "ada-2gpu-torch2.11.0-tf5.9.0", **files))
    assert cell.status.value == status
    told = [cell.reason or "", *map(str, cell.problems)]
    assert any(text in line for line in told), told


def test_without_env_json_a_cell_shows_its_id_and_nothing_parsed_from_it(tmp_path):
    """A cell id is built once (Cell.id) and never parsed: without env.json the folder's name is the id, and the
    cell's fields are unknown (what a report shows of such a cell is its id, its tests and why it errored)."""
    cell = read_cell(write_cell(tmp_path / "gb200-4gpu-torch2.12.0-tf5.24.0", env=None))
    info = cell.info
    assert info.id == "gb200-4gpu-torch2.12.0-tf5.24.0"
    assert (info.gpu, info.gpus, info.hosts, info.torch, info.transformers) == (None, None, None, None, None)
    assert cell.duration_s == 1.5  # from the testsuite's time
    assert cell.reproduce == "harness run --cell gb200-4gpu-torch2.12.0-tf5.24.0"


@pytest.mark.parametrize("matrix", ["cpu-4host", "cpu"])
def test_the_cell_fields_come_from_env_json_as_harness_run_writes_them(tmp_path, matrix):
    """Ids such as `cpu-slurm-4x2rank-...` (hosts x ranks) read as what Cell.to_json() recorded."""
    from harness.plan.matrix import load_matrix

    planned = load_matrix(matrix).cells[0]
    cell = read_cell(write_cell(tmp_path / planned.id, env=env_json(cell=planned.to_json())))
    assert (cell.id, cell.info.gpu, cell.info.gpus, cell.info.hosts, cell.info.torch, cell.info.transformers) == (
        planned.id, planned.gpu, planned.gpus, planned.hosts, planned.torch, planned.transformers)
    assert not [problem for problem in cell.problems if problem.file == "env.json"]


def test_memory_nulls_stay_unknown(tmp_path):
    memory = {"schema": 1, "available": True, "reason": None, "gpus": [
        {"index": 1, "total_mib": None, "used_before_mib": None, "peak_used_mib": 100.0},
        {"index": 0, "total_mib": 1000.0, "used_before_mib": 5.0, "peak_used_mib": None}]}
    cell = read_cell(write_cell(tmp_path / "c", memory=json.dumps(memory)))
    seen = [(gpu.index, gpu.peak_used_mib, gpu.total_mib) for gpu in cell.memory]
    assert seen == [(0, None, 1000.0), (1, 100.0, None)]
    assert cell.problems == ()


def test_collection_error_names_the_module_and_the_exception(tmp_path):
    junit = """<testsuites><testsuite name="pytest" time="0.1">
    <testcase classname="" name="tests.gpu.test_c" file="tests/gpu/test_c.py" time="0.0">
    <error message="collection failure">Traceback:
E   ModuleNotFoundError: No module named 'nonexistent'</error></testcase></testsuite></testsuites>"""
    (test,) = read_cell(write_cell(tmp_path / "c", junit=junit)).tests
    assert (test.test_id, test.outcome) == ("tests/gpu/test_c.py", Outcome.ERRORED)
    assert test.message == "collection failure: ModuleNotFoundError: No module named 'nonexistent'"


# ---------------------------------------------------------------------------------------------
# Reproduce commands


def cell_with(*tests: TestResult, reproduce: str = "harness run --matrix pr --cell 'c'",
              pytest_args: tuple[str, ...] | None = ()) -> CellResult:
    from harness.results import CellInfo

    return CellResult(info=CellInfo(id="c"), status=CellStatus.FAILED, tests=tests,
                      reproduce=reproduce, pytest_args=pytest_args)


def failed(name: str) -> TestResult:
    return TestResult(test_id=f"tests/gpu/test_x.py::{name}", name=name, outcome=Outcome.FAILED)


@pytest.mark.parametrize(("names", "expected"), [
    (["test_b[2-bf16]", "test_a"], "harness run --matrix pr --cell 'c' -- -k 'test_a or test_b[2-bf16]'"),
    (["test_p[a b]", "test_p[x=1]"], "harness run --matrix pr --cell 'c' -- -k test_p"),  # not -k idents
    ([f"test_{n}" for n in range(9)], "harness run --matrix pr --cell 'c'"),  # too many: the whole cell
])
def test_reproduce_selects_the_failing_tests(names, expected):
    assert cell_with(*map(failed, names)).reproduce_command() == expected
    # a folder written before env.json had pytest_args: its recorded command, the same way
    assert cell_with(*map(failed, names), pytest_args=None).reproduce_command() == expected


@pytest.mark.parametrize(("pytest_args", "expected"), [
    (("-k", "ep_gradients", "-x"), "-- -k '(ep_gradients) and (test_a or test_b)' -x"),
    (("-kep", "-x"), "-- '-k(ep) and (test_a or test_b)' -x"),
    (("-k", "a", "-k", "ep and not slow"), "-- -k a -k '(ep and not slow) and (test_a or test_b)'"),  # the last rules
    (("-x", "tests/gpu/test_ep.py"), "-- -x tests/gpu/test_ep.py -k 'test_a or test_b'"),
])
def test_reproduce_keeps_the_runs_own_arguments_and_adds_the_failing_tests_to_its_k(pytest_args, expected):
    cell = cell_with(failed("test_b"), failed("test_a"), pytest_args=pytest_args)
    assert cell.reproduce_command() == f"harness run --matrix pr --cell 'c' {expected}"
    assert cell.reproduce_command().count(" -- ") == 1


def test_reproduce_without_failures_or_with_too_many_is_the_runs_own_command():
    assert cell_with(pytest_args=("-k", "ep")).reproduce_command() == "harness run --matrix pr --cell 'c' -- -k ep"
    many = [failed(f"test_{n}") for n in range(9)]
    assert cell_with(*many, pytest_args=("-x",)).reproduce_command() == "harness run --matrix pr --cell 'c' -- -x"
    assert cell_with(pytest_args=()).reproduce_command() == "harness run --matrix pr --cell 'c'"


def test_pytest_args_are_read_from_env_json(tmp_path):
    cell = read_cell(write_cell(tmp_path / "c", env=env_json(pytest_args=["-k", "ep"])))
    assert cell.pytest_args == ("-k", "ep")
    assert not [problem for problem in cell.problems if "pytest_args" in str(problem)]
    assert read_cell(write_cell(tmp_path / "old", env=env_json())).pytest_args is None  # written before the field


@pytest.mark.parametrize("pytest_args", [
    "-k ep",  # a string, not a list
    ["-k", 7],
    ["-k", "`id`"],
    ["-k", "a\nb"],
    ["-x"] * 33,
    ["-k", "a" * 400],
])
def test_pytest_args_that_harness_would_not_write_fall_back_to_the_recorded_command(tmp_path, pytest_args):
    env = env_json(pytest_args=pytest_args, status="failed", exit_code=1)
    cell = read_cell(write_cell(tmp_path / "c", env=env, junit=JUNIT_OK))
    assert cell.pytest_args is None
    assert [problem for problem in cell.problems if "pytest_args" in str(problem)]
    assert cell.reproduce_command() == "harness run --matrix pr --cell ada-2gpu-torch2.11.0-tf5.9.0"


@pytest.mark.parametrize("recorded", ["rm -rf /", "harness run --cell `id`", "harness run\n--cell x", None])
def test_a_recorded_command_is_never_read_the_line_is_rebuilt(tmp_path, recorded):
    """An older folder's `reproduce` string is ignored; the line comes from the cell's checked id and matrix
    (test_hostile_approval.py plays the rest)."""
    cell = read_cell(write_cell(tmp_path / "c", env=env_json(reproduce=recorded, cell={"id": "x", "matrix": "pr"})))
    assert cell.reproduce == "harness run --matrix pr --cell x"
    env = env_json(reproduce=recorded, cell={"id": "x'; rm -rf ~", "matrix": "pr"})
    hostile = read_cell(write_cell(tmp_path / "d", env=env))
    assert hostile.reproduce == "" and [problem for problem in hostile.problems if "cell id" in str(problem)]


# ---------------------------------------------------------------------------------------------
# Digest and comparison


def test_digest_round_trips_through_comment_text():
    results = load_results([RUN])
    summary = digest(results)
    payload = encode_digest(summary, 10_000)
    text = f"<!-- harness-report -->\nquoted: <!-- {DIGEST_TAG} AAAA -->\n<!-- {DIGEST_TAG} {payload} -->"
    assert decode_digest(text) == summary  # the last digest counts: a test's message may quote a fake
    assert summary.git_sha == "4f1c2a9e7d3b8a6c5e0f1d2c3b4a59687766aabb" and summary.matrix == "nightly"


def test_a_small_budget_drops_skipped_ids_then_failing_ids():
    summary = digest(load_results([RUN]))
    sizes = {"full": len(encode_digest(summary, 10**6))}
    without_skips = decode_digest(f"{DIGEST_TAG} {encode_digest(summary, sizes['full'] - 1)}")
    assert all(cell.skipped is None and cell.failing is not None for cell in without_skips.cells.values())
    bare = decode_digest(f"{DIGEST_TAG} {encode_digest(summary, 400)}")
    assert all(cell.failing is None for cell in bare.cells.values())
    assert bare.complete
    assert bare.cells["ada-2gpu-torch2.11.0-tf5.9.0"].peak_used_mib == (12595.0, 12390.0)


def test_a_tiny_budget_keeps_the_first_cells_and_says_it_is_partial():
    results = load_results([RUN])
    partial = decode_digest(f"{DIGEST_TAG} {encode_digest(digest(results), 300)}")
    assert not partial.complete and 0 < len(partial.cells) < len(results.cells)
    # Cells the partial digest does not hold are not "new": it cannot tell.
    assert {change.cell_id for change in compare(results, partial).cells} <= set(partial.cells)


@pytest.mark.parametrize(("text", "message"), [
    ("no digest here", "no '<!-- harness-digest v1"),
    (f"{DIGEST_TAG} AAAA", "the digest is unreadable"),
    (f"{DIGEST_TAG} eJyrVkrLz1eyUkpKLFKqBQAdegQ0", "the digest is unreadable"),  # JSON without cells
])
def test_unreadable_digests_say_why(text, message):
    with pytest.raises(ValueError, match=message):
        decode_digest(text)


def test_the_night_before_is_a_cell_of_the_same_gpus_and_hosts():
    """transformers floated: tonight's cell of 2 hosts x 8 GPUs is compared with last night's of 2 x 8, not with
    the one-host cell of 8 that ran the same torch."""
    from harness.results import CellInfo
    from harness.results.compare import night_before

    def cell(cell_id: str, hosts: int | None, transformers: str) -> CellResult:
        info = CellInfo(id=cell_id, gpu="h200", gpus=8, hosts=hosts, torch="2.13.0", transformers=transformers)
        return CellResult(info=info, status=CellStatus.PASSED)

    one_host, two_hosts = cell("h200-8gpu-a", None, "5.19.0"), cell("h200-2x8gpu-a", 2, "5.19.0")
    assert night_before(cell("h200-2x8gpu-b", 2, "5.20.0"), ResultSet((one_host, two_hosts))) is two_hosts
    assert night_before(cell("h200-8gpu-b", 1, "5.20.0"), ResultSet((one_host, two_hosts))) is one_host


def test_comparison_with_the_night_before():
    comparison = compare(load_results([RUN]), load_baseline(BASELINE))
    changes = {change.cell_id: change for change in comparison.cells}
    assert comparison.baseline_sha == "0a9b8c7d6e5f40312233445566778899aabbccdd"
    ada = changes["ada-2gpu-torch2.11.0-tf5.9.0"]
    assert [test_id.split("::")[1].split("[pipe")[0] for test_id in ada.new_failures] == [
        "test_ep_gradients[2-bf16]", "test_ep_logits", "test_ep_routing", "test_fsdp_nvfp4", "test_hostile_names"]
    assert ada.fixed == ("tests/gpu/test_fsdp.py::test_fsdp_fp8",)
    assert [(m.gpu_index, m.before_mib, m.after_mib) for m in ada.memory] == [(0, 11059.0, 12595.3)]
    cpu = changes["cpu-2rank-torch2.13.0-tf5.24.0"]
    assert cpu.newly_skipped == ("tests/gpu/test_fsdp.py::test_fsdp_nvfp4",)
    crashed = changes["h200-8gpu-torch2.11.0-tf5.18.0"]
    assert (crashed.status_before, crashed.status_after, crashed.new_failures) == (
        CellStatus.PASSED, CellStatus.ERRORED, ())
    assert ada.tests_compared and not crashed.tests_compared  # the crashed cell has no tests to compare
    assert changes["gb200-4gpu-torch2.12.0-tf5.24.0"].status_before is None  # a new cell
    assert changes["ada-2gpu-torch2.11.0-tf5.18.0"].status_after is None  # gone from this run
    assert "h200-2gpu-torch2.11.0-tf5.18.0" not in changes  # 80 MiB more is under the threshold


def test_memory_threshold_needs_both_mib_and_share():
    results = load_results([RUN])
    base = digest(results)
    ada_id = "ada-2gpu-torch2.11.0-tf5.9.0"
    for before, reported in ((12595.3 - 300, True), (12595.3 - 200, False)):
        cells = {**base.cells, ada_id: replace(base.cells[ada_id], peak_used_mib=(before, 12390.1))}
        changes = compare(results, replace(base, cells=cells), memory_change_fraction=0.02).cells
        assert bool(changes and changes[0].memory) is reported


def test_a_shortened_baseline_says_what_it_could_not_compare():
    results = load_results([RUN])
    shortened = decode_digest(f"{DIGEST_TAG} {encode_digest(digest(results), 400)}")
    changes = compare(results, shortened).cells
    assert changes and all(change.incomplete == ("failing tests", "skipped tests") for change in changes)


def test_unchanged_runs_compare_empty():
    results = load_results([BASELINE])
    assert compare(results, digest(results)).cells == ()


@pytest.mark.parametrize(("write", "error", "message"), [
    # A comment without a readable digest is a warning for the caller, never the end of the report.
    (lambda path: path.write_text("a comment without digest"), BaselineUnreadable, "no '<!-- harness-digest"),
    (lambda path: None, ConfigError, "No such file"),
])
def test_bad_baselines_say_why(tmp_path, write, error, message):
    path = tmp_path / "comment.md"
    write(path)
    with pytest.raises(error, match=message):
        load_baseline(path)


def test_baseline_folder_and_result_set_agree(tmp_path):
    shutil.copytree(BASELINE, tmp_path / "baseline")
    from_folder = load_baseline(tmp_path / "baseline")
    assert from_folder == digest(load_results([BASELINE]))
    assert isinstance(load_results([BASELINE]), ResultSet)


@pytest.mark.parametrize("enabled_before", [True, False])
def test_paused_gc_restores_the_collector_even_on_errors(enabled_before):
    gc.enable() if enabled_before else gc.disable()
    try:
        with pytest.raises(RuntimeError), paused_gc():
            assert not gc.isenabled()
            raise RuntimeError("boom")
        assert gc.isenabled() is enabled_before
    finally:
        gc.enable()


def test_what_the_memory_monitor_writes_the_reader_reads_back(tmp_path):
    """memory.json has one shape, contract.MemoryGpuRecord: the monitor writes it, the reader reads it."""
    from harness import contract
    from harness.cell import memory

    gpu = memory.GpuIdentity(index=3, uuid="GPU-1234", name="NVIDIA H200")
    samples = memory.GpuSamples(gpu=gpu, total_mib=143771.0, used_before_mib=512.0, peak_used_mib=40960.5,
                                interval_s=0.05, sample_count=120)
    folder = write_cell(tmp_path / "h200-2gpu-torch2.11.0-tf5.18.0")
    report = memory.MemoryReport(available=True, reason=None, interval_s=0.05, sample_count=120, gpus=(samples,))
    memory.write_memory_json(folder / contract.MEMORY_JSON, report)
    assert set(report.to_json()["gpus"][0]) == set(contract.MEMORY_GPU_FIELDS)
    [read] = read_cell(folder).memory
    assert (read.index, read.name, read.uuid, read.total_mib, read.used_before_mib, read.peak_used_mib) == (
        3, "NVIDIA H200", "GPU-1234", 143771.0, 512.0, 40960.5)
    assert not read_cell(folder).problems
