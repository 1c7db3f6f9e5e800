"""Runs .github/workflows step by step the way a GitHub runner does, on this machine.

Per job: a fresh workspace and $RUNNER_TEMP, the GITHUB_OUTPUT / GITHUB_ENV / GITHUB_PATH /
GITHUB_STEP_SUMMARY files, `run:` steps under `bash --noprofile --norc -eo pipefail`, `${{ }}` expressions
evaluated from the event, inputs, matrix, needs and steps, job and step `if:` conditions, outputs.
actions/checkout is a git clone at the ref; the artifact actions are folders; setup-python is a fresh
venv of this machine's Python, first on PATH; a `uses: ./...` job runs the called workflow with its inputs.
Only what these workflows use is implemented; anything else raises, so the test cannot pass by ignoring it.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import yaml
from progress_watch import Stalled, run_while_progressing

# A step with no output and no CPU use in any of its processes for this long is stuck (a hang, a
# deadlock), whatever the machine's load.
STEP_STALL_SECONDS = 300

# --------------------------------------------------------------------------- expressions

TOKEN = re.compile(
    r"\s*(?:(?P<number>\d+(?:\.\d+)?)|(?P<string>'(?:[^']|'')*')|(?P<op>==|!=|&&|\|\||[!().,\[\]])"
    r"|(?P<name>[A-Za-z_][\w-]*))"
)


class Expression:
    """GitHub's expression language, the part these workflows use."""

    def __init__(self, text: str, context: dict[str, Any], status: dict[str, bool]) -> None:
        self.tokens = self._tokenize(text)
        self.position = 0
        self.context = context
        self.status = status

    @staticmethod
    def _tokenize(text: str) -> list[tuple[str, str]]:
        tokens, position = [], 0
        while position < len(text.rstrip()):
            match = TOKEN.match(text, position)
            if not match:
                raise ValueError(f"cannot read expression at {text[position:]!r}")
            kind = match.lastgroup
            tokens.append((kind, match.group(kind)))
            position = match.end()
        return tokens

    def evaluate(self) -> Any:
        value = self._or()
        if self.position != len(self.tokens):
            raise ValueError(f"unexpected {self.tokens[self.position]}")
        return value

    def _peek(self) -> tuple[str, str] | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def _take(self, op: str) -> bool:
        if self._peek() == ("op", op):
            self.position += 1
            return True
        return False

    def _or(self) -> Any:
        value = self._and()
        while self._take("||"):
            right = self._and()
            value = value if truthy(value) else right
        return value

    def _and(self) -> Any:
        value = self._compare()
        while self._take("&&"):
            right = self._compare()
            value = right if truthy(value) else value
        return value

    def _compare(self) -> Any:
        value = self._unary()
        while True:
            if self._take("=="):
                value = loose_equal(value, self._unary())
            elif self._take("!="):
                value = not loose_equal(value, self._unary())
            else:
                return value

    def _unary(self) -> Any:
        if self._take("!"):
            return not truthy(self._unary())
        return self._primary()

    def _primary(self) -> Any:
        token = self._peek()
        if token is None:
            raise ValueError("expression ends early")
        self.position += 1
        kind, text = token
        if kind == "number":
            return float(text)
        if kind == "string":
            return text[1:-1].replace("''", "'")
        if token == ("op", "("):
            value = self._or()
            if not self._take(")"):
                raise ValueError("missing )")
            return value
        if kind != "name":
            raise ValueError(f"unexpected {text!r}")
        if text in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[text]
        if self._take("("):
            arguments = []
            while not self._take(")"):
                arguments.append(self._or())
                self._take(",")
            return self._call(text, arguments)
        value = self.context.get(text)
        while True:
            if self._take("."):
                value = value.get(self.tokens[self.position][1]) if isinstance(value, dict) else None
                self.position += 1
            elif self._take("["):
                key = self._or()
                self._take("]")
                value = value.get(key) if isinstance(value, dict) else None
            else:
                return value

    def _call(self, name: str, arguments: list[Any]) -> Any:
        functions = {
            "success": lambda: self.status["success"],
            "failure": lambda: not self.status["success"],
            "always": lambda: True,
            "cancelled": lambda: False,
            "startsWith": lambda a, b: str(a or "").lower().startswith(str(b or "").lower()),
            "contains": lambda a, b: str(b).lower() in str(a).lower(),
            "format": lambda template, *values: re.sub(r"\{(\d+)\}", lambda m: as_text(values[int(m[1])]), template),
            "fromJSON": lambda text: json.loads(text),
            "toJSON": lambda value: json.dumps(value),
        }
        if name not in functions:
            raise ValueError(f"function {name} is not emulated")
        return functions[name](*arguments)


