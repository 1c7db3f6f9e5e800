"""Hostile and extreme results, written as files the way a pull request's code could write them, fed to
every rendering (PR comment, job summary, terminal, HTML, the nightly issue and its comment): each must
render, stay within its size limit, keep its digest readable, and add no markup, mention, link or image."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from markup_helpers import TagCollector, without_code_spans, without_fences

from harness.cli import main
from harness.contract import COMMENT_LIMIT
from harness.report.render import render, render_nightly
from harness.results import (
    DIGEST_TAG,
    CellStatus,
    Digest,
    Labelled,
    Regression,
    decode_digest,
    load_results,
    nightly_regressions,
    read_cell,
)

ROOT = Path(__file__).resolve().parents[2]
CELL = "ada-2gpu-torch2.11.0-tf5.9.0"
LONG = "x" * 100_000  # a 100 KB line
HOSTILE = (
    "a|b`c``<img src=x onerror=alert(1)> @org/team @octocat [l](https://evil.example) "
    "![i](https://evil.example/i.png) </details> ``` <!-- harness-digest v1 AAAA --> "
    "https://evil.example/bare HTTP://evil.example www.evil.example WWW.evil.example me@evil.example "
    "mailto:me@evil.example ftp://evil.example " + LONG
)


def xml_attr(text: str) -> str:
    return (
        text.replace("&", "&amp;")
        .replace('"', "&quot;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace("\n", "&#10;")
    )


def junit(cases: str, suite_properties: str = "") -> str:
    return (
        f'<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" time="1.0">'
        f"{suite_properties}{cases}</testsuite></testsuites>"
    )


def case(name: str, body: str = "", properties: dict[str, str] | None = None, time: str = "0.5") -> str:
    props = "".join(
        f'<property name="{xml_attr(key)}" value="{xml_attr(value)}"/>' for key, value in (properties or {}).items()
    )
    return (
        f'<testcase classname="tests.gpu.test_ep" name="{xml_attr(name)}" file="tests/gpu/test_ep.py" '
        f'time="{time}">{f"<properties>{props}</properties>" if props else ""}{body}</testcase>'
    )


def write_cell(folder: Path, junit_text: str | None, env: dict | None = None, memory: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    record = {
        "schema": 1,
        "cell": {"id": folder.name, "matrix": "nightly"},
        "status": "failed",
        "exit_code": 1,
        "git_sha": "4f1c2a9e7d3b8a6c5e0f1d2c3b4a59687766aabb",
    }
    (folder / "env.json").write_text(json.dumps({**record, **(env or {})}))
    if junit_text is not None:
        (folder / "junit.xml").write_text(junit_text)
    if memory is not None:
        (folder / "memory.json").write_text(memory)
    return folder


def hostile_results(root: Path) -> Path:
    failure = f'<failure message="{xml_attr(HOSTILE)}">{xml_attr(HOSTILE)}&#10;E   {xml_attr(HOSTILE)}</failure>'
    cases = (
        case(f"test_bad[{HOSTILE}]", failure, {"max_rel_grad_error": "0.5", "grad_error_bound": "0.03"})
        + case("test_skip", f'<skipped type="pytest.skip" message="{xml_attr(HOSTILE)}"/>')
        + case("test_known", f'<skipped type="pytest.xfail" message="known upstream bug: {xml_attr(HOSTILE)}"/>')
        + case("test_logits", "", {"max_logits_difference": HOSTILE, "logits_atol": "1e-3"})
    )
    suite = (
        f'<properties><property name="ep_families_declared" value="{xml_attr(HOSTILE)},qwen3_moe"/>'
        f'<property name="ep_families_covered" value="qwen3_moe"/>'
        f'<property name="transformers_version" value="{xml_attr(HOSTILE)}"/></properties>'
    )
    write_cell(root / CELL, junit(cases, suite), env={"error": HOSTILE, "reproduce": "harness run " + HOSTILE})
    write_cell(root / "h200-8gpu-torch2.11.0-tf5.18.0", None, env={"status": "errored", "error": HOSTILE})
    return root


# ---------------------------------------------------------------------------------------------
# What a rendering may hold


def outside_code(markdown: str) -> str:
    """What GitHub renders as Markdown: no fenced blocks, no code spans, no HTML comments."""
    prose = without_code_spans(without_fences(markdown))
    return re.sub(r"<!-- harness-[a-z:0-9]+ -->|<!-- harness-digest v1 [A-Za-z0-9+/=]+ -->", "", prose)


def assert_safe_markdown(text: str) -> None:
    prose = outside_code(text)
    assert not re.search(r"(?<!\\)<(img|script|a )", prose, re.IGNORECASE)
    assert not re.search(r"(?<![\\\w])@(?!&#8203;)[A-Za-z]", prose), "a live mention"
    assert not re.search(r"(?<!\\)\[[^\[\]]*(?<!\\)\]\(", prose), "a live link or image"
    # GFM autolinks: a bare scheme://, www. or address becomes a link without any markup
    autolink = re.search(r"(?i)\b[a-z][a-z0-9+.-]*://[a-z0-9]|\bwww\.[a-z0-9]|[a-z0-9._+-]@[a-z0-9]", prose)
    assert not autolink, f"a bare URL GitHub would link: {prose[autolink.start() - 20: autolink.end() + 20]!r}"
    assert prose.count("<details>") == prose.count("</details>")
    assert len(re.findall(r"^`{3,}", text, re.MULTILINE)) % 2 == 0, "an open code fence"
    assert max(map(len, text.splitlines())) < 5_000, "a 100 KB line came through whole"


@pytest.mark.parametrize("fmt", ["pr-comment", "summary"])
def test_hostile_names_add_no_markup_to_markdown(tmp_path, fmt):
    text = render(load_results([hostile_results(tmp_path)]), fmt)
    assert_safe_markdown(text)
    if fmt == "pr-comment":
        assert len(text) <= COMMENT_LIMIT
        assert decode_digest(text).cells  # the real digest, not the one quoted in a message


def test_hostile_names_add_no_markup_to_html(tmp_path):
    parser = TagCollector()
    parser.feed(render(load_results([hostile_results(tmp_path)]), "html"))
    assert not {"img", "script", "a", "iframe"} & parser.tags and parser.urls == []


def test_hostile_names_add_no_control_characters_to_the_terminal(tmp_path):
    text = render(load_results([hostile_results(tmp_path)]), "terminal")
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", text)
    assert max(map(len, text.splitlines())) < 5_000


def test_hostile_names_add_no_markup_to_the_nightly_issue(tmp_path):
    before = tmp_path / "before"
    write_cell(before / CELL, junit(case(f"test_bad[{HOSTILE}]")), env={"status": "passed", "exit_code": 0})
    write_cell(before / "h200-8gpu-torch2.11.0-tf5.18.0", junit(case("t")), env={"status": "passed"})
    current = load_results([hostile_results(tmp_path / "now")])
    found = nightly_regressions(current, load_results([before]), memory_mib=64, memory_percent=10)
    assert {item.kind for item in found} == {"failing", "errored"}
    # What triage.json hands the issue (its class and label fields) is input too.
    found = (*found, *(Regression(cell_id=CELL, kind=kind, test_id=HOSTILE, text=HOSTILE, triage_class=HOSTILE,
                                  label=HOSTILE) for kind in ("failing", "errored")))
    for kind in ("issue", "again"):
        text = render_nightly(
            kind,
            marker="<!-- harness-nightly -->",
            sha="4f1c2a9e7d3b",
            run_url=None,
            regressions=found,
            matrix="nightly",
            against="the night before",
            report=render(current, "summary"),
        )
        assert_safe_markdown(text)


# ---------------------------------------------------------------------------------------------
# Numbers the suite itself writes


def test_non_finite_and_out_of_range_numbers_render_in_every_format(tmp_path):
    cases = (
        case("test_inf", "", {"max_rel_grad_error": "inf", "grad_error_bound": "1e-3"})
        + case("test_tiny", "", {"max_rel_grad_error": "5e-324", "grad_error_bound": "1e-3"})
        + case("test_nan", "", {"max_rel_grad_error": "nan", "peak_allocated_mib.0": "Infinity"}, time="1e999")
    )
    memory = (
        '{"schema": 1, "available": true, "gpus": [{"index": 0, "peak_used_mib": Infinity, '
        '"total_mib": NaN}, {"index": 1, "peak_used_mib": 1e999, "used_before_mib": -1e308}]}'
    )
    write_cell(tmp_path / CELL, junit(cases), env={"status": "passed", "duration_s": 1e999}, memory=memory)
    results = load_results([tmp_path])
    [cell] = results.cells
    tests = {test.name: test for test in cell.tests}
    assert tests["test_inf"].grad_error == Labelled("inf")
    assert tests["test_nan"].grad_error == Labelled("nan")
    assert tests["test_tiny"].grad_error == Labelled("5e-324", tiny=True)
    assert cell.memory[0].peak_used_mib == Labelled("inf") and cell.duration_s == Labelled("inf")
    outputs = {fmt: render(results, fmt) for fmt in ("pr-comment", "summary", "terminal", "html")}
    # Over any bound, in a test that passed: what the test expected (as a deliberate-bug test does), not a ❌.
    assert (
        "| `tests/gpu/test_ep.py::test_inf` | `ada-2gpu-torch2.11.0-tf5.9.0` | inf | 1.00e-03 | expected —"
        in (outputs["pr-comment"])
    )
    assert decode_digest(outputs["pr-comment"]).cells[CELL].peak_used_mib == (None, None)


def test_deeply_nested_testsuites_are_an_errored_row_without_recursion(tmp_path):
    depth = 5_000  # junit.MAX_DEPTH is 32; tests/unit/test_hostile_lower.py plays millions of nested elements
    nested = '<testsuite name="s">' * depth + case("test_deep") + "</testsuite>" * depth
    text = f"<testsuites>{nested}</testsuites>"
    write_cell(tmp_path / CELL, text, env={"status": "passed"})
    [cell] = load_results([tmp_path]).cells
    assert cell.status is CellStatus.ERRORED and "nested deeper than 32" in cell.reason
    assert "errored" in render(load_results([tmp_path]), "html")


@pytest.mark.parametrize(
    "doctype",
    [
        '<!DOCTYPE t [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]>',  # entity expansion
        '<!DOCTYPE t [<!ENTITY e SYSTEM "file:///etc/passwd">]>',  # an external entity
    ],
)
def test_entity_declarations_are_refused(tmp_path, doctype):
    text = f'<?xml version="1.0"?>{doctype}<testsuites>{case("test_&b;")}</testsuites>'
    cell = read_cell(write_cell(tmp_path / CELL, text))
    assert cell.status is CellStatus.ERRORED and "junit.xml: refused: a DOCTYPE" in cell.reason


def test_the_xml_parser_is_the_standard_librarys_whatever_is_installed(tmp_path):
    """An installed lxml must not be picked up (junitparser switched to it silently, and its errors
    escaped harness's handling): a stand-in lxml that breaks on use changes nothing."""
    fake = tmp_path / "site" / "lxml"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "etree.py").write_text("def __getattr__(name):\n    raise RuntimeError('lxml was used')\n")
    write_cell(tmp_path / "results" / CELL, junit(case("test_ok")), env={"status": "passed"})
    code = (
        "import sys; from harness.results import load_results; "
        f"cell, = load_results([{str(tmp_path / 'results')!r}]).cells; print(cell.status.value, len(cell.tests))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": f"{tmp_path / 'site'}:{ROOT}", "PATH": "/usr/bin:/bin"},
    )
    assert done.stdout.strip() == "passed 1", done.stderr


