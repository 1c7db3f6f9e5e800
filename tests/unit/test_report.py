"""harness.report.render: golden renderings of real pytest output, escaping of everything a test writes,
the comment size limit, and the `harness report` command."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from pathlib import Path

import pytest
from markup_helpers import TagCollector, without_code_spans, without_fences
from report_helpers import cell, make_test, not_run_test, ran_test

from harness.cli import main
from harness.contract import COMMENT_LIMIT, COMMENT_MARKER
from harness.report import render as report
from harness.report.filters import code_span, fence_for, html_text, markdown_text, one_line, plural
from harness.report.model import build_report
from harness.report.render import render
from harness.results import (
    CellStatus,
    Outcome,
    ResultSet,
    SuiteInfo,
    decode_digest,
    digest,
    load_baseline,
    load_results,
)

GOLDEN = Path(__file__).parent / "golden"


def load_regenerate():
    spec = importlib.util.spec_from_file_location("golden_regenerate", GOLDEN / "regenerate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


REGENERATE = load_regenerate()


# ---------------------------------------------------------------------------------------------
# Golden files


@pytest.mark.parametrize(("expected", "results", "baseline", "fmt"), REGENERATE.GOLDEN_CASES,
                         ids=[case[0] for case in REGENERATE.GOLDEN_CASES])
def test_golden(expected, results, baseline, fmt):
    rendered = REGENERATE.render_case(results, baseline, fmt)
    wanted = (GOLDEN / "expected" / expected).read_text(encoding="utf-8")
    assert rendered == wanted, (f"{expected} differs; if the change is intended, run "
                                "`python tests/unit/golden/regenerate.py --render` and review the diff")


@pytest.mark.parametrize(("expected", "build"), REGENERATE.STAGE_CASES,
                         ids=[case[0] for case in REGENERATE.STAGE_CASES])
def test_golden_stage(expected, build):
    """The reader's model and the digest, each a golden file: a reader change shows here first."""
    wanted = (GOLDEN / "expected" / expected).read_text(encoding="utf-8")
    assert build() == wanted, (f"{expected} differs; if the change is intended, run "
                               "`python tests/unit/golden/regenerate.py --render` and review the diff")


def test_every_sample_cell_folder_holds_its_pytest_log():
    # The crashed cell's log tail is in the expected output; a log lost on the way to git must fail here.
    folders = [path.parent for path in (GOLDEN / "samples").rglob("env.json")]
    assert len(folders) == 13
    assert all((folder / "pytest.log").is_file() for folder in folders)


def test_a_baseline_read_back_from_a_comment_equals_the_folder_it_came_from(tmp_path):
    samples = GOLDEN / "samples"
    comment = tmp_path / "previous-comment.md"
    comment.write_text(render(load_results([samples / "baseline"]), "pr-comment"))
    current = load_results([samples / "run"])
    from_comment = render(current, "pr-comment", baseline=load_baseline(comment))
    assert from_comment == render(current, "pr-comment", baseline=load_baseline(samples / "baseline"))
    assert "#### Changes since `0a9b8c7d6e5f`" in from_comment


# ---------------------------------------------------------------------------------------------
# Synthetic result sets


HOSTILE = "a|b`c``<script>alert(1)</script>\n| x | y |\n@octocat [l](javascript:x) ```\x1b[31m\u202eevil"


def hostile_set() -> ResultSet:
    tests = (
        make_test(0, Outcome.FAILED, name=f"test_x[{HOSTILE}]", message=HOSTILE,
                    max_rel_grad_error=0.05, grad_error_bound=0.03),
        make_test(1, Outcome.SKIPPED, message=HOSTILE),
        make_test(2, Outcome.FLAKY, name=f"test_y[{HOSTILE}]"),
    )
    return ResultSet((cell("h200-2gpu", *tests, gpu=HOSTILE, torch=HOSTILE, peaks=(100.0, 200.0)),))


def outside_code(markdown: str) -> str:
    """What GitHub renders as Markdown: without fenced blocks and code spans, where text is literal."""
    return without_code_spans(without_fences(markdown))


