"""The bisect search and its verdicts, over tables of versions whose answers the test knows."""

from __future__ import annotations

import math
import re

import pytest
from bisect_helpers import GRAD, HALF, RELEASES, regression_from, table_probe

from harness.bisect.command import bisect_releases, parse_side, split_test_ids
from harness.bisect.search import BisectResult, Probe, RunOutcome, Verdict, bisect, verdict_of
from harness.errors import ConfigError


def test_a_regression_names_the_first_bad_release_and_its_failure():
    calls: list[str] = []
    result = bisect(
        "transformers", RELEASES, good="5.19.0", bad="5.23.0", probe=table_probe(regression_from("5.20.0"), calls)
    )
    assert result.line() == f"first bad: transformers 5.20.0 (last good 5.19.0) · {GRAD} · {HALF}"
    assert result.exit_code == 0 and result.kind == "regression"
    assert calls[:2] == ["5.19.0", "5.23.0"]  # the ends are checked before the search trusts them
    assert len(calls) <= math.ceil(math.log2(len(RELEASES))) + 2


def test_an_older_bad_and_newer_good_find_the_first_good_release():
    verdicts = {v: Verdict.FAIL if v < "5.23.0" else Verdict.PASS for v in RELEASES}
    result = bisect("transformers", RELEASES[1:], good="5.23.0", bad="5.20.0", probe=table_probe(verdicts))
    assert result.kind == "fix"
    # A fix names the failure of the last bad release: what stopped failing.
    assert result.line() == f"first good: transformers 5.23.0 (last bad 5.22.2) · {GRAD} · {HALF}"


@pytest.mark.parametrize("count", range(2, 34))
def test_every_boundary_is_found_within_the_budget(count):
    versions = [f"1.{i}.0" for i in range(count)]
    budget = math.ceil(math.log2(count)) + 2
    for first_bad in versions[1:]:
        calls: list[str] = []
        result = bisect(
            "pkg",
            versions,
            good=versions[0],
            bad=versions[-1],
            probe=table_probe(regression_from(first_bad, versions), calls),
        )
        assert (result.first, len(calls) <= budget, len(set(calls)) == len(calls)) == (first_bad, True, True)


def test_an_untestable_bad_end_is_skipped_over_inward_and_said():
    verdicts = {"5.19.0": Verdict.UNTESTABLE, **{v: Verdict.FAIL for v in RELEASES[1:-1]}, "5.23.0": Verdict.PASS}
    calls: list[str] = []
    result = bisect("transformers", RELEASES, good="5.23.0", bad="5.19.0", probe=table_probe(verdicts, calls))
    assert result.first == "5.23.0" and result.last == "5.22.2"
    untestable = [p for p in result.probes if p.verdict is Verdict.UNTESTABLE]
    assert [p.label for p in untestable] == ["transformers 5.19.0"]
    assert "untestable" in untestable[0].line() and "needs transformers>=5.20.0" in untestable[0].line()
    assert len(calls) <= math.ceil(math.log2(len(RELEASES))) + 2


def test_untestable_versions_inside_the_range_are_skipped_over():
    verdicts = regression_from("5.22.0")
    verdicts["5.21.0"] = Verdict.UNTESTABLE  # the first middle probed
    calls: list[str] = []
    result = bisect("transformers", RELEASES, good="5.19.0", bad="5.23.0", probe=table_probe(verdicts, calls))
    assert (result.first, result.last, result.exit_code) == ("5.22.0", "5.21.1", 0)
    assert "5.21.0" in calls


def test_untestable_versions_that_hide_the_boundary_end_without_one():
    verdicts = regression_from("5.21.1")
    verdicts["5.21.0"] = verdicts["5.20.2"] = Verdict.UNTESTABLE
    verdicts["5.20.1"] = Verdict.PASS
    result = bisect("transformers", RELEASES, good="5.19.0", bad="5.23.0", probe=table_probe(verdicts))
    assert result.exit_code == 1 and not result.found
    assert result.line() == (
        "no boundary: the change lies between transformers 5.20.1 and 5.21.1, and 5.20.2, 5.21.0 cannot be tested"
    )


def test_a_flaky_version_stops_the_search():
    verdicts = regression_from("5.21.0")
    verdicts["5.21.0"] = Verdict.FLAKY
    result = bisect("transformers", RELEASES, good="5.19.0", bad="5.23.0", probe=table_probe(verdicts))
    assert result.exit_code == 1
    assert result.line().startswith("no boundary: transformers 5.21.0 is flaky")


