"""The safety rules the issue lists for .github/workflows, each a function returning violations, and zizmor as
the CI job runs it: test_workflows.py holds harness's own workflows to them, test_adopt.py the callers' workflows
`harness init` writes."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

# The only actions in use, pinned to the commits of released tags (see the project's pins list).
PINS = {
    "actions/checkout": ("3d3c42e5aac5ba805825da76410c181273ba90b1", "v7.0.1"),
    "actions/upload-artifact": ("bbbca2ddaa5d8feaa63e36b76fdaad77386f024f", "v7.0.0"),
    "actions/download-artifact": ("3e5f45b2cfb9172054b4087a40e8e0b5a5461e7c", "v8.0.1"),
    "astral-sh/setup-uv": ("20cfd1bf945f4377ade1205e4dbc17946fc9a30d", "v10.0.1"),
    "actions/setup-python": ("5fda3b95a4ea91299a34e894583c3862153e4b97", "v7.0.0"),
}
# Write access, job by job: anything more is a review question, not a silent change.
WRITE_PERMISSIONS = {
    ("gpu-tests.yml", "comment"): {"pull-requests"},
    ("ok-to-test.yml", "authorize"): {"pull-requests"},
    ("ok-to-test.yml", "gpu-tests"): {"pull-requests"},
    ("nightly.yml", "gpu-tests"): {"pull-requests"},
    ("nightly.yml", "regression"): {"issues"},
}
UNTRUSTED_TRIGGERS = {"pull_request", "pull_request_target", "workflow_run"}
GITHUB_HOSTED = re.compile(r"(ubuntu|windows|macos)-[\w.-]+")


# --------------------------------------------------------------------------- reading


def load(text: str) -> dict:
    workflow = yaml.safe_load(text)
    # YAML 1.1 reads the key `on` as True.
    if True in workflow:
        workflow["on"] = workflow.pop(True)
    return workflow


def triggers(workflow: dict) -> set[str]:
    on = workflow.get("on") or {}
    if isinstance(on, str):
        return {on}
    return set(on) if isinstance(on, (dict, list)) else set()


def jobs(workflow: dict) -> dict[str, dict]:
    return workflow.get("jobs") or {}


def steps(workflow: dict) -> list[tuple[str, dict]]:
    return [(name, step) for name, job in jobs(workflow).items() for step in job.get("steps") or []]


def walk(node, path: tuple = ()):
    """Every (path, scalar) in a parsed workflow."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk(value, (*path, str(key)))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk(value, (*path, str(index)))
    else:
        yield path, node


# --------------------------------------------------------------------------- rules


def top_level_permissions_empty(workflow: dict, text: str, name: str) -> list[str]:
    if workflow.get("permissions") != {}:
        return [f"top-level permissions is {workflow.get('permissions')!r}, not {{}}"]
    return []


def jobs_ask_for_least(workflow: dict, text: str, name: str) -> list[str]:
    problems = []
    for job_id, job in jobs(workflow).items():
        permissions = job.get("permissions")
        if not isinstance(permissions, dict):
            problems.append(f"job {job_id}: permissions must be a mapping, got {permissions!r}")
            continue
        writes = {scope for scope, level in permissions.items() if level == "write"}
        allowed = WRITE_PERMISSIONS.get((name, job_id), set())
        if writes - allowed:
            problems.append(f"job {job_id}: write access to {sorted(writes - allowed)} is not allowed")
    return problems


def uses_pinned(workflow: dict, text: str, name: str) -> list[str]:
    problems = []
    for line_number, line in enumerate(text.splitlines(), 1):
        match = re.match(r"\s*(?:-\s+)?uses:\s*(\S+)(.*)", line)
        if not match or match.group(1).startswith("./"):
            continue
        target, rest = match.groups()
        pinned = re.fullmatch(r"([\w.-]+/[\w.-]+)(/[^@]*)?@([0-9a-f]{40})", target)
        tag = re.match(r"\s*#\s*(v[\w.-]+)", rest)
        if not pinned or not tag:
            problems.append(f"line {line_number}: {target} is not pinned as owner/name@<40-hex sha> # <tag>")
        elif PINS.get(pinned.group(1)) != (pinned.group(3), tag.group(1)):
            problems.append(f"line {line_number}: {target} # {tag.group(1)} is not a known pin")
    return problems