# ---------------------------------------------------------------------------------------------
# Sizes: a comment always fits and always carries a digest the next run can read


def test_a_huge_env_field_and_a_huge_cell_id_keep_the_comment_and_its_digest(tmp_path, capsys):
    huge_id = "ada-2gpu-torch2.11.0-tf5.9.0-" + "y" * 60_000
    write_cell(tmp_path / "run" / "a", junit(case("test_ok")), env={"cell": {"id": huge_id}, "status": "passed"})
    write_cell(
        tmp_path / "run" / CELL,
        junit(case("test_bad", '<failure message="m">t</failure>')),
        env={"error": "z" * 2_000_000, "reproduce": "harness run " + "q" * 2_000_000, "status": "errored"},
    )
    comment = tmp_path / "comment.md"
    assert main(["report", str(tmp_path / "run"), "--format", "pr-comment", "-o", str(comment)]) == 0
    text = comment.read_text()
    assert len(text) <= COMMENT_LIMIT and len(text) > 1_000
    assert_safe_markdown(text)
    assert len(decode_digest(text).cells) == 2
    # The next run compares against it: never exit 2, so the PR comment keeps being updated.
    again = tmp_path / "again.md"
    assert (
        main(["report", str(tmp_path / "run"), "--baseline", str(comment), "--format", "pr-comment", "-o", str(again)])
        == 0
    )
    assert "No changes" in again.read_text()