def table_rows(markdown: str) -> list[str]:
    return [line for line in without_fences(markdown).splitlines() if line.startswith("|")]


def cell_count(row: str) -> int:
    """Cells GitHub sees in a table row: pipes that are not escaped (in code spans too)."""
    return len(re.findall(r"(?<!\\)\|", without_code_spans(row))) - 1


@pytest.mark.parametrize("fmt", ["pr-comment", "summary"])
def test_nothing_from_a_test_breaks_a_markdown_table_or_adds_markup(fmt):
    text = render(hostile_set(), fmt)
    rows = table_rows(text)
    assert len(rows) == 2 + 1 + 2 + 1 + 2 + 1  # cells, metrics and skip tables: header, rule, one row each
    for header, *body in (rows[0:3], rows[3:6], rows[6:9]):
        assert {cell_count(row) for row in body} == {cell_count(header)}
    prose = outside_code(text)
    assert not re.search(r"(?<!\\)<(script|img)", prose)  # every '<' from a test is escaped
    assert prose.count("<details>") == prose.count("</details>")
    assert "@octocat" not in prose.replace("@&#8203;octocat", "")
    assert not re.search(r"(?<!\\)\[[^\]]*(?<!\\)\]\(javascript", prose)  # no link
    assert "\x1b" not in text and "\u202e" not in text


def test_a_message_cannot_close_its_code_fence():
    text = render(hostile_set(), "pr-comment")
    fences = re.findall(r"^(`{3,})text$", text, flags=re.MULTILINE)
    assert fences and all(len(fence) > 3 for fence in fences)  # longer than the ``` inside the message


def test_html_escapes_tests_and_needs_nothing_from_outside():
    text = render(hostile_set(), "html")
    parser = TagCollector()
    parser.feed(text)
    assert "script" not in parser.tags and "img" not in parser.tags and "link" not in parser.tags
    assert parser.urls == []
    assert re.findall(r"https?://[^\s\"']+", text) == ["http://www.w3.org/2000/svg"] * 4  # 2 plots, each laid out twice
    assert {"svg", "circle", "rect", "table"} <= parser.tags


def test_terminal_output_holds_no_control_characters():
    text = render(hostile_set(), "terminal")
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f\u202e]", text)


@pytest.mark.parametrize(("function", "text", "expected"), [
    (markdown_text, "a|b *c* _d_ <e> [f](g) @h", r"a\|b \*c\* \_d\_ \<e\> \[f\](g) @&#8203;h"),
    (markdown_text, None, "—"),
    (code_span, "x`y", "``x`y``"),
    (code_span, "`x", "`` `x ``"),
    (code_span, "a|b", "`a|b`"),
    (html_text, '<b a="1">@x</b>', "&lt;b a=&#34;1&#34;&gt;@&#8203;x&lt;/b&gt;"),
    (one_line, "a\nb\r\n\tc\x1b[0m", "a b c"),
    (one_line, "x" * 400, "x" * 299 + "…"),
    (fence_for, "no ticks", "```"),
    (fence_for, "has ```` four", "`````"),
])
def test_escaping(function, text, expected):
    assert function(text) == expected


def test_code_span_in_a_table_escapes_pipes():
    assert code_span("a|b", table=True) == r"`a\|b`"


# ---------------------------------------------------------------------------------------------
# Content


