"""The JobSet engine: rendered manifests for 1, 4 and 18 hosts validate against the JobSet CRD's schema
(kubernetes-sigs/jobset v0.12.0, made strict: no unknown field; tests/unit/data), their NetworkPolicies against
NetworkPolicy v1's (strict, tests/unit/data), broken ones are refused, and the kubectl driver runs against a
stand-in kubectl on PATH (no API server can run here)."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from harness.engines import jobset
from harness.errors import ConfigError
from harness.plan.matrix import expand
from harness.plan.runners import read_runners

SCHEMA = Path(__file__).parent / "data" / "jobset-v0.12.0-strict.schema.json"
POLICY_SCHEMA = Path(__file__).parent / "data" / "networkpolicy-v1-strict.schema.json"
RUNNERS = {"gb200": {"labels": ["gpu-gb200"], "gpus": 4, "engine": "jobset", "hosts": 18,
                     "submit": {"image": "ghcr.io/org/harness-cell:py3.11", "namespace": "ml",
                                "results_claim": "harness-results"}},
           "cpu-k8s": {"labels": ["k8s"], "gpus": 0, "ranks": 2, "engine": "jobset", "hosts": 4,
                       "submit": {"image": "ghcr.io/org/harness-cell:cpu"}}}


def cell(tmp_path: Path, gpu: str, hosts: int, gpus: int):
    path = tmp_path / "runners.yaml"
    path.write_text(json.dumps(RUNNERS))
    spec = {"axes": {"gpu": [gpu], "hosts": [hosts], "gpus": [gpus], "torch": ["2.13.0"], "transformers": ["5.24.0"]}}
    return expand(spec, read_runners(path), name="m", source="m.yaml")[0]


def validate(tmp_path: Path, manifests: dict[str, dict], schema: Path = SCHEMA) -> tuple[int, str]:
    """check-jsonschema over every manifest at once (one start of it: seconds on a busy machine)."""
    checker = shutil.which("check-jsonschema") or str(Path(sys.executable).parent / "check-jsonschema")
    if not Path(checker).exists():
        pytest.skip("check-jsonschema is not installed (the dev extra has it)")
    paths = []
    for name, manifest in manifests.items():
        paths.append(tmp_path / f"{name}.yaml")
        paths[-1].write_text(yaml.safe_dump(manifest))
    result = subprocess.run([checker, "--schemafile", str(schema), *map(str, paths)], capture_output=True, text=True)
    return result.returncode, result.stdout + result.stderr


def rendered(tmp_path: Path, gpu: str, hosts: int, gpus: int) -> dict:
    one = cell(tmp_path, gpu, hosts, gpus)
    name = jobset.jobset_name(one, "r1")
    command = jobset.host_command(one, ["python", "-m", "pytest", "tests/gpu"], name, jobset.HUB_PORT,
                                  tmp_path / "results" / one.id)
    return jobset.render(one, name, command, 1800, results_root=tmp_path / "results")


SHAPES = [("gb200", 1, 4), ("gb200", 4, 4), ("gb200", 18, 4), ("cpu-k8s", 4, 2)]


def test_rendered_jobsets_validate(tmp_path):
    manifests = {f"{gpu}-{hosts}x{gpus}": rendered(tmp_path, gpu, hosts, gpus) for gpu, hosts, gpus in SHAPES}
    code, output = validate(tmp_path, manifests)
    assert code == 0, output
    for (gpu, hosts, gpus), manifest in zip(SHAPES, manifests.values(), strict=True):
        spec = manifest["spec"]
        job = spec["replicatedJobs"][0]["template"]["spec"]
        assert job["parallelism"] == job["completions"] == hosts and job["completionMode"] == "Indexed"
        assert spec["coordinator"] == {"replicatedJob": "hosts", "jobIndex": 0, "podIndex": 0}
        assert spec["failurePolicy"] == {"maxRestarts": 0} and job["backoffLimit"] == 0
        container = job["template"]["spec"]["containers"][0]
        host0 = f"--host0={manifest['metadata']['name']}-hosts-0-0.{spec['network']['subdomain']}"
        assert host0 in container["args"]
        limits = container.get("resources", {}).get("limits")
        assert limits == ({"nvidia.com/gpu": gpus} if gpu == "gb200" else None)
        # The cell's credentials: a Secret's volume, read-only, the owner's alone; the host is told the path.
        assert {"name": "cell-credentials", "secret": {"secretName": f"{manifest['metadata']['name']}-tls",
                                                       "defaultMode": 0o400}} in job["template"]["spec"]["volumes"]
        assert {"name": "cell-credentials", "mountPath": jobset.CREDENTIALS_MOUNT, "readOnly": True} in \
            container["volumeMounts"]
        assert f"--credentials={jobset.CREDENTIALS_MOUNT}/cell.pem" in container["args"]
        assert f"--hub-port={jobset.HUB_PORT}" in container["args"]
        assert "secretKeyRef" not in yaml.safe_dump(manifest)  # no secret in any environment


def test_rendered_network_policies_admit_only_the_jobsets_own_pods(tmp_path):
    policies = {}
    for gpu, hosts, gpus in SHAPES:
        one = cell(tmp_path, gpu, hosts, gpus)
        policies[f"{gpu}-{hosts}x{gpus}"] = jobset.render_network_policy(one, jobset.jobset_name(one, "r1"))
    broken = copy.deepcopy(policies["cpu-k8s-4x2"])
    broken["spec"]["podSelecter"] = broken["spec"].pop("podSelector")
    policies["podSelecter"] = broken
    code, output = validate(tmp_path, policies, POLICY_SCHEMA)
    assert code != 0 and "podSelecter.yaml" in output and "'podSelecter' was unexpected" in output, output
    assert [line for line in output.splitlines() if "x4.yaml" in line or "x2.yaml" in line] == [], output
    for name, policy in policies.items():
        if name == "podSelecter":
            continue
        pods = {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": policy["metadata"]["name"]}}
        assert policy["spec"] == {"podSelector": pods, "policyTypes": ["Ingress"], "ingress": [{"from": [
            {"podSelector": pods}]}]}  # no other peer, no namespace, no address block: the JobSet's pods alone
        assert policy["metadata"].get("namespace") == ("ml" if name.startswith("gb200") else None)


BROKEN = {
    "parallelism-two": (lambda m: m["spec"]["replicatedJobs"][0]["template"]["spec"].update(parallelism="two"),
                        "'two' is not of type 'integer'"),
    "backofLimit": (lambda m: m["spec"]["replicatedJobs"][0]["template"]["spec"].update(backofLimit=0),
                    "'backofLimit' was unexpected"),
}


def test_broken_manifests_are_refused(tmp_path):
    manifests = {}
    for name, (break_it, _) in BROKEN.items():
        manifests[name] = copy.deepcopy(rendered(tmp_path, "gb200", 4, 4))
        break_it(manifests[name])
    code, output = validate(tmp_path, manifests)
    assert code != 0
    for name, (_, why) in BROKEN.items():
        assert f"{name}.yaml" in output and why in output, output


def test_a_runner_without_an_image_is_refused(tmp_path):
    one = cell(tmp_path, "gb200", 2, 4)
    options = dataclasses.replace(one.submit, items=tuple(item for item in one.submit.items if item[0] != "image"))
    bare = dataclasses.replace(one, submit=options)
    with pytest.raises(ConfigError, match=r"submit\.image"):
        jobset.render(bare, "h-x-1", ["harness", "host"], 60)


STANDIN = textwrap.dedent("""\
    #!{python}
    # A stand-in kubectl: records each call; jobsets reach STANDIN_STATE on the third `get`.
    import json, os, stat, sys
    from pathlib import Path
    state_dir = Path(os.environ["STANDIN_DIR"])
    args = sys.argv[1:]
    if args[:1] == ["--namespace"]:
        args = args[2:]
    record = {{"args": args}}
    if args[:3] == ["create", "secret", "generic"]:
        key_file = Path(args[4].split("=", 2)[2])  # --from-file=cell.pem=PATH
        record["key_mode"] = oct(stat.S_IMODE(key_file.stat().st_mode))
        record["folder_mode"] = oct(stat.S_IMODE(key_file.parent.stat().st_mode))
        record["key_file"] = str(key_file)
        record["pem"] = key_file.read_text()
    if args[:3] == ["apply", "-f", "-"]:
        (state_dir / "applied.yaml").write_text(sys.stdin.read())
    with (state_dir / "calls.jsonl").open("a") as calls:
        calls.write(json.dumps(record) + "\\n")
    if args[:2] == ["get", "jobset"]:
        polls = state_dir / "polls"
        count = int(polls.read_text()) + 1 if polls.exists() else 1
        polls.write_text(str(count))
        print(os.environ["STANDIN_STATE"] if count >= 3 else "", end="")
    elif args[:1] == ["logs"]:
        index = args[2].rsplit("=", 1)[1]
        print(f"harness host {{index}} says hello")
    """)


@pytest.fixture
def kubectl(tmp_path, monkeypatch):
    folder = tmp_path / "bin"
    folder.mkdir()
    path = folder / "kubectl"
    path.write_text(STANDIN.format(python=sys.executable))
    path.chmod(0o755)
    state = tmp_path / "standin"
    state.mkdir()
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STANDIN_DIR", str(state))
    monkeypatch.setattr(jobset, "POLL_S", 0.01)
    return state


def calls(state: Path) -> list[dict]:
    return [json.loads(line) for line in (state / "calls.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(("terminal", "expected"), [("Completed", (0, None)), ("Failed", (None, "ended Failed"))])
def test_driver_applies_waits_collects_and_deletes(tmp_path, kubectl, monkeypatch, terminal, expected):
    monkeypatch.setenv("STANDIN_STATE", terminal)
    one = cell(tmp_path, "gb200", 4, 4)
    folder = tmp_path / "results" / one.id
    folder.mkdir(parents=True)
    lines, record = [], {}
    exit_code, cause = jobset.run_job(one, folder=folder, pytest_command=["python", "-m", "pytest"],
                                      log=lines.append, record=record)
    assert exit_code == expected[0]
    # the JobSet's end says no more than that it failed: the engine's kind, which triage takes for a real failure
    assert cause is None if expected[1] is None else (cause.kind == "engine" and expected[1] in cause.words)
    made = calls(kubectl)
    verbs = [call["args"][0] for call in made]
    assert verbs[:2] == ["create", "apply"] and verbs.count("get") == 3 and verbs.count("logs") == 4
    # the jobset, its network policy and its credentials, whatever the outcome
    assert [call["args"][:2] for call in made[-3:]] == [["delete", "jobset"], ["delete", "networkpolicy"],
                                                       ["delete", "secret"]]
    secret = made[0]
    assert (secret["key_mode"], secret["folder_mode"]) == ("0o600", "0o700")
    assert secret["pem"].startswith("-----BEGIN PRIVATE KEY-----") and "CERTIFICATE" in secret["pem"]
    assert not Path(secret["key_file"]).exists()  # this machine's copy is gone
    policy, applied = yaml.safe_load_all((kubectl / "applied.yaml").read_text())
    assert [policy, applied] == list(yaml.safe_load_all((folder / "jobset.yaml").read_text()))
    assert (policy["kind"], applied["kind"]) == ("NetworkPolicy", "JobSet")  # the policy stands before any pod
    assert secret["args"][3] == f"{applied['metadata']['name']}-tls"
    assert record["job_id"] == applied["metadata"]["name"] and len(record["hosts"]) == 4
    # The key is in no manifest, no command line, no log.
    body = secret["pem"].splitlines()[1]
    assert body in (kubectl / "calls.jsonl").read_text()  # the stand-in recorded the file it was given
    arguments = [call["args"] for call in made]
    assert all(body not in argument for call in arguments for argument in call)
    assert body not in (kubectl / "applied.yaml").read_text() and body not in (folder / "jobset.yaml").read_text()
    assert all(body not in line for line in lines)
    assert "[host3] harness host 3 says hello" in lines
    assert (folder / "host2.log").read_text().strip() == "harness host 2 says hello"


def test_a_failed_jobset_whose_host_0_lost_a_host_is_a_lost_host(tmp_path, kubectl, monkeypatch):
    """host 0's hub names the host it lost (host-lost.json): the cause is typed host_lost, infrastructure to triage."""
    monkeypatch.setenv("STANDIN_STATE", "Failed")
    one = cell(tmp_path, "cpu-k8s", 2, 2)
    folder = tmp_path / "results" / one.id
    folder.mkdir(parents=True)
    (folder / "junit.xml").write_text("<testsuites/>")  # pytest's, cut short when host 0 stopped the session
    (folder / "host-lost.json").write_text(json.dumps({"host": 1, "hostname": "pod-1", "reason": "no heartbeat"}))
    exit_code, cause = jobset.run_job(one, folder=folder, pytest_command=["python"], log=lambda line: None, record={})
    assert (exit_code, cause.kind, cause.words) == (None, "host_lost", "host 1 (pod-1) lost: no heartbeat")