def truthy(value: Any) -> bool:
    return value not in (None, False, 0, 0.0, "") and value == value


def loose_equal(left: Any, right: Any) -> bool:
    if isinstance(left, str) and isinstance(right, str):
        return left.lower() == right.lower()
    return left == right


def as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def evaluate(value: Any, context: dict[str, Any], status: dict[str, bool] | None = None) -> Any:
    """A workflow value with its ${{ }} evaluated; a lone expression keeps its type (objects, lists)."""
    status = status or {"success": True}
    if isinstance(value, dict):
        return {key: evaluate(item, context, status) for key, item in value.items()}
    if isinstance(value, list):
        return [evaluate(item, context, status) for item in value]
    if not isinstance(value, str) or "${{" not in value:
        return value
    whole = re.fullmatch(r"\s*\$\{\{(.*?)\}\}\s*", value, re.S)
    if whole:
        return Expression(whole[1], context, status).evaluate()
    return re.sub(r"\$\{\{(.*?)\}\}", lambda m: as_text(Expression(m[1], context, status).evaluate()), value)


def condition(text: Any, context: dict[str, Any], status: dict[str, bool]) -> bool:
    """An `if:`; without a status function in it, success() is implied."""
    if text is None:
        return status["success"]
    text = str(text)
    inner = re.fullmatch(r"\s*\$\{\{(.*)\}\}\s*", text, re.S)
    text = inner[1] if inner else text
    if not re.search(r"\b(success|failure|always|cancelled)\(", text):
        text = f"success() && ({text})"
    return truthy(Expression(text, context, status).evaluate())


# --------------------------------------------------------------------------- the runner


@dataclasses.dataclass
class JobResult:
    result: str  # success | failure | skipped
    outputs: dict[str, str]
    log: str