@pytest.mark.parametrize(("cells", "verdict"), [
    ((cell("a", make_test(0)),), "✅ **the only cell passed**"),
    ((cell("a", make_test(0)), cell("b", make_test(0))), "✅ **all 2 cells passed**"),
    ((cell("a", make_test(0, Outcome.FAILED, message="m")), cell("b", status=CellStatus.ERRORED, reason="r"),
      cell("c", make_test(0))), "❌ **1 of 3 cells failed, 1 errored**"),
    ((cell("a", status=CellStatus.ERRORED, reason="r"), cell("b", make_test(0))),
     "💥 **1 of 2 cells errored**"),
    ((cell("a", not_run_test(0)),), "⏸️ **nothing distributed ran in the only cell**"),
    ((cell("a", not_run_test(0)), cell("b", not_run_test(0))), "⏸️ **nothing distributed ran in any of 2 cells**"),
    ((cell("a", not_run_test(0)), cell("b", make_test(0))),
     "⏸️ **nothing distributed ran in 1 of 2 cells; the others passed**"),
    ((cell("a", make_test(0, Outcome.FAILED, message="m")), cell("b", not_run_test(0))),
     "❌ **1 of 2 cells failed, 1 ran nothing distributed**"),
    ((cell("a", status=CellStatus.ERRORED, reason="r"), cell("b", not_run_test(0))),
     "💥 **1 of 2 cells errored, 1 ran nothing distributed**"),
])
def test_verdict_line_comes_right_after_the_marker(cells, verdict):
    lines = render(ResultSet(cells), "pr-comment", sha="0123456789abcdef", matrix_name="pr").splitlines()
    assert lines[0] == COMMENT_MARKER
    # then what the run cost: these cells recorded no start or end, and no job gave its times
    counted = plural(len(cells), "cell")
    assert lines[1] == (f"{verdict} · `0123456789ab` · matrix `pr` · {counted}, GPU-hours unknown, wait unknown "
                        f"({counted} without timings)")


@pytest.mark.parametrize("fmt", ["pr-comment", "terminal", "html"])
def test_a_run_with_local_changes_says_so_beside_its_commit(fmt):
    dirty = dataclasses.replace(cell("a", make_test(0)), git_sha="0123456789abcdef", git_dirty=True)
    clean = dataclasses.replace(dirty, git_dirty=False)
    assert "with local changes" in render(ResultSet((dirty,)), fmt)
    assert "with local changes" not in render(ResultSet((clean,)), fmt)
    # Another commit given on the command line is not the one the changes were made on.
    assert "with local changes" not in render(ResultSet((dirty,)), fmt, sha="fedcba9876543210")


FORMATS = ("pr-comment", "summary", "terminal", "html")


def flat(text: str) -> str:
    """The text with every run of white space one space: the terminal wraps long lines."""
    return " ".join(text.split())


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_cell_that_ran_nothing_distributed_is_never_called_passed(fmt):
    text = render(ResultSet((cell("ada-1gpu", make_test(0), not_run_test(1, 2), not_run_test(2, 8)),)), fmt)
    assert "nothing distributed ran in the only cell" in text
    assert "nothing distributed ran: 2 cases need 2-8 GPUs, this host has 1" in flat(text)
    assert "passed**" not in text and "cell passed" not in text and "✅" not in text
    assert "NOT RUN" in text if fmt in ("terminal", "html") else "⏸️" in text  # html: its badge of words
    assert "Reproduce" not in text and "reproduce:" not in text  # it needs a larger host, not a rerun here


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_cell_where_some_distributed_cases_ran_passes_and_says_what_it_could_not_run(fmt):
    partly = cell("h200-2gpu", ran_test(0, "mixtral"), not_run_test(1, needs=8, host=2))
    assert partly.status is CellStatus.PASSED
    text = render(ResultSet((partly,)), fmt)
    assert "the only cell passed" in text
    assert "h200-2gpu" in text and "1 case not run: it needs 8 GPUs, this host has 2" in flat(text)


def test_coverage_counts_a_family_only_where_one_of_its_distributed_cases_ran():
    suite = SuiteInfo(ep_families_declared=("alpha", "beta", "gamma", "delta"),
                      ep_families_covered=("alpha", "beta", "gamma"), ep_families_not_covered=(("delta", "no plan"),))
    skipped_beta = dataclasses.replace(not_run_test(1), properties=(*not_run_test(1).properties, ("family", "beta")))
    tests = (ran_test(0, "alpha", Outcome.FAILED), skipped_beta, ran_test(2, "gamma", world_size=1))
    [coverage] = build_report(ResultSet((cell("c", *tests, suite=suite),))).coverage
    assert coverage.covered == ("alpha",)  # a failed case ran; a skipped one and a world of 1 cover nothing
    assert coverage.missing == (("beta", "none of its distributed cases ran in this cell"),
                                ("gamma", "none of its distributed cases ran in this cell"), ("delta", "no plan"))
    assert "EP families covered: 1 of 4" in render(ResultSet((cell("c", *tests, suite=suite),)), "terminal")


