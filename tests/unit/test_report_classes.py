"""The release view in every rendering: each case in exactly one class (new red, known and still present, fixed
upstream, not built, not run, passed), listed apart and never mixed, from results folders written to disk; a cell
whose only failures are fixed upstream is not red; a not-built reason is untrusted text."""

from __future__ import annotations

import re

import pytest
from markup_helpers import TagCollector, without_code_spans, without_fences
from report_helpers import case_xml, cell, make_test
from triage_helpers import write_cell

from harness.report.model import build_report
from harness.report.render import render
from harness.results import CellStatus, Outcome, ResultSet, SuiteInfo, load_results

FORMATS = ("terminal", "pr-comment", "summary", "html")
CELL = "h200-2gpu-torch2.13.0-tf5.25.0"
XPASS = "[XPASS(strict)] fixed upstream: close the range in tests/gpu/upstream/known_bugs.py"


def flat(text: str) -> str:
    """The text with every run of white space one space: the terminal wraps long lines."""
    return " ".join(text.split())


def only_fixed_upstream(tmp_path):
    """A cell as `harness run` leaves it when a covered case passed: pytest failed its strict XPASS, so env.json says
    failed."""
    write_cell(tmp_path, "2.13.0", "5.25.0", [
        case_xml("test_ep_load[2]", "passed", world_size="2", family="mixtral"),
        case_xml("test_ep_gradients[2]", "failed", XPASS, world_size="2", family="mixtral",
                 known_bug_fixed="mixtral-half-gradients"),
    ], status="failed")
    return load_results([tmp_path])


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_run_whose_only_failure_is_fixed_upstream_is_not_red(tmp_path, fmt):
    results = only_fixed_upstream(tmp_path)
    assert results.cells[0].status is CellStatus.FAILED  # env.json's status is kept; the view decides
    text = render(results, fmt)
    assert "the only cell passed" in text and "failed" not in text.split("\n", 2)[1 if fmt == "pr-comment" else 0]
    assert "mixtral-half-gradients" in text and "close the range" in flat(text)
    assert "New reds" not in text and "new reds:" not in text
    assert "Reproduce" not in text and "reproduce:" not in text  # nothing red to reproduce
    expected = {
        "terminal": f"PASSED  {CELL}",
        "pr-comment": "| ✅ | h200 | 2 | 2.13.0 | 5.25.0 | 1 | 0 + 1 fixed upstream |",
        "summary": "✅ **the only cell passed**",
        "html": '<tr class="passed"><td title="passed">✓',
    }[fmt]
    assert expected in text
    assert "❌" not in text and "FAILED" not in text and 'class="failed"' not in text


def test_a_run_whose_only_failure_is_fixed_upstream_reads_green_in_colour(tmp_path):
    painted = render(only_fixed_upstream(tmp_path), "terminal", color=True)
    assert "\nharness: \x1b[32mthe only cell passed" in painted and "\x1b[32mPASSED " in painted


def one_of_each_class(tmp_path):
    """Two cells: a new red, a case a known-bugs entry explains, one it covers that passed, two not built for one
    reason (one in each cell), one not run, a plain xfail and passed ones."""
    not_built = "the config class refuses n_group=3 for 8 experts"
    write_cell(tmp_path, "2.13.0", "5.25.0", [
        case_xml("test_ep_load[2]", "passed", world_size="2", family="mixtral"),
        case_xml("test_ep_routing[2]", "failed", "routing differs: layer 1", world_size="2", family="mixtral"),
        case_xml("test_ep_known[2]", "xfailed", "known upstream bug: eager drops the bias",
                 known_bug="qwen3-eager-bias"),
        case_xml("test_ep_fixed[2]", "failed", XPASS, known_bug_fixed="mixtral-half-gradients"),
        case_xml("test_ep_deepseek[2]", "skipped", f"not built: {not_built}", not_built=not_built,
                 family="deepseek_v3"),
        case_xml("test_ep_load[4]", "skipped", "needs 4 GPUs", needs_world_size="4", host_ranks="2",
                 host_rank_unit="GPUs"),
        case_xml("test_fp8", "xfailed", "fp8 is not implemented for gloo"),
    ])
    write_cell(tmp_path, "2.13.0", "5.24.0", [
        case_xml("test_ep_load[2]", "passed", world_size="2", family="mixtral"),
        case_xml("test_ep_deepseek[2]", "skipped", f"not built: {not_built}", not_built=not_built),
    ], status="passed")
    return load_results([tmp_path])


def plain(text: str) -> str:
    """The words a reader sees: white space flattened, without code spans' backticks, <code> tags and Markdown's
    backslash escapes."""
    return flat(re.sub(r"</?code>|`|\\(?=\S)", "", text))


NOT_BUILT_ROW = {
    "terminal": "2 the config class refuses n_group=3 for 8 experts",
    "pr-comment": "| the config class refuses n_group=3 for 8 experts | 2 | 2 |",
    "summary": "| the config class refuses n_group=3 for 8 experts | 2 | 2 |",
    "html": '<td>the config class refuses n_group=3 for 8 experts</td><td class="n">2</td>',
}