def test_a_flaky_end_stops_before_searching():
    verdicts = regression_from("5.21.0")
    verdicts["5.23.0"] = Verdict.FLAKY
    calls: list[str] = []
    result = bisect("transformers", RELEASES, good="5.19.0", bad="5.23.0", probe=table_probe(verdicts, calls))
    assert result.exit_code == 1 and calls == ["5.19.0", "5.23.0"]


@pytest.mark.parametrize(
    ("verdicts", "expected"),
    [
        (
            {v: Verdict.PASS for v in RELEASES},
            "good and bad give the same verdict: transformers 5.19.0 and transformers 5.23.0 both pass",
        ),
        # The good end runs first: failing there as a whole, the selection costs one probe.
        ({v: Verdict.FAIL for v in RELEASES}, "the good end fails: every selected test that ran fails at "
                                              "transformers 5.19.0"),
        (
            {**{v: Verdict.FAIL for v in RELEASES}, "5.23.0": Verdict.PASS},
            "or swap --good and --bad if they are the wrong way round",
        ),
        ({v: Verdict.UNTESTABLE for v in RELEASES}, "no version from it towards the other end can run the selection"),
    ],
)
def test_ends_that_do_not_disagree_as_claimed_are_bad_input(verdicts, expected):
    with pytest.raises(ConfigError, match=expected.replace("[", r"\[").replace("+", r"\+")) as raised:
        bisect("transformers", RELEASES, good="5.19.0", bad="5.23.0", probe=table_probe(verdicts))
    assert raised.value.return_code == 2


def test_an_untestable_good_end_never_walks_into_the_bad_end():
    verdicts = {**{v: Verdict.UNTESTABLE for v in RELEASES}, "5.23.0": Verdict.FAIL}
    calls: list[str] = []
    with pytest.raises(ConfigError, match=r"--good 5\.19\.0: no version from it towards the other end"):
        bisect("transformers", RELEASES, good="5.19.0", bad="5.23.0", probe=table_probe(verdicts, calls))
    assert "5.23.0" not in calls


def test_nothing_selected_is_bad_input():
    def probe(version):
        return Probe(
            versions={"transformers": version},
            label=f"transformers {version}",
            verdict=Verdict.UNTESTABLE,
            nothing_selected=True,
            note="nothing selected",
        )

    with pytest.raises(ConfigError, match=r"nothing selected: pytest collected no tests on transformers 5\.19\.0"):
        bisect("transformers", RELEASES, good="5.19.0", bad="5.23.0", probe=probe)


# --------------------------------------------------------------------------- verdicts


def run(outcomes, **fields) -> RunOutcome:
    return RunOutcome(outcomes=outcomes, **fields)


@pytest.mark.parametrize(
    ("runs", "verdict", "note"),
    [
        ([run({"a": "passed", "b": "skipped"})], Verdict.PASS, "1 passed"),
        ([run({"a": "passed", "b": "failed"}, failure=("b", "boom"))], Verdict.FAIL, "b · boom"),
        (
            [run({}, error="pytest crashed: killed by signal SIGKILL")],
            Verdict.FAIL,
            "pytest crashed: killed by signal SIGKILL",
        ),
        (
            [run({"a": "skipped", "b": "skipped"}, skip_reason="needs transformers>=5.20.0")],
            Verdict.UNTESTABLE,
            "all 2 selected tests skipped: needs transformers>=5.20.0",
        ),
        (
            [run({}, install_error="No matching distribution found for transformers==9.9.9")],
            Verdict.UNTESTABLE,
            "cannot install: No matching distribution found for transformers==9.9.9",
        ),
        ([run({}, nothing_selected=True)], Verdict.UNTESTABLE, "nothing selected: pytest collected no tests"),
        ([run({"a": "flaky"})], Verdict.FLAKY, "a failed, then passed on a rerun"),
        (
            [run({"a": "passed"}), run({"a": "passed"}), run({"a": "failed"}, failure=("a", "x"))],
            Verdict.FLAKY,
            "a: passed in run 1, failed in run 3",
        ),
        ([run({"a": "passed"}), run({"a": "passed"})], Verdict.PASS, "1 passed"),
        ([run({"a": "failed"}, failure=("a", "x")), run({"a": "failed"}, failure=("a", "x"))], Verdict.FAIL, "a · x"),
    ],
)
def test_verdict_of_runs(runs, verdict, note):
    assert verdict_of(runs)[:2] == (verdict, note)