@pytest.mark.parametrize("fmt", ["pr-comment", "summary", "terminal", "html"])
def test_the_reproduce_line_of_a_run_with_its_own_k_has_one_separator(fmt):
    """Issue 29: `-- -k ep -- -k test_a` is not a command pytest takes; the failing tests join the run's -k."""
    failing = make_test(0, Outcome.FAILED, name="test_a", message="boom")
    ran = dataclasses.replace(cell("a", failing), pytest_args=("-k", "ep", "-x"))
    text = render(ResultSet((ran,)), fmt)
    command = "harness run --cell 'a' -- -k '(ep) and (test_a)' -x"
    assert (html_text(command) if fmt == "html" else command) in text
    assert " -- -k ep -- " not in text


def test_flaky_tests_are_shown_in_the_verdict_and_listed():
    text = render(ResultSet((cell("a", make_test(0), make_test(1, Outcome.FLAKY)),)), "pr-comment")
    assert "✅ **the only cell passed** · ⚠️ 1 flaky test" in text
    assert "- `tests/gpu/test_ep.py::test_case_1[2-bf16]` in `a`: passed on attempt 1" in text


def test_metrics_put_the_case_closest_to_its_bound_first():
    set_ = ResultSet((
        cell("a", make_test(0, max_rel_grad_error=0.001, grad_error_bound=0.03),
             make_test(1, max_rel_grad_error=0.02, grad_error_bound=0.03, min_routing_margin=0.2)),
        cell("b", make_test(0, max_rel_grad_error=0.004, grad_error_bound=0.03),
             make_test(1, max_rel_grad_error=0.01, grad_error_bound=0.03)),
    ))
    rows = [row for row in table_rows(render(set_, "pr-comment")) if "test_case_" in row]
    assert rows == [
        "| `tests/gpu/test_ep.py::test_case_1[2-bf16]` | `a` | 2.00e-02 | 3.00e-02 | 33% | 0.2 | — | — | — |",
        "| `tests/gpu/test_ep.py::test_case_0[2-bf16]` | `b` | 4.00e-03 | 3.00e-02 | 87% | — | — | — | — |",
    ]


def test_the_metrics_table_leads_with_news_and_closes_the_known_planted_and_expected_rows_in_one_block():
    """New reds first, then the cases that passed (closest to the bound first); a known bug still present, a
    planted defect and a plain expected failure, however far over their bound, in one <details> after them."""
    bound = {"grad_error_bound": 0.01}
    known = make_test(0, Outcome.XFAILED, message="known", max_rel_grad_error=0.05, known_bug="mixtral-bias", **bound)
    planted = make_test(1, max_rel_grad_error=1.0, planted_defect="scale_over_local_shard", **bound)
    expected = make_test(2, Outcome.XFAILED, message="plain xfail", max_rel_grad_error=0.02, **bound)
    passed_near = make_test(3, max_rel_grad_error=0.009, **bound)
    passed_far = make_test(4, max_rel_grad_error=0.001, **bound)
    red = make_test(5, Outcome.FAILED, message="routing differs", max_rel_grad_error=0.002, **bound)
    # Known in cell a (further over its bound), a new red in b: news, shown in b.
    red_in_b = make_test(6, Outcome.FAILED, message="differs", max_rel_grad_error=0.003, **bound)
    known_in_a = make_test(6, Outcome.XFAILED, message="known", max_rel_grad_error=0.5, known_bug="qwen3-gate", **bound)
    results = ResultSet((cell("a", known, planted, expected, passed_near, passed_far, red, known_in_a),
                         cell("b", red_in_b)))
    text = render(results, "pr-comment")
    section = text[text.index("#### Gradient error against bound"):]
    news, settled = section.split("<details><summary>Known bugs, planted defects, expected failures, not built: "
                                  "3 cases</summary>")
    shown = lambda part: [(row.split(" | ")[0].split("test_case_")[1][0], row.split(" | ")[1])  # noqa: E731
                          for row in table_rows(part) if "test_case_" in row]
    assert shown(news) == [("6", "`b`"), ("5", "`a`"), ("3", "`a`"), ("4", "`a`")]
    assert shown(settled.split("</details>")[0]) == [("1", "planted defect"), ("0", "known bug"),
                                                      ("2", "expected failure")]
    assert "7 cases, news first" in section and "3 known, planted or not built below" in section