@dataclasses.dataclass
class Runner:
    repository: Path  # the git repository the workflows belong to ("GitHub's" copy)
    work: Path
    github: dict[str, Any]  # the github context: event_name, event, sha, ref, repository, ...
    event_path: Path
    environ: dict[str, str]  # the machine's environment every step starts from
    vars: dict[str, str] = dataclasses.field(default_factory=dict)
    artifacts: Path = dataclasses.field(init=False)
    logs: list[str] = dataclasses.field(default_factory=list)
    summaries: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.artifacts = self.work / "artifacts"
        self.artifacts.mkdir(parents=True, exist_ok=True)
        # What setup-python provides, from the base interpreter (this test's venv has harness, editable).
        self.base_python = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"

    def run_workflow(
        self, name: str, inputs: dict[str, Any] | None = None, sha: str | None = None
    ) -> dict[str, JobResult]:
        """Every job of `.github/workflows/<name>` as of `sha` (the workflow's own commit)."""
        sha = sha or self.github["sha"]
        text = subprocess.run(
            ["git", "-C", str(self.repository), "show", f"{sha}:.github/workflows/{name}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        workflow = yaml.safe_load(text)
        declared = ((workflow.get(True) or workflow.get("on") or {}).get("workflow_call") or {}).get("inputs") or {}
        inputs = {key: (inputs or {}).get(key, spec.get("default", "")) for key, spec in declared.items()}
        results: dict[str, JobResult] = {}
        pending = dict(workflow["jobs"])
        while pending:
            ready = [
                job_id for job_id, job in pending.items() if all(need in results for need in as_list(job.get("needs")))
            ]
            if not ready:
                raise ValueError(f"{name}: jobs {sorted(pending)} wait on each other")
            for job_id in ready:
                results[job_id] = self.run_job(name, job_id, pending.pop(job_id), inputs, results, sha)
        return results

    def run_job(
        self, workflow: str, job_id: str, job: dict, inputs: dict, results: dict[str, JobResult], sha: str
    ) -> JobResult:
        needs = {
            need: {"result": results[need].result, "outputs": results[need].outputs}
            for need in as_list(job.get("needs"))
        }
        context = {
            "github": self.github,
            "inputs": inputs,
            "needs": needs,
            "vars": self.vars,
            "matrix": {},
            "steps": {},
            "env": {},
        }
        all_needed_ok = all(result["result"] == "success" for result in needs.values())
        if not condition(job.get("if"), context, {"success": all_needed_ok}):
            return JobResult("skipped", {}, f"{workflow}/{job_id}: skipped")
        if "uses" in job:
            called = job["uses"]
            if not called.startswith("./.github/workflows/"):
                raise ValueError(f"{workflow}/{job_id}: calls {called}, only ./ workflows are emulated")
            called_results = self.run_workflow(Path(called).name, evaluate(job.get("with") or {}, context), sha)
            ok = all(result.result != "failure" for result in called_results.values())
            for called_id, result in called_results.items():
                self.logs.append(f"--- {called}/{called_id}: {result.result}\n{result.log}")
            return JobResult("success" if ok else "failure", {}, "")
        matrix = evaluate((job.get("strategy") or {}).get("matrix"), context)
        entries = matrix["include"] if isinstance(matrix, dict) else [{}]
        runs = [self.run_steps(f"{workflow}/{job_id}", job, {**context, "matrix": entry}) for entry in entries]
        failed = [run for run in runs if run.result == "failure"]
        result = failed[0] if failed else runs[-1]
        self.logs.append(f"--- {workflow}/{job_id}: {result.result}\n{result.log}")
        return result

    def run_steps(self, label: str, job: dict, context: dict) -> JobResult:
        home = self.work / "jobs" / uuid.uuid4().hex[:8]
        workspace, temp = home / "workspace", home / "temp"
        workspace.mkdir(parents=True)
        temp.mkdir()
        files = {
            key: home / name
            for key, name in (
                ("GITHUB_OUTPUT", "output"),
                ("GITHUB_ENV", "env"),
                ("GITHUB_PATH", "path"),
                ("GITHUB_STEP_SUMMARY", "summary"),
            )
        }
        runner = {"temp": str(temp), "os": "Linux"}
        context = {**context, "runner": runner, "github": {**self.github, "workspace": str(workspace)}}
        extra_path: list[str] = []
        extra_env: dict[str, str] = {}
        success, log = True, [f"=== {label} {context['matrix'].get('id', '')}"]
        for index, step in enumerate(job.get("steps") or []):
            step_id = step.get("id", f"step{index}")
            status = {"success": success}
            if not condition(step.get("if"), context, status):
                context["steps"][step_id] = {"outputs": {}, "outcome": "skipped", "conclusion": "skipped"}
                continue
            env = {key: as_text(value) for key, value in evaluate(step.get("env") or {}, context, status).items()}
            for file in files.values():
                file.write_text("") if file.name == "output" else file.touch()
            environ = {
                **self.environ,
                **extra_env,
                **env,
                "PATH": os.pathsep.join([*extra_path, self.environ["PATH"]]),
                "GITHUB_ACTIONS": "true",
                "CI": "true",
                "RUNNER_TEMP": str(temp),
                "GITHUB_WORKSPACE": str(workspace),
                "GITHUB_EVENT_PATH": str(self.event_path),
                "GITHUB_EVENT_NAME": self.github["event_name"],
                "GITHUB_SHA": self.github["sha"],
                "GITHUB_REF": self.github["ref"],
                "GITHUB_REF_NAME": self.github["ref_name"],
                "GITHUB_REPOSITORY": self.github["repository"],
                "GITHUB_RUN_ID": self.github["run_id"],
                "GITHUB_RUN_ATTEMPT": "1",
                "GITHUB_SERVER_URL": "https://github.com",
                **{key: str(path) for key, path in files.items()},
            }
            if "uses" in step:
                ok, text = self.action(step, evaluate(step.get("with") or {}, context, status), workspace, extra_path)
            else:
                ok, text = self.shell(evaluate(step["run"], context, status), workspace, environ, temp)
            title = step.get("name") or step.get("uses") or step_id
            log.append(f"--- step {title}: {'ok' if ok else 'failed'}\n{text}")
            outputs = read_key_values(files["GITHUB_OUTPUT"])
            extra_env.update(read_key_values(files["GITHUB_ENV"]))
            extra_path[:0] = [line for line in files["GITHUB_PATH"].read_text().splitlines()[::-1] if line]
            summary = files["GITHUB_STEP_SUMMARY"].read_text()
            if summary:
                self.summaries.append(summary)
            context["steps"][step_id] = {
                "outputs": outputs,
                "outcome": "success" if ok else "failure",
                "conclusion": "success" if ok else "failure",
            }
            success = success and ok
        outputs = {key: as_text(value) for key, value in evaluate(job.get("outputs") or {}, context).items()}
        return JobResult("success" if success else "failure", outputs, "\n".join(log))

    def shell(self, script: str, workspace: Path, environ: dict[str, str], temp: Path) -> tuple[bool, str]:
        path = temp / f"step-{uuid.uuid4().hex[:8]}.sh"
        path.write_text(script)
        # No wall-clock limit: a step on a busy machine is slow, not stuck; it fails only when it stalls.
        try:
            done = run_while_progressing(
                ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(path)],
                stall_seconds=STEP_STALL_SECONDS, cwd=workspace, env=environ,
            )
        except Stalled as stalled:
            return False, f"{stalled.output}\n{stalled}"
        return done.returncode == 0, done.stdout

    def action(self, step: dict, given: dict, workspace: Path, extra_path: list[str]) -> tuple[bool, str]:
        name = step["uses"].split("@")[0]
        if name == "actions/checkout":
            ref = given.get("ref") or self.github["sha"]
            subprocess.run(["git", "clone", "-q", "--no-checkout", str(self.repository), str(workspace)], check=True)
            done = subprocess.run(
                ["git", "-C", str(workspace), "checkout", "-q", "--detach", ref], capture_output=True, text=True
            )
            return done.returncode == 0, done.stdout + done.stderr
        if name == "actions/setup-python":
            # A Python of the job's own, first on PATH, where `pip install` puts scripts that PATH finds,
            # as the tool cache's does; never this machine's base interpreter.
            toolcache = workspace.parent / "python"
            done = subprocess.run([str(self.base_python), "-m", "venv", str(toolcache)], capture_output=True, text=True)
            extra_path.insert(0, str(toolcache / "bin"))
            return done.returncode == 0, f"python {sys.version.split()[0]} at {toolcache}{done.stderr}"
        if name == "actions/upload-artifact":
            source = Path(given["path"])
            source = source if source.is_absolute() else workspace / source
            if not source.exists():
                return given.get("if-no-files-found") != "error", f"no files at {source}"
            target = self.artifacts / given["name"]
            if source.is_dir():
                shutil.copytree(source, target, dirs_exist_ok=True)
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target / source.name)
            return True, f"uploaded {given['name']}"
        if name == "actions/download-artifact":
            if given.get("run-id"):
                return False, "downloads from another run are not emulated"
            target = workspace / given.get("path", ".")
            names = sorted(
                p.name
                for p in self.artifacts.iterdir()
                if fnmatch.fnmatchcase(p.name, given.get("pattern") or given.get("name") or "*")
            )
            for artifact in names:
                # One artifact by name, or merge-multiple: its files land in path itself; else path/<name>/.
                merged = bool(given.get("name")) or str(given.get("merge-multiple")).lower() == "true"
                shutil.copytree(self.artifacts / artifact, target if merged else target / artifact, dirs_exist_ok=True)
            return True, f"downloaded {names}"
        raise ValueError(f"action {name} is not emulated")


def as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def read_key_values(path: Path) -> dict[str, str]:
    """GITHUB_OUTPUT / GITHUB_ENV: `key=value` lines and `key<<DELIMITER` blocks."""
    values, lines = {}, path.read_text().splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            key, delimiter = line.split("<<", 1)
            end = lines.index(delimiter, index + 1)
            values[key] = "\n".join(lines[index + 1 : end])
            index = end + 1
            continue
        if "=" in line:
            key, value = line.split("=", 1)
            values[key] = value
        index += 1
    return values