# A terminal lists the known cases by entry (its last lines are what stays in view); the other views list each case.
KNOWN_ROW = {"terminal": "known, still present: 1 case by known-bugs entry (each case in the HTML report): "
                         "1 entry qwen3-eager-bias"}


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_view_lists_each_class_apart_with_what_names_it(tmp_path, fmt):
    text = plain(render(one_of_each_class(tmp_path), fmt))
    assert ("9 cases: 1 new red · 1 known, still present · 1 fixed upstream · 2 not built · 1 not run · 3 passed"
            in text)
    assert KNOWN_ROW.get(fmt, f"test_ep_known[2] in {CELL}: known-bugs entry qwen3-eager-bias, seen on "
                                  "transformers 5.25.0, torch 2.13.0") in text
    assert (f"test_ep_fixed[2] in {CELL}: known-bugs entry mixtral-half-gradients, passed on transformers 5.25.0, "
            "torch 2.13.0") in text
    assert "close the range" in text and NOT_BUILT_ROW[fmt] in text
    # The new red is the only red listed: the known, fixed and not-built cases are no failure.
    failures = text.split("ew reds", 1)[1].split("nown, still present", 1)[0]
    assert "test_ep_routing" in failures
    assert not {"test_ep_known", "test_ep_fixed", "test_ep_deepseek"} & set(re.findall(r"test_ep_[a-z]+", failures))


def test_the_classes_are_gathered_once_in_the_view_model(tmp_path):
    report = build_report(one_of_each_class(tmp_path))
    assert [group.test_id.rsplit("::", 1)[1] for group in report.failures] == ["test_ep_routing[2]"]
    assert [(case.keys, case.transformers, case.torch) for case in report.known_present] == [
        (("qwen3-eager-bias",), "5.25.0", "2.13.0")]
    assert [case.keys for case in report.fixed_upstream] == [("mixtral-half-gradients",)]
    assert [(group.reason, group.tests, len(group.cells)) for group in report.not_built_reasons] == [
        ("the config class refuses n_group=3 for 8 experts", 2, 2)]
    assert [(group.reason, group.tests) for group in report.not_run_reasons] == [("needs 4 GPUs", 1)]
    assert [case.reason for case in report.xfailed] == ["fp8 is not implemented for gloo"]  # a plain xfail: passed


HOSTILE = ("<script>alert(1)</script>\n| a | b |\n@octocat [l](javascript:x) ```\x1b[31m\u202eevil "
           + "not built " * 300)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_hostile_not_built_reason_is_bounded_and_adds_no_markup(fmt):
    tests = (make_test(0, world_size=2, family="mixtral"), make_test(1, Outcome.SKIPPED, message="not built: x",
                                                                     not_built=HOSTILE))
    text = render(ResultSet((cell("h200-2gpu", *tests),)), fmt)
    shown = {"terminal": "<script>alert(1)</script> | a | b | @octocat",
             "html": "&lt;script&gt;alert(1)&lt;/script&gt; | a",
             "pr-comment": r"\<script\>alert(1)\</script\> \| a \| b \|",
             "summary": r"\<script\>alert(1)\</script\>"}
    assert shown[fmt] in flat(text)  # listed as a not-built reason, as text
    assert "\x1b" not in text and "\u202e" not in text
    assert "not built " * 60 not in text  # at most contract.NOT_BUILT_CHARS of it, and a line's worth shown
    if fmt == "html":
        parser = TagCollector()
        parser.feed(text)
        assert "script" not in parser.tags and parser.urls == []
    elif fmt != "terminal":
        prose = without_code_spans(without_fences(text))
        assert not re.search(r"(?<!\\)<script", prose) and "@octocat" not in prose.replace("@&#8203;octocat", "")
        assert not re.search(r"(?<!\\)\[l(?<!\\)\]\(javascript", prose)
        rows = [line for line in prose.splitlines() if line.startswith("|") and "not built" in line]
        assert len(rows) == 1 and len(re.findall(r"(?<!\\)\|", rows[0])) == 4  # one row of three cells
    else:
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", text)


def test_coverage_counts_no_family_whose_cases_were_not_built():
    """A not-built case is a skip: it covers nothing, and a family none of whose cases ran says why."""
    suite = SuiteInfo(ep_families_declared=("mixtral", "deepseek_v3", "gpt_oss"),
                      ep_families_covered=("mixtral", "deepseek_v3", "gpt_oss"))
    not_built = make_test(1, Outcome.SKIPPED, message="not built: x", not_built="no router registry entry",
                          family="deepseek_v3", world_size=2)
    also_ran = make_test(3, Outcome.SKIPPED, message="not built: y", not_built="no layout", family="gpt_oss")
    tests = (make_test(0, world_size=2, family="mixtral"), not_built, also_ran,
             make_test(4, world_size=2, family="gpt_oss"))
    [coverage] = build_report(ResultSet((cell("c", *tests, suite=suite),))).coverage
    assert coverage.covered == ("mixtral", "gpt_oss")
    assert coverage.missing == (("deepseek_v3", "not built: no router registry entry"),)
    text = render(ResultSet((cell("c", *tests, suite=suite),)), "pr-comment")
    assert "EP families covered: 2 of 3" in text and "`deepseek_v3`: not built: no router registry entry" in text