# --------------------------------------------------------------------------- both packages differ


class FakeCell:
    torch = "2.13.0"
    transformers = "5.24.0"


def pair_prober(broken):
    """A prober whose verdict is fail exactly where `broken(versions)` says."""
    calls = []

    def prober(versions, label):
        calls.append(dict(versions))
        failing = broken(versions)
        return Probe(
            versions=dict(versions),
            label=label,
            verdict=Verdict.FAIL if failing else Verdict.PASS,
            failure=(GRAD, HALF) if failing else None,
        )

    return prober, calls


def fake_between(package, first, second, pre):
    known = {"torch": ["2.11.0", "2.12.0", "2.13.0"], "transformers": RELEASES}[package]
    for value in (first, second):
        if value not in known:
            raise ConfigError(f"{package} {value}: no such release on the package index")
    low, high = sorted((known.index(first), known.index(second)))
    return known[low : high + 1]


@pytest.mark.parametrize(
    ("broken", "package", "first"),
    [
        (lambda v: v["transformers"] >= "5.21.0", "transformers", "5.21.0"),
        (lambda v: v["torch"] >= "2.12.0", "torch", "2.12.0"),
    ],
)
def test_with_both_packages_different_one_swap_names_the_upstream(broken, package, first, capsys):
    prober, calls = pair_prober(broken)
    result = bisect_releases(
        FakeCell(),
        prober,
        parse_side("torch=2.11.0,transformers=5.19.0", None, "--good"),
        parse_side("torch=2.13.0,transformers=5.23.0", None, "--bad"),
        pre=False,
        shape="cpu-2rank",
        between=fake_between,
        emit=lambda probe: None,
    )
    assert isinstance(result, BisectResult)
    assert (result.package, result.first, result.exit_code) == (package, first, 0)
    assert calls[2] == {"torch": "2.13.0", "transformers": "5.19.0"}  # the swap: torch moved alone
    assert f"{package} is the upstream that changes it" in capsys.readouterr().out
    assert len({tuple(sorted(c.items())) for c in calls}) == len(calls)  # no version pair probed twice


def test_an_unknown_version_is_bad_input_before_anything_runs():
    prober, calls = pair_prober(lambda v: False)
    with pytest.raises(ConfigError, match=r"transformers 5\.99\.0: no such release"):
        bisect_releases(
            FakeCell(),
            prober,
            {"transformers": "5.19.0"},
            {"transformers": "5.99.0"},
            pre=False,
            shape="cpu-2rank",
            between=fake_between,
            emit=lambda probe: None,
        )
    assert calls == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5.20.0", {"transformers": "5.20.0"}),
        ("torch=2.11.0,transformers=5.19.0", {"torch": "2.11.0", "transformers": "5.19.0"}),
        ("torch==2.11.0", {"torch": "2.11.0"}),
    ],
)
def test_parse_side(text, expected):
    assert parse_side(text, "transformers", "--good") == expected


@pytest.mark.parametrize("text", ["numpy=1.0", "torch=", "torch=1,accelerate=2"])
def test_parse_side_refuses_other_packages(text):
    with pytest.raises(ConfigError, match="expected PACKAGE=VERSION pairs of torch, transformers"):
        parse_side(text, None, "--good")


@pytest.mark.parametrize(
    ("arguments", "ids", "rest"),
    [
        (["-k", "test_fsdp_ep_moe"], [], ["-k", "test_fsdp_ep_moe"]),
        (
            ["tests/gpu/test_fsdp2.py::test_fsdp_ep_moe[2-float32]", "-x", "tests/gpu/test_x.py"],
            ["tests/gpu/test_fsdp2.py::test_fsdp_ep_moe[2-float32]", "tests/gpu/test_x.py"],
            ["-x"],
        ),
        (["-k", "a::b", "--deselect", "t.py::c"], [], ["-k", "a::b", "--deselect", "t.py::c"]),
    ],
)
def test_test_ids_become_the_suite(arguments, ids, rest):
    assert split_test_ids(arguments) == (ids, rest)


# --------------------------------------------------------------------------- per-test verdicts

KNOWN = "test_ep_logits[gpt_oss-eager-2-float32]"  # a known upstream bug: fails at both ends with --runxfail
NEW = "test_fsdp_ep_moe[2-float32]"  # the regression
GREEN = "test_ep_gradients[qwen3_moe-eager-2-float32]"