def test_the_settled_metrics_rows_share_the_tables_row_limit():
    """The news rows fill the comment's 25 metric rows first; the settled ones are then counted in their block."""
    passed = [make_test(i, max_rel_grad_error=1e-3 * (i + 1), grad_error_bound=0.1) for i in range(30)]
    known = [make_test(30 + i, Outcome.XFAILED, message="known", max_rel_grad_error=0.5, grad_error_bound=0.1,
                       known_bug="mixtral-bias") for i in range(3)]
    text = render(ResultSet((cell("a", *passed, *known),)), "pr-comment")
    section = text[text.index("#### Gradient error against bound"):]
    assert len([row for row in table_rows(section) if "test_case_" in row]) == 25
    assert "…and 5 more cases further from their bound." in section
    assert "not built: 3 cases</summary>\n\n…and 3 more cases.\n\n</details>" in section


@pytest.mark.parametrize(("tests", "status", "badge"), [
    ((make_test(0),), None, '<span class="badge passed">PASSED</span>'),
    ((make_test(0, Outcome.FAILED, message="differs"),), None, '<span class="badge failed">FAILED</span>'),
    ((), CellStatus.ERRORED, '<span class="badge errored">ERRORED</span>'),
    ((not_run_test(0),), None, '<span class="badge not_run">NOT RUN</span>'),
])
def test_the_html_headline_says_its_verdict_in_a_badge_of_words_not_an_emoji(tests, status, badge):
    """A page opened where no emoji font is installed showed its ✅/❌ as an empty box."""
    page = render(ResultSet((cell("a", *tests, status=status, reason="crashed" if status else None),)), "html")
    headline = page[page.index("<h1>"):page.index("</h1>")]
    assert headline.startswith(f"<h1>{badge} harness: "), headline
    assert all(ord(char) < 0x2000 for char in headline), headline  # no emoji, no symbol a font may lack


def test_failures_shared_by_cells_are_one_section():
    failing = make_test(0, Outcome.FAILED, message="routing differs: layer 1")
    text = render(ResultSet((cell("a", failing), cell("b", failing))), "pr-comment")
    assert text.count("<details><summary>❌") == 1
    assert "Failed in `a`, `b`." in text


def test_memory_column_shows_each_gpu_and_unknowns():
    text = render(ResultSet((cell("a", make_test(0), peaks=(12595.3, 12390.1, None)),)), "pr-comment")
    assert "| 12.3 / 12.1 / ? GiB |" in text


def test_a_metric_over_its_bound_in_a_passing_test_is_labelled_expected_never_a_failure():
    """A deliberate-bug test passes because its check fails: its metric is over the bound by design."""
    planted = make_test(0, name="test_ep_nvfp4_scale_over_local_shard_fails_the_gradient_check[2]",
                        max_rel_grad_error=1.0, grad_error_bound=1e-4, max_logits_difference=2.0, logits_atol=1e-3)
    regressed = make_test(1, Outcome.FAILED, message="gradients differ", max_rel_grad_error=0.05,
                          grad_error_bound=0.03)
    results = ResultSet((cell("a", planted, regressed),))
    rows = {row.split(" | ")[0]: row for row in table_rows(render(results, "pr-comment")) if "test_" in row}
    planted_row = next(row for key, row in rows.items() if "nvfp4" in key)
    regressed_row = next(row for key, row in rows.items() if "test_case_1" in key)
    assert "❌" not in planted_row and "| expected -999900% |" in planted_row and "| expected 2.00e+00 |" in planted_row
    assert "| ❌ -67% |" in regressed_row
    page = render(results, "html")
    assert 'class="n expected">expected -999900%' in page and 'class="n over">-67%' in page
    assert 'class="expected"' in page and page.count('class="over"') == 2  # amber, one red: in each layout