def test_driver_deletes_when_interrupted(tmp_path, kubectl, monkeypatch):
    monkeypatch.setenv("STANDIN_STATE", "")  # never ends
    one = cell(tmp_path, "cpu-k8s", 2, 2)
    folder = tmp_path / "results" / one.id
    folder.mkdir(parents=True)
    polls = kubectl / "polls"
    real_run = jobset.JobSetDriver._run

    def interrupted_while_waiting(self, *args, **kwargs):  # Ctrl-C while the jobset runs
        if args[0] == "get" and polls.exists() and int(polls.read_text()) >= 2:
            raise KeyboardInterrupt
        return real_run(self, *args, **kwargs)

    monkeypatch.setattr(jobset.JobSetDriver, "_run", interrupted_while_waiting)
    with pytest.raises(KeyboardInterrupt):
        jobset.run_job(one, folder=folder, pytest_command=["python"], log=lambda line: None, record={})
    assert [call["args"][:2] for call in calls(kubectl)][-3:] == [["delete", "jobset"], ["delete", "networkpolicy"],
                                                                  ["delete", "secret"]]


def test_the_jobset_engine_runs_the_cells_pytest_as_the_images_python(tmp_path, kubectl, monkeypatch):
    """Behind the Engine protocol: the launch's interpreter is this machine's, the pods run `python`; the job's
    name and hosts come back through the job fields; a cpu cell's hosts sampled no GPU memory."""
    from harness.engines import Launch, engine

    monkeypatch.setenv("STANDIN_STATE", "Completed")
    one = cell(tmp_path, "cpu-k8s", 2, 2)
    folder = tmp_path / "results" / one.id
    folder.mkdir(parents=True)
    launch = Launch(cell=one, folder=folder, python=Path(sys.executable), pytest_args=("-k", "ep"), project=tmp_path,
                    import_path=None, gpus=(), log=lambda line: None)
    job = {"job_id": None, "hosts": [], "cleanup": None}
    ran = engine("jobset").run(launch, job)
    assert (ran.exit_code, ran.cause, ran.timed_out, ran.memory) == (0, None, False, None)
    _, manifest = yaml.safe_load_all((folder / "jobset.yaml").read_text())
    args = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--") + 1:][:3] == ["python", "-m", "pytest"] and args[-2:] == ["-k", "ep"]
    assert job["job_id"].startswith("h-") and len(job["hosts"]) == 2


def test_the_hub_port_comes_from_the_runners_settings(tmp_path, kubectl, monkeypatch):
    monkeypatch.setenv("STANDIN_STATE", "Completed")
    entries = {**RUNNERS, "cpu-k8s": {**RUNNERS["cpu-k8s"], "submit": {**RUNNERS["cpu-k8s"]["submit"],
                                                                       "hub_port": 31007}}}
    (tmp_path / "runners.yaml").write_text(json.dumps(entries))
    spec = {"axes": {"gpu": ["cpu-k8s"], "hosts": [2], "gpus": [2], "torch": ["2.13.0"], "transformers": ["5.24.0"]}}
    one = expand(spec, read_runners(tmp_path / "runners.yaml"), name="m", source="m.yaml")[0]
    folder = tmp_path / "results" / one.id
    folder.mkdir(parents=True)
    jobset.run_job(one, folder=folder, pytest_command=["python"], log=lambda line: None, record={})
    _, manifest = yaml.safe_load_all((folder / "jobset.yaml").read_text())
    args = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--hub-port=31007" in args and f"--hub-port={jobset.HUB_PORT}" not in args
