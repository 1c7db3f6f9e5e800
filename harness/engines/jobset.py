"""The JobSet engine: a cell as one Kubernetes JobSet (kubernetes-sigs/jobset), driven through kubectl.

One replicated job of H pods (Indexed completions: a pod's JOB_COMPLETION_INDEX is its host index), with
`spec.coordinator` naming pod 0, whose stable DNS name (`<jobset>-hosts-0-0.<subdomain>`, from
`network.enableDNSHostnames`) every other pod dials. Each pod runs `harness host`, as a Slurm task does.
No restarts (`failurePolicy.maxRestarts: 0`, `backoffLimit: 0`): a lost pod fails the cell, as a lost Slurm
node does under --no-requeue. The cell's TLS credentials (harness.engines.credentials) go in a Secret created
beside it from a 0600 file (never on a command line, never in the manifest), mounted read-only into every pod as
a volume whose path is all `harness host` is told. A NetworkPolicy rendered beside the JobSet admits to its pods
only its own pods (by the label JobSet puts on them): the hub's port (runners.yaml `submit.hub_port`), the ranks'
listeners and the collectives' ports are reached from the cell alone.

`render` and `render_network_policy` are pure (tests validate them against the JobSet CRD's schema and the
NetworkPolicy's); `JobSetDriver` applies both, waits for `status.terminalState`, collects each pod's log with its
host's name, and deletes what it made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from harness import contract
from harness.contract import HOST_LOG, HOST_LOST_JSON, HOST_MEMORY_JSON, JOB_MANIFEST, JUNIT_XML, PYTEST_LOG
from harness.engines import hostmemory
from harness.engines.base import EngineCause, JobFields, Launch, Ran, host_lost, pytest_command, submitted, word
from harness.engines.credentials import CREDENTIALS_FILE, private_credentials
from harness.environment import CELL_ID_ENV
from harness.errors import ConfigError
from harness.plan.cells import Cell, SubmitOptions
from harness.plan.files import positive_int
from harness.ranks.output import printable

API_VERSION = "jobset.x-k8s.io/v1alpha2"
REPLICATED_JOB = "hosts"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
CREDENTIALS_MOUNT = "/var/run/harness-cell"  # the Secret's volume in every pod, read-only
POLL_S = 1.0
HUB_PORT = 29400  # default: a pod has its own network namespace, so a fixed port cannot collide
# A DNS-1035 label: what Kubernetes accepts as a JobSet's name and a subdomain.
NAME = re.compile(r"[a-z]([-a-z0-9]{0,40}[a-z0-9])?")


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobSetSettings:
    """runners.yaml `submit:` of a jobset runner: the pods' image and namespace, the GPU resource name,
    results_claim (a PVC mounted where the results folder is, so host 0 writes junit.xml there as on a shared
    file system), and hub_port (where host 0's hub listens)."""

    image: str | None = None
    namespace: str | None = None
    gpu_resource: str = "nvidia.com/gpu"
    results_claim: str | None = None
    hub_port: int = HUB_PORT

    @classmethod
    def parse(cls, options: SubmitOptions | None) -> JobSetSettings:
        if options is None:  # the runner has no `submit:`
            return cls()
        values: dict = {}
        for key, value in submitted(options, cls).items():
            where = f"{options.where}.{key}"
            if key == "hub_port":
                if positive_int(value, where) > 65535:
                    raise ConfigError(f"{where}: expected a TCP port (1-65535), got {value!r}")
                values[key] = value
            else:
                values[key] = word(value, where)
        return cls(**values)


class JobSetEngine:
    """One JobSet across the cell's hosts, through kubectl. The image holds the project and its environment:
    pytest runs as `python` there, with the cell's paths as they are in it."""

    name = "jobset"
    runs_here = False

    def settings(self, options: SubmitOptions | None) -> JobSetSettings:
        return JobSetSettings.parse(options)

    def run(self, launch: Launch, job: JobFields) -> Ran:
        cell, folder = launch.cell, launch.folder
        exit_code, cause = run_job(cell, folder=folder, log=launch.log, record=job,
                                   pytest_command=pytest_command(cell, Path("python"), folder, launch.pytest_args))
        return Ran(exit_code=exit_code, cause=cause, memory=hostmemory.of_cell(cell, folder, job.get("hosts") or []))


def jobset_name(cell: Cell, run_id: str) -> str:
    """`h-<hash of the cell id>-<run>`: short and DNS-safe, whatever the cell id holds (dots, pluses)."""
    import hashlib

    name = f"h-{hashlib.sha256(cell.id.encode()).hexdigest()[:8]}-{run_id}".lower()
    if not NAME.fullmatch(name):
        raise ConfigError(f"jobset name {name!r} is not a DNS label (run id {run_id!r})")
    return name


def host0_name(name: str) -> str:
    return f"{name}-{REPLICATED_JOB}-0-0.{name}"


def render(cell: Cell, name: str, host_command: list[str], timeout_s: int, results_root: Path | None = None) -> dict:
    """The JobSet of one cell: H pods, each `host_command` (harness host ...), pod 0 the coordinator; the
    runner's results_claim mounted at `results_root`."""
    submit = JobSetSettings.parse(cell.submit)
    if not submit.image:
        raise ConfigError(f"{cell.id}: a jobset runner needs submit.image in runners.yaml")
    container: dict = {
        "name": "host",
        "image": submit.image,
        "command": [*host_command[:1]],
        "args": [*host_command[1:]],
        "env": [{"name": CELL_ID_ENV, "value": cell.id}],
        "volumeMounts": [{"name": "cell-credentials", "mountPath": CREDENTIALS_MOUNT, "readOnly": True}],
    }
    if not cell.is_cpu:
        container["resources"] = {"limits": {submit.gpu_resource: cell.gpus}}
    # The Secret's file is the owner's alone (0400): the pod's user, not every process of the image.
    volumes: list[dict] = [{"name": "cell-credentials",
                            "secret": {"secretName": secret_name(name), "defaultMode": 0o400}}]
    pod: dict = {"restartPolicy": "Never", "automountServiceAccountToken": False, "containers": [container],
                 "volumes": volumes}
    if submit.results_claim and results_root is not None:
        container["volumeMounts"].append({"name": "results", "mountPath": str(results_root)})
        volumes.append({"name": "results", "persistentVolumeClaim": {"claimName": submit.results_claim}})
    manifest: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "JobSet",
        "metadata": {"name": name, "labels": {"harness/cell": _label(cell.id)}},
        "spec": {
            "failurePolicy": {"maxRestarts": 0},
            "ttlSecondsAfterFinished": 600,
            "network": {"enableDNSHostnames": True, "subdomain": name},
            "coordinator": {"replicatedJob": REPLICATED_JOB, "jobIndex": 0, "podIndex": 0},
            "replicatedJobs": [{
                "name": REPLICATED_JOB,
                "replicas": 1,
                "template": {"spec": {
                    "parallelism": cell.hosts,
                    "completions": cell.hosts,
                    "completionMode": "Indexed",
                    "backoffLimit": 0,
                    "activeDeadlineSeconds": timeout_s,
                    "template": {"spec": pod},
                }},
            }],
        },
    }
    if submit.namespace:
        manifest["metadata"]["namespace"] = submit.namespace
    return manifest