def test_a_digest_always_fits_whatever_the_number_of_cells(tmp_path):
    for index in range(400):
        write_cell(
            tmp_path / f"cpu-2rank-torch2.13.0-tf5.{index}.0-{'w' * 200}",
            junit(case(f"t{'v' * 300}")),
            env={"cell": {}, "status": "passed"},
        )
    text = render(load_results([tmp_path]), "pr-comment")
    assert len(text) <= COMMENT_LIMIT and text.rstrip().endswith("-->")
    summary = decode_digest(text)
    assert isinstance(summary, Digest) and summary.cells  # possibly partial, never missing
    assert f"<!-- {DIGEST_TAG} " in text[-20_000:]


def test_one_unreadable_cell_folder_is_one_errored_row(tmp_path, monkeypatch):
    write_cell(tmp_path / CELL, junit(case("test_ok")), env={"status": "passed"})
    locked = write_cell(tmp_path / "h200-2gpu-torch2.11.0-tf5.18.0", junit(case("test_ok")))
    # What EACCES on a folder nobody may enter looks like (chmod does not stop root, so fake the calls).
    for method in ("is_file", "open", "read_bytes", "iterdir"):
        real = getattr(Path, method)

        def refusing(path, *args, _real=real, **kwargs):
            if locked in path.parents or path == locked:
                raise PermissionError(13, "Permission denied", str(path))
            return _real(path, *args, **kwargs)

        monkeypatch.setattr(Path, method, refusing)
    real_open = os.open

    def refusing_open(path, *args, **kwargs):
        if locked in Path(path).parents:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)  # the reader opens contract files by descriptor
    cells = {cell.id: cell for cell in load_results([tmp_path]).cells}
    assert cells[CELL].status is CellStatus.PASSED
    locked_cell = cells["h200-2gpu-torch2.11.0-tf5.18.0"]
    assert locked_cell.status is CellStatus.ERRORED and "Permission denied" in locked_cell.reason