def checkout_without_credentials(workflow: dict, text: str, name: str) -> list[str]:
    problems = []
    for job_id, step in steps(workflow):
        if str(step.get("uses", "")).startswith("actions/checkout@"):
            value = (step.get("with") or {}).get("persist-credentials")
            if value is not False and str(value).lower() != "false":
                problems.append(f"job {job_id}: checkout without persist-credentials: false")
    return problems


def no_inherited_secrets(workflow: dict, text: str, name: str) -> list[str]:
    problems = []
    for job_id, job in jobs(workflow).items():
        if "secrets" in job:
            problems.append(f"job {job_id}: passes secrets ({job['secrets']!r}) to a called workflow")
    if "secrets." in text:
        problems.append("uses a repository secret; these workflows need only github.token")
    return problems


def no_expressions_in_scripts(workflow: dict, text: str, name: str) -> list[str]:
    # Stricter than "no event text": nothing is expanded into a script, values arrive as env.
    return [f"job {job_id}: run script contains ${{{{ }}}}: {step['run'].strip()[:60]!r}"
            for job_id, step in steps(workflow) if "${{" in str(step.get("run", ""))]


# Event fields that are numbers GitHub assigns, not text anyone typed: safe in a concurrency group.
EVENT_NUMBERS = re.compile(r"github\.event\.(issue\.number|pull_request\.number|comment\.id)\b")


def event_text_only_in_conditions(workflow: dict, text: str, name: str) -> list[str]:
    problems = []
    for path, value in walk(workflow):
        if not isinstance(value, str) or path[-1] == "if":
            continue
        if re.search(r"github\.(event\.|head_ref)", EVENT_NUMBERS.sub("", value)):
            problems.append(f"{'.'.join(path)} reads event text outside an if: condition")
    return problems


def may_be_self_hosted(job: dict) -> bool:
    """True unless runs-on is a literal GitHub-hosted label; an expression may name any runner."""
    runs_on = job.get("runs-on")
    labels = runs_on if isinstance(runs_on, list) else [runs_on]
    return not all(isinstance(label, str) and GITHUB_HOSTED.fullmatch(label) for label in labels)


def reachable_triggers(workflows: dict[str, dict]) -> dict[str, set[str]]:
    """Each workflow's triggers, including those of every workflow that calls it (transitively)."""
    reach = {name: triggers(workflow) - {"workflow_call"} for name, workflow in workflows.items()}
    changed = True
    while changed:
        changed = False
        for caller, workflow in workflows.items():
            for job in jobs(workflow).values():
                uses = str(job.get("uses", ""))
                called = Path(uses).name if uses.startswith("./") else ""
                if called in reach and not reach[caller] <= reach[called]:
                    reach[called] |= reach[caller]
                    changed = True
    return reach


def self_hosted_unreachable_from_untrusted(workflows: dict[str, dict]) -> list[str]:
    reach = reachable_triggers(workflows)
    return [f"{name}: job {job_id} may run self-hosted and is reachable from {sorted(untrusted)}"
            for name, workflow in workflows.items() for job_id, job in jobs(workflow).items()
            if (untrusted := reach[name] & UNTRUSTED_TRIGGERS) and "steps" in job and may_be_self_hosted(job)]


RULES = [top_level_permissions_empty, jobs_ask_for_least, uses_pinned, checkout_without_credentials,
         no_inherited_secrets, no_expressions_in_scripts, event_text_only_in_conditions]


# --------------------------------------------------------------------------- external checkers


def tool(name: str) -> str:
    """The checker beside this interpreter or on PATH. Missing is a failure: CI installs them."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed; pip install -e '.[dev]' brings it")
    return found


def zizmor(*paths: Path) -> subprocess.CompletedProcess:
    # The auditor persona: every finding, pedantic ones included (ci.yml runs the same).
    command = [tool("zizmor"), "--offline", "--persona", "auditor", "--format", "json", "--no-progress",
               *map(str, paths)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)