# ---------------------------------------------------------------------------------------------
# Size limits# ---------------------------------------------------------------------------------------------
# Size limits


def big_set(cells: int, tests: int, message_chars: int = 400) -> ResultSet:
    return ResultSet(tuple(
        cell(f"h200-{c}gpu-torch2.11.0-tf5.18.0",
             *(make_test(t, Outcome.FAILED if t % 7 == 0 else Outcome.PASSED,
                           message=f"{c}-{t} " + "x" * message_chars,
                           max_rel_grad_error=1e-3 * (t % 13 + 1), grad_error_bound=3e-2)
               for t in range(tests)),
             peaks=(1000.0 * c, 900.0 * c))
        for c in range(cells)
    ))


def test_a_huge_comment_is_shortened_says_what_was_cut_and_keeps_its_digest(monkeypatch):
    results = big_set(40, 300)
    whole = render(results, "pr-comment")
    assert "Shortened" not in whole  # it fits at the first step: nothing was cut
    monkeypatch.setattr(report, "COMMENT_LIMIT", len(whole) - 1)
    text = render(results, "pr-comment")
    assert len(text.encode("utf-16-le")) // 2 <= len(whole) - 1
    assert text.startswith(COMMENT_MARKER + "\n")
    assert "✂️ Shortened to fit GitHub's 65,536-character comment limit" in text
    assert re.search(r"…and [\d,]+ more failures not shown", text)
    assert decode_digest(text).cells.keys() == digest(results).cells.keys()


def many_failures(cells: int, per_cell: int) -> ResultSet:
    """`per_cell` failures in each of `cells` cells, every one its own (a message naming its cell)."""
    return ResultSet(tuple(
        cell(f"h200-2gpu-torch2.11.0-tf5.{index}.0", *(
            make_test(case, Outcome.FAILED, message=f"routing differs in cell {index}: layer {case}")
            for case in range(per_cell)))
        for index in range(cells)
    ))


def listed_failures(text: str, fmt: str) -> dict[str, int]:
    """How many failures each cell has listed in a rendering's failures section."""
    found: dict[str, int] = {}
    marker = "routing differs in cell "
    for line in text.splitlines():
        if ("<summary>" in line) and marker in line:
            index = line.split(marker, 1)[1].split(":", 1)[0]
            found[index] = found.get(index, 0) + 1
    return found


@pytest.mark.parametrize(("fmt", "limits"), [("html", report.HTML_LIMITS), ("pr-comment", report.COMMENT_LADDER[0]),
                                             ("summary", report.SUMMARY_LADDER[0])])
def test_each_rendering_lists_a_bounded_number_of_failures_per_cell_and_in_all(fmt, limits):
    """A night of thousands of failures: at most so many of a cell's are listed and so many in all; the rest are
    counted, never rendered (every one stays in its cell's junit.xml)."""
    per_cell = limits.failures_per_cell + 7
    one_cell = render(many_failures(1, per_cell), fmt)
    assert listed_failures(one_cell, fmt) == {"0": limits.failures_per_cell}
    assert "…and 7 more failures not" in one_cell
    cells = limits.failures // limits.failures_per_cell + 3
    text = render(many_failures(cells, per_cell), fmt)
    listed = listed_failures(text, fmt)
    assert sum(listed.values()) == limits.failures and max(listed.values()) <= limits.failures_per_cell
    assert f"…and {cells * per_cell - limits.failures:,} more failures not" in text


