"""Cost and wait (issue 33): GPU-hours = the GPUs env.json lists x its start -> end, wait = the jobs API's created_at ->
started_at as `harness gh run-links` read it from fake_github; per cell and in all, in the PR comment's head line and
table, the job summary, the terminal and the nightly issue. Every time is untrusted: missing, malformed, without an
offset, not a string, negative or a year long reads as unknown, never as 0 and never as a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fake_github import REPO

from harness.cli import main
from harness.report.cost import MAX_SPAN_S, plausible_span, run_cost
from harness.report.filters import gpu_hours, span
from harness.results import load_results

SAMPLES = Path(__file__).parent / "golden" / "samples"
SERVER = "https://github.com"
RUN_ID = "42"
RUN = f"{SERVER}/{REPO}/actions/runs/{RUN_ID}"
ADA = "ada-2gpu-torch2.11.0-tf5.9.0"
CPU = "cpu-2rank-torch2.13.0-tf5.24.0"
GB200 = "gb200-4gpu-torch2.12.0-tf5.24.0"
H200_2 = "h200-2gpu-torch2.11.0-tf5.18.0"
H200_8 = "h200-8gpu-torch2.11.0-tf5.18.0"

# The samples' cells ran from 02:00:00 for their duration_s (in whole seconds): ada 2 GPUs x 754 s, cpu 0 GPUs,
# gb200 4 x 512 s, h200 2 x 402 s, h200 8 x 95 s: 1.42 GPU-hours.
SAMPLE_GPU_HOURS = (2 * 754 + 4 * 512 + 2 * 402 + 8 * 95) / 3600

# Each sample cell's job, as the jobs API gives it: one honest wait of 6 min, one of 42 s, and hostile times.
JOB_TIMES = {
    ADA: {"created_at": "2026-01-14T01:54:00Z", "started_at": "2026-01-14T02:00:00Z",
          "completed_at": "2026-01-14T02:13:00Z"},
    CPU: {"created_at": "2026-01-14T01:59:18+00:00", "started_at": "2026-01-14T03:00:00+01:00"},  # 42 s, two zones
    GB200: {"created_at": "2026-01-14T02:00:00Z", "started_at": "2026-01-14T01:50:00Z"},  # started before created
    H200_2: {"created_at": "2025-01-14T02:00:00Z", "started_at": "2026-01-14T02:00:00Z"},  # a year in the queue
    H200_8: {"created_at": 1768356000, "started_at": "yesterday", "completed_at": "2026-01-14T02:02:00",  # no offset
             },
}


@pytest.fixture
def actions(env, monkeypatch):
    """An Actions step of run 42 whose API is fake_github."""
    monkeypatch.setenv("GITHUB_RUN_ID", RUN_ID)
    monkeypatch.setenv("GITHUB_SERVER_URL", SERVER)
    monkeypatch.setenv("GITHUB_RUN_ATTEMPT", "1")
    return env


def run_links(fake, tmp_path: Path, times: dict[str, dict]) -> Path:
    fake.jobs = {int(RUN_ID): [{"id": index, "name": f"gpu-tests / {cell_id}", "html_url": f"{RUN}/job/{index}",
                                **job_times} for index, (cell_id, job_times) in enumerate(times.items(), 1)]}
    out = tmp_path / "links.json"
    assert main(["gh", "run-links", "-o", str(out)]) == 0
    return out


def rendered(tmp_path: Path, fmt: str, *extra: str, results: Path = SAMPLES / "run") -> str:
    out = tmp_path / f"report.{fmt}"
    assert main(["report", str(results), "--format", fmt, "-o", str(out), *extra]) == 0
    return out.read_text()


def test_run_links_keeps_only_times_with_an_offset_in_utc(fake, actions, tmp_path):
    timings = json.loads(run_links(fake, tmp_path, JOB_TIMES).read_text())["timings"]
    assert timings[ADA] == {"created_at": "2026-01-14T01:54:00+00:00", "started_at": "2026-01-14T02:00:00+00:00",
                            "completed_at": "2026-01-14T02:13:00+00:00"}
    assert timings[CPU] == {"created_at": "2026-01-14T01:59:18+00:00", "started_at": "2026-01-14T02:00:00+00:00"}
    # a number, a word and a time without its zone are dropped; which times disagree is the report's to judge
    assert timings[H200_8] == {}
    assert timings[GB200] == {"created_at": "2026-01-14T02:00:00+00:00", "started_at": "2026-01-14T01:50:00+00:00"}


def test_the_pr_comment_says_cost_and_wait_per_cell_and_in_all(fake, actions, tmp_path):
    assert f"{SAMPLE_GPU_HOURS:.1f}" == "1.4"
    links = run_links(fake, tmp_path, JOB_TIMES)
    text = rendered(tmp_path, "pr-comment", "--links", str(links))
    head = text.splitlines()[1]
    # three cells' waits are not to be trusted (before created, a year, malformed): unknown, and counted
    assert head.endswith(" · 5 cells, 1.4 GPU-hours, longest wait 6 min (3 cells without timings)"), head
    rows = {line.split(" | ")[1]: line.split(" | ") for line in text.splitlines() if line.startswith("| ")}
    header = rows["GPU"]
    gpu_h, wait = header.index("GPU-h"), header.index("wait")
    assert [rows[gpu][gpu_h] for gpu in ("ada", "cpu", "gb200")] == ["0.4", "0", "0.6"]  # a cpu cell costs 0
    assert [rows[gpu][wait] for gpu in ("ada", "cpu", "gb200")] == ["6 min", "42 s", "—"]
    assert f"[job]({RUN}/job/1)" in rows["ada"][-1]  # its wait and its job link come from the same job


def test_the_job_summary_has_the_same_head_line(fake, actions, tmp_path):
    links = run_links(fake, tmp_path, {ADA: JOB_TIMES[ADA]})
    text = rendered(tmp_path, "summary", "--links", str(links))
    # one job's times known: the other four cells have no wait
    assert " · 5 cells, 1.4 GPU-hours, longest wait 6 min (4 cells without timings)\n" in text


def test_the_html_report_says_cost_and_wait_per_cell_and_in_all(fake, actions, tmp_path):
    links = run_links(fake, tmp_path, JOB_TIMES)
    page = rendered(tmp_path, "html", "--links", str(links))
    assert '<p class="cost">5 cells, 1.4 GPU-hours, longest wait 6 min (3 cells without timings)</p>' in page
    assert '<th title="GPUs x wall time">GPU-h</th>' in page
    cells = page[page.index("<h2>Cells</h2>"):]
    ada = cells[cells.index(f"<code>{ADA}</code>"):cells.index(f"<code>{CPU}</code>")]
    cpu = cells[cells.index(f"<code>{CPU}</code>"):cells.index(f"<code>{GB200}</code>")]
    assert '<span class="muted">6 min</span></td><td class="n">0.4</td></tr>' in ada  # wait under time, then GPU-h
    assert '<span class="muted">42 s</span></td><td class="n">0</td></tr>' in cpu


def test_without_job_timings_the_wait_is_unknown_not_zero(tmp_path, monkeypatch):
    for key in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    text = rendered(tmp_path, "pr-comment")
    assert text.splitlines()[1].endswith(" · 5 cells, 1.4 GPU-hours, wait unknown")
    # the terminal of a local run has no queue: GPU-hours only
    assert "\n5 cells, 1.4 GPU-hours\n" in rendered(tmp_path, "terminal")
    page = rendered(tmp_path, "html")  # so has the HTML report's
    assert '<p class="cost">5 cells, 1.4 GPU-hours</p>' in page and ">wait<" not in page


def test_a_links_file_from_before_timings_still_reads(actions, tmp_path):
    links = tmp_path / "links.json"
    links.write_text(json.dumps({"jobs": {ADA: f"{RUN}/job/7"}, "artifacts": {}}))
    assert "5 cells, 1.4 GPU-hours, wait unknown" in rendered(tmp_path, "pr-comment", "--links", str(links))


@pytest.mark.parametrize(("timings", "complaint"), [
    ([], "timings: expected an object of job to its times"),
    ({ADA: "2026-01-14T02:00:00Z"}, "timings: expected an object of job to its times"),
    ({ADA: {"started_at": "soon"}}, "timings: started_at 'soon' for 'ada-2gpu-torch2.11.0-tf5.9.0' is not an ISO 8601"),
    ({ADA: {"created_at": 5}}, "timings: created_at '5' for 'ada-2gpu-torch2.11.0-tf5.9.0' is not an ISO 8601"),
])
def test_a_links_file_with_bad_timings_is_one_line_and_exit_2(actions, tmp_path, capsys, timings, complaint):
    links = tmp_path / "links.json"
    links.write_text(json.dumps({"jobs": {}, "artifacts": {}, "timings": timings}))
    assert main(["report", str(SAMPLES / "run"), "--format", "pr-comment", "--links", str(links)]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and error.startswith(f"harness: error: --links {links}: {complaint}")


def sample_cell(tmp_path: Path, cell_id: str = ADA, **env_fields: object) -> Path:
    """A sample cell's folder with env.json's fields replaced (None: removed)."""
    folder, artifact = tmp_path / "results" / cell_id, SAMPLES / "run" / f"results-{cell_id}"
    shutil.copytree(artifact / cell_id if (artifact / cell_id).is_dir() else artifact, folder)
    env = json.loads((folder / "env.json").read_text())
    for key, value in env_fields.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    (folder / "env.json").write_text(json.dumps(env))
    return folder


@pytest.mark.parametrize(("fields", "gpus", "wall_s"), [
    ({}, 2, 754.0),
    ({"end": None}, 2, None),  # never ended: unknown, not 0
    ({"end": "2026-01-14T01:00:00+00:00"}, 2, None),  # ended before it started
    ({"end": "2026-01-24T02:00:00+00:00"}, 2, None),  # ten days
    ({"start": "2026-01-14T02:00:00"}, 2, None),  # no offset: any zone
    ({"start": 1768356000}, 2, None),
    ({"start": "2026-01-14T02:00:00+00:00" + " " * 100}, 2, None),  # longer than any time
    ({"gpus": []}, 2, 754.0),  # none listed: the cell's own count (an engine's cell)
    ({"gpus": [], "cell": {"id": ADA, "gpu": "ada", "gpus": "two"}}, None, 754.0),
    ({"gpus": [{"index": 0}, "GPU-1", {"index": 1}, {"index": 2}]}, 3, 754.0),  # only the GPU records count
])
def test_a_cells_gpus_and_wall_time_are_read_untrusted(tmp_path, fields, gpus, wall_s):
    sample_cell(tmp_path, **fields)
    [cost] = run_cost(load_results([tmp_path / "results"]).cells, None).cells
    assert (cost.gpus, cost.wall_s) == (gpus, wall_s)
    expected = None if gpus is None or wall_s is None else gpus * wall_s / 3600
    assert cost.gpu_hours == expected


def test_a_cell_without_its_end_is_counted_apart_from_the_sum(tmp_path, monkeypatch):
    for key in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    sample_cell(tmp_path, ADA, end=None)
    sample_cell(tmp_path, H200_2)
    text = rendered(tmp_path, "pr-comment", results=tmp_path / "results")
    assert " · 2 cells, 0.2 GPU-hours, wait unknown (1 cell without timings)" in text
    assert "\n2 cells, 0.2 GPU-hours (1 cell without GPU-hours)\n" in rendered(tmp_path, "terminal",
                                                                                results=tmp_path / "results")


def test_the_nightly_issue_head_line_says_the_nights_cost_and_wait(fake, actions, tmp_path):
    links = run_links(fake, tmp_path, JOB_TIMES)
    argv = ["gh", "nightly-issue", "--results", str(SAMPLES / "run"), "--sha", "4f1c2a9e7d3b", "--links", str(links)]
    assert main(argv) == 0
    [issue] = fake.issues.values()
    first_line = issue["body"].splitlines()[1]
    assert first_line == (f"Nightly `nightly` on `4f1c2a9e7d3b` ([run]({RUN})): 5 cells, 1.4 GPU-hours, longest wait "
                          "6 min (3 cells without timings); compared with no earlier results (first night, or they "
                          "expired):")


@pytest.mark.parametrize(("seconds", "shown"), [
    (None, "unknown"), (0, "0 s"), (42.4, "42 s"), (59.4, "59 s"), (59.6, "1 min"), (360, "6 min"),
    (3569, "59 min"), (3600, "1.0 h"), (5400, "1.5 h"),
])
def test_waits_read_in_humane_units(seconds, shown):
    assert span(seconds) == shown


@pytest.mark.parametrize(("hours", "shown"), [
    (None, "unknown"), (0.0, "0"), (0.004, "<0.01"), (0.04, "0.04"), (1.26, "1.3"), (12.0, "12.0"),
])
def test_gpu_hours_keep_small_runs_visible(hours, shown):
    assert gpu_hours(hours) == shown


@pytest.mark.parametrize(("seconds", "kept"), [(-1.0, False), (0.0, True), (MAX_SPAN_S, True),
                                               (MAX_SPAN_S + 1, False), (None, False)])
def test_only_plausible_spans_are_kept(seconds, kept):
    assert (plausible_span(seconds) is not None) is kept