def render_network_policy(cell: Cell, name: str) -> dict:
    """Ingress to the JobSet's pods from the JobSet's own pods only (JobSet labels each with its name): the hub,
    the ranks' listeners and the collectives' ports, whatever port each took, are the cell's alone."""
    own_pods = {"matchLabels": {JOBSET_NAME_LABEL: name}}
    policy: dict[str, Any] = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "labels": {"harness/cell": _label(cell.id)}},
        "spec": {"podSelector": own_pods, "policyTypes": ["Ingress"],
                 "ingress": [{"from": [{"podSelector": own_pods}]}]},
    }
    namespace = JobSetSettings.parse(cell.submit).namespace
    if namespace:
        policy["metadata"]["namespace"] = namespace
    return policy


def secret_name(name: str) -> str:
    return f"{name}-tls"


def host_command(cell: Cell, pytest_command: list[str], name: str, hub_port: int, folder: Path) -> list[str]:
    """`harness host` in a pod: its index from JOB_COMPLETION_INDEX, host 0 by its stable DNS name, the cell's
    credentials where the Secret's volume is mounted."""
    command = ["harness", "host", f"--count={cell.hosts}", f"--host0={host0_name(name)}",
               f"--hub-port={hub_port}", f"--ranks-per-host={cell.gpus}",
               f"--credentials={CREDENTIALS_MOUNT}/{CREDENTIALS_FILE}",
               f"--cause-file={folder / HOST_LOST_JSON}", f"--pytest-log={folder / PYTEST_LOG}"]
    if cell.is_cpu:
        command.append("--cpu-ranks")
    else:
        command.append(f"--memory-file={folder / HOST_MEMORY_JSON}")  # {index}: each host's own
    return [*command, "--", *pytest_command]


def _label(value: str) -> str:
    """A label value: at most 63 characters of [-A-Za-z0-9_.], alphanumeric at both ends."""
    cleaned = re.sub(r"[^-A-Za-z0-9_.]", "_", value)[:63].strip("-_.")
    return cleaned or "cell"