def test_a_comment_cut_past_the_last_rung_closes_its_fence_and_details():
    from harness.report import render as report

    body = "<details><summary>s</summary>\n\n````text\n" + "line\n" * 40_000 + "````\n\n</details>\n"
    text = report._fit(
        lambda limits, shortened: body + "<!-- harness-digest v1 AAAA -->\n",
        report.COMMENT_LADDER,
        report._github_length,
        10_000,
        unit="characters",
        keep_from="<!-- harness-digest v1 ",
    )
    assert len(text) <= 10_000 and text.endswith("<!-- harness-digest v1 AAAA -->\n")
    before_note = text[: text.index("✂️")]
    assert before_note.count("````") == 2 and before_note.count("</details>") == 1


def test_every_metric_the_contract_names_appears_in_some_rendering(tmp_path):
    """A metric the suite records and no report shows is a number nobody reads."""
    from harness import contract

    values = {name: f"{index + 1}.2345e-0{index + 1}" for index, name in enumerate(contract.CASE_METRICS)}
    values[contract.GRAD_ERROR_PARAM] = "model.layers.1.mlp.experts.gate_up_proj"
    values[contract.PEAK_ALLOCATED_PREFIX + "0"] = "3072"
    values[contract.WORLD_SIZE], values[contract.FAMILY] = "2", "qwen3_moe"  # a distributed case of it ran: covered
    suite = "".join(
        f'<property name="{name}" value="{value}"/>'
        for name, value in (
            (contract.EP_FAMILIES_DECLARED, "qwen3_moe,mixtral_declared_only"),
            (contract.EP_FAMILIES_COVERED, "qwen3_moe"),
            (contract.EP_FAMILIES_NOT_COVERED, html.escape('{"mixtral_declared_only": "a reason it cannot run"}')),
            (contract.TRANSFORMERS_VERSION, "5.99.1"),
        )
    )
    write_cell(tmp_path / CELL, junit(case("test_m", "", values), f"<properties>{suite}</properties>"))
    rendered = "\n".join(render(load_results([tmp_path]), fmt) for fmt in ("pr-comment", "summary", "terminal", "html"))
    shown = {
        contract.GRAD_ERROR: "1.23e-01",
        contract.GRAD_BOUND: "2.23e-02",
        contract.GRAD_ERROR_PARAM: "model.layers.1.mlp.experts.gate_up_proj",
        contract.ROUTING_MARGIN: "0.000423",
        contract.LOGITS_DIFFERENCE: "5.23e-05",
        contract.LOGITS_ATOL: "6.23e-06",
        contract.PEAK_ALLOCATED_PREFIX: "3.0 GiB",
        contract.EP_FAMILIES_COVERED: "EP families covered: 1 of 2 (transformers 5.99.1)",
        contract.EP_FAMILIES_NOT_COVERED: "a reason it cannot run",
        contract.EP_FAMILIES_DECLARED: "mixtral_declared_only",
    }
    assert set(shown) >= {*contract.CASE_METRICS, *contract.SUITE_PROPERTIES} - {contract.TRANSFORMERS_VERSION}
    for name, text in shown.items():
        assert text.replace("_", "\\_") in rendered or text in rendered, name