def per_test_probe(first_bad: str, calls: list[str], known_everywhere: bool = True):
    """Three tests: KNOWN fails everywhere, NEW from `first_bad` on, GREEN never; whole-selection
    verdicts would call every version a failure."""

    def probe(version: str) -> Probe:
        calls.append(version)
        outcomes = {KNOWN: "failed" if known_everywhere else "passed", GREEN: "passed",
                    NEW: "failed" if RELEASES.index(version) >= RELEASES.index(first_bad) else "passed"}
        failing = sorted(test for test, outcome in outcomes.items() if outcome == "failed")
        return Probe(versions={"transformers": version}, label=f"transformers {version}",
                     verdict=Verdict.FAIL if failing else Verdict.PASS, outcomes=outcomes,
                     failure=(failing[0], "first line") if failing else None)

    return probe


def test_a_test_failing_at_both_ends_is_set_aside_and_the_others_bisected():
    calls: list[str] = []
    result = bisect("transformers", RELEASES, good="5.19.0", bad="5.23.0", probe=per_test_probe("5.21.0", calls))
    assert (result.first, result.last, result.test) == ("5.21.0", "5.20.2", NEW)
    assert result.set_aside == (KNOWN,)
    assert result.set_aside_line() == f"set aside, failing at both ends: {KNOWN}"
    assert calls[0] == "5.19.0"  # the good end first
    assert result.record(1.0, cell="c").to_json()["set_aside"] == [KNOWN]


def test_a_selection_that_fails_whole_at_the_good_end_costs_one_probe():
    calls: list[str] = []

    def all_failing(version: str) -> Probe:
        calls.append(version)
        return Probe(versions={"transformers": version}, label=f"transformers {version}", verdict=Verdict.FAIL,
                     outcomes={KNOWN: "failed", "test_skipped": "skipped"}, failure=(KNOWN, "first line"))

    expected = f"every selected test that ran fails at transformers 5.19.0 ({KNOWN})"
    with pytest.raises(ConfigError, match=re.escape(expected)):
        bisect("transformers", RELEASES, good="5.19.0", bad="5.23.0", probe=all_failing)
    assert calls == ["5.19.0"]


def test_when_the_bad_end_fails_only_where_the_good_end_does_nothing_is_searched():
    calls: list[str] = []

    def same_failures(version: str) -> Probe:
        calls.append(version)
        return Probe(versions={"transformers": version}, label=f"transformers {version}", verdict=Verdict.FAIL,
                     outcomes={KNOWN: "failed", GREEN: "passed"}, failure=(KNOWN, "first line"))

    with pytest.raises(ConfigError, match=re.escape(f"fails at transformers 5.19.0 too ({KNOWN}): nothing changed")):
        bisect("transformers", RELEASES, good="5.19.0", bad="5.23.0", probe=same_failures)
    assert calls == ["5.19.0", "5.23.0"]


def test_once_the_ends_have_run_later_probes_run_only_the_tests_the_search_follows():
    calls: list[str] = []
    narrowed: list[tuple[str, ...]] = []

    def narrow(tests):
        narrowed.append(tuple(tests))
        assert len(calls) == 2  # after both ends, before the search

    bisect("transformers", RELEASES, good="5.19.0", bad="5.23.0", probe=per_test_probe("5.21.0", calls),
           narrow=narrow)
    assert narrowed == [(NEW,)]


def test_the_cell_prober_runs_only_the_narrowed_tests(monkeypatch, tmp_path):
    from harness.bisect import probes
    from harness.plan.cells import Cell

    ran = []

    def run_cell(cell, **kwargs):
        ran.append(cell.suite)
        raise StopIteration  # what it ran is all this test needs

    monkeypatch.setattr(probes.run, "run_cell", run_cell)
    cell = Cell(gpu="cpu", gpus=2, torch="2.13.0", transformers="5.24.0", matrix="m", labels=(),
                timeout_minutes=5, reruns=0, suite=("tests/gpu",))
    prober = probes.CellProber(cell=cell, host=None, results_root=tmp_path, env_dir=tmp_path, pytest_args=[],
                               project=tmp_path)
    for narrowed in ((), (f"tests/gpu/test_fsdp2.py::{NEW}",)):
        if narrowed:
            prober.narrow(narrowed)
        with pytest.raises(StopIteration):
            prober({"transformers": "5.20.0"}, "transformers 5.20.0", built=lambda cell: False)
    assert ran == [("tests/gpu",), (f"tests/gpu/test_fsdp2.py::{NEW}",)]