def test_a_failure_shared_by_cells_is_listed_while_one_of_its_cells_has_room():
    from harness.report.listing import Listed, listed

    items = [("a",), ("a",), ("a", "b"), ("b",), ("a",), ("c",)]
    assert listed(items, lambda cells: cells, per_cell=2, total=10) == \
        Listed(shown=(("a",), ("a",), ("a", "b"), ("b",), ("c",)), left_out=1)
    assert listed(items, lambda cells: cells, per_cell=2, total=2) == Listed(shown=(("a",), ("a",)), left_out=4)


def test_the_html_report_of_many_failures_stays_small():
    """2,000 failures listed, each with a 30-line excerpt at most: a page a browser opens, whatever the night."""
    text = render(many_failures(100, 300), "html")
    assert len(text) < 10_000_000 and "…and 28,000 more failures not listed here" in text


def test_a_comment_that_fits_has_no_cut_note_even_when_its_tables_show_their_worst_rows_only():
    """The first step's limits (25 metric rows, 30 failures) are the comment's ordinary length: a comment that
    fits at that step was not shortened, whatever those limits left out."""
    results = big_set(1, 40, message_chars=10)
    text = render(results, "pr-comment")
    assert len(text) < COMMENT_LIMIT // 4 and "further from their bound" in text
    assert "✂️" not in text and "Shortened" not in text
    assert "Shortened" not in render(results, "summary")


def test_past_the_last_step_the_text_is_cut_but_the_digest_survives(monkeypatch):
    monkeypatch.setattr(report, "COMMENT_LIMIT", 6_000)
    results = big_set(60, 5, message_chars=10)
    text = render(results, "pr-comment")
    assert len(text) <= 6_000
    assert "✂️ Cut at 6,000 characters" in text
    assert decode_digest(text) == decode_digest(render(results, "pr-comment").split("\n", 1)[1])


def test_summary_is_measured_in_bytes(monkeypatch):
    monkeypatch.setattr(report, "SUMMARY_LIMIT_BYTES", 40_000)
    text = render(big_set(10, 200), "summary")
    assert len(text.encode("utf-8")) <= 40_000
    assert text.startswith("### harness report") and "✂️ Shortened to fit the 1 MB job summary limit" in text
    assert "harness-digest" not in text and COMMENT_MARKER not in text


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="unknown report format 'pdf'"):
        render(ResultSet(()), "pdf")


# ---------------------------------------------------------------------------------------------
# The command


def test_report_command_writes_each_format(tmp_path, capsys):
    run = str(GOLDEN / "samples" / "run")
    assert main(["report", run, "--format", "terminal"]) == 0
    assert "\nharness: 1 of 5 cells failed, 2 errored · 4f1c2a9e7d3b" in capsys.readouterr().out
    out = tmp_path / "deep" / "comment.md"
    assert main(["report", run, "--format", "pr-comment", "--sha", "feedbeef", "--matrix", "pr",
                 "-o", str(out)]) == 0
    assert out.read_text().splitlines()[1].endswith("· `feedbeef` · matrix `pr` · 5 cells, 1.4 GPU-hours, wait unknown")
    page = tmp_path / "r.html"
    assert main(["report", run, "--baseline", str(out), "--format", "html", "-o", str(page)]) == 0
    assert "Changes since" in page.read_text()


def test_report_command_bad_input_exits_2(capsys):
    assert main(["report", "nowhere"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("harness: error:") and "results path nowhere is not a folder" in error


def test_an_unreadable_baseline_is_a_warning_and_the_report_still_renders(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    # A comment whose digest was cut or edited must not freeze the PR's comment for every later run.
    broken = tmp_path / "previous.md"
    broken.write_text("<!-- harness-report -->\nsome text\n<!-- harness-digest v1 AAAA -->\n")
    out = tmp_path / "comment.md"
    assert main(["report", str(GOLDEN / "samples" / "run"), "--baseline", str(broken),
                 "--format", "pr-comment", "-o", str(out)]) == 0
    error = capsys.readouterr().err
    assert error.startswith("harness: warning: baseline") and "the digest is unreadable" in error
    assert out.read_text().startswith(COMMENT_MARKER) and "Changes since" not in out.read_text()