def test_a_memory_json_listing_thousands_of_gpus_reads_the_first_64(tmp_path):
    gpus = [{"index": index, "peak_used_mib": 1024.0} for index in range(20_000)]
    write_cell(
        tmp_path / CELL,
        junit(case("t")),
        env={"status": "passed"},
        memory=json.dumps({"schema": 1, "available": True, "gpus": gpus}),
    )
    [cell] = load_results([tmp_path]).cells
    assert len(cell.memory) == 64
    assert "memory.json: lists 20000 GPUs; the first 64 are read" in map(str, cell.problems)
    assert len(render(load_results([tmp_path]), "pr-comment")) <= COMMENT_LIMIT


def test_hostile_messages_add_no_markup_to_the_triage_table():
    from harness.report.triage_view import render_triage
    from harness.results.nightly_records import BisectRecord
    from harness.results.triage import Red, Triage, with_bisects

    # A triage.json is input to the nightly issue: its label, too, is escaped where it shows.
    red = Red(cell_id=CELL, test_id=f"tests/gpu/test_ep.py::test_bad[{HOSTILE}]", test_name="test_bad",
              message=HOSTILE, triage=Triage.REAL, cause=HOSTILE, label=HOSTILE, good={"transformers": "5.9.0"},
              bad={"transformers": "5.10.0"})
    rows = with_bisects([red], {CELL: BisectRecord(cell=CELL, line=HOSTILE)})
    assert_safe_markdown(render_triage(rows, baseline=True))