class JobSetDriver:
    """kubectl apply / wait / logs / delete for one rendered JobSet and its NetworkPolicy."""

    def __init__(self, manifests: list[dict], folder: Path, log: Callable[[str], None], kubectl: str = "kubectl"):
        self.manifests, self.folder, self.log, self.kubectl = manifests, folder, log, kubectl
        jobset = next(manifest for manifest in manifests if manifest["kind"] == "JobSet")
        self.name = jobset["metadata"]["name"]
        self.namespace = jobset["metadata"].get("namespace")
        self.hosts = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["completions"]

    def _run(self, *args: str, check: bool = True, stdin: str | None = None) -> str:
        command = [self.kubectl, *(["--namespace", self.namespace] if self.namespace else []), *args]
        result = subprocess.run(command, capture_output=True, text=True, input=stdin, timeout=120)
        if check and result.returncode:
            raise ConfigError(f"kubectl {args[0]} failed ({result.returncode}): {result.stderr.strip()[:500]}")
        return result.stdout

    def run(self, credentials: Path, timeout_s: float) -> tuple[str, EngineCause | None]:
        """Secret from the credentials file, apply, wait, collect logs, delete: (terminal state, cause of an error or
        None)."""
        self._run("create", "secret", "generic", secret_name(self.name),
                  f"--from-file={CREDENTIALS_FILE}={credentials}")
        try:
            # The NetworkPolicy first: no pod of the JobSet starts before it stands.
            self._run("apply", "-f", "-", stdin=yaml.safe_dump_all(self.manifests, sort_keys=False))
            self.log(f"   jobset {self.name}: applied, {self.hosts} hosts")
            state, deadline = "", time.monotonic() + timeout_s
            while not state:
                state = self._run("get", "jobset", self.name, "-o", "jsonpath={.status.terminalState}",
                                  check=False).strip()
                if not state and time.monotonic() > deadline:
                    return "Timeout", EngineCause(contract.ERROR_TIMEOUT,
                                                  f"timed out after {timeout_s:g}s; jobset {self.name} deleted")
                if not state:
                    time.sleep(POLL_S)
            self.collect_logs()
            # A host that host 0's hub lost is the cause; else the JobSet's end says no more than that it failed.
            if state == "Completed":
                return state, None
            ended = EngineCause(contract.ERROR_ENGINE, f"jobset {self.name} ended {state}")
            return state, host_lost(self.folder) or ended
        finally:
            self._run("delete", "jobset", self.name, "--ignore-not-found", "--wait=true", check=False)
            self._run("delete", "networkpolicy", self.name, "--ignore-not-found", check=False)
            self._run("delete", "secret", secret_name(self.name), "--ignore-not-found", check=False)

    def collect_logs(self) -> None:
        for index in range(self.hosts):
            text = self._run("logs", "-l", f"{JOBSET_NAME_LABEL}={self.name},{COMPLETION_INDEX_LABEL}={index}",
                             "--tail=-1", check=False)
            with contextlib.suppress(OSError):
                (self.folder / HOST_LOG.format(index=index)).write_text(text)
            for line in text.splitlines():
                self.log(f"[host{index}] {printable(line)}")  # the tested code's: shown, not played


def run_job(cell: Cell, *, folder: Path, pytest_command: list[str], log: Callable[[str], None], record: JobFields,
            kubectl: str = "kubectl") -> tuple[int | None, EngineCause | None]:
    """Render, apply, wait, collect, delete. (host 0's exit as far as the JobSet tells, the error or None)."""
    import uuid

    name = jobset_name(cell, uuid.uuid4().hex[:6])
    timeout_s = int(cell.timeout_minutes * 60)
    hub_port = JobSetSettings.parse(cell.submit).hub_port
    manifests = [render_network_policy(cell, name),
                 render(cell, name, host_command(cell, pytest_command, name, hub_port, folder), timeout_s,
                        results_root=folder.parent)]
    (folder / JOB_MANIFEST).write_text(yaml.safe_dump_all(manifests, sort_keys=False))
    record["job_id"] = name
    record["hosts"] = [f"{name}-{REPLICATED_JOB}-0-{index}" for index in range(cell.hosts)]
    # This machine's copy lives in a 0700 folder until the Secret is gone again.
    with private_credentials(Path(tempfile.gettempdir()), cell.id) as credentials:
        state, cause = JobSetDriver(manifests, folder, log, kubectl).run(credentials, timeout_s)
    if state == "Completed":
        return 0, None
    if state == "Failed" and (folder / JUNIT_XML).is_file() and not (folder / HOST_LOST_JSON).is_file():
        return 1, None  # host 0's pytest exited 1: tests failed, the cell ran
    return None, cause
