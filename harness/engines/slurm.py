"""The Slurm engine: `harness run` on a login node submits one job per cell and waits for it.

    sbatch --nodes=H --ntasks-per-node=1 --no-requeue job.sh
    job.sh:  srun --kill-on-bad-exit=1 python -m harness host ...   (one task per host)

Host 0's `harness host` runs pytest (its output is host0.log and pytest.log), every other host runs its
agent. harness streams each host's log with the host's name in front, and when the job ends writes the
same folder as a local cell, naming every host and the job id. Why a cell errored, first cause first:
harness was interrupted (the job is cancelled), the cell's time ran out, the job was cancelled from
outside (`scancel`), Slurm failed a node (NODE_FAIL, named), host 0 saw a host go silent (host-lost.json),
then pytest's own exit. The job is submitted --no-requeue: a lost node would requeue it and truncate its log.
The hosts talk TLS with credentials made for the job (harness.engines.credentials), in a 0700 folder of the
project's while the job runs; job.sh names the file, never its content, and sbatch's environment holds no secret.

The cluster is assumed to share the project folder with the login node (results, environments, the
harness checkout), as home folders on Slurm clusters are. Client commands run as `sbatch`, `scontrol`,
`squeue`, `scancel`, `sinfo` on PATH.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from harness import contract, safedir
from harness.contract import HOST_LOG, HOST_LOST_JSON, HOST_MEMORY_JSON, JOB_SCRIPT, PYTEST_LOG
from harness.engines import hostmemory
from harness.engines.base import (
    EngineCause,
    JobFields,
    Launch,
    Ran,
    host_lost,
    pytest_command,
    pytest_environment,
    submitted,
    word,
)
from harness.engines.credentials import private_credentials
from harness.errors import ConfigError
from harness.plan.cells import Cell, SubmitOptions
from harness.plan.files import positive_int
from harness.ranks.output import printable
from harness.ranks.ports import port_outside_ephemeral_range

POLL_S = 0.5
PRIVATE_FOLDER = ".harness-private"  # in the project: each job's credentials, 0700, gone when the job ends
# After the job ends, how long its steps may take to be gone on every host (Slurm's KillWait is 30 s).
GONE_TIMEOUT_S = 120.0
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY", "PREEMPTED",
                "BOOT_FAIL", "DEADLINE"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class SlurmSettings:
    """runners.yaml `submit:` of a slurm runner: sbatch's partition, account, time and segment, more sbatch
    --options, and pyxis's container_image for srun."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None
    sbatch_args: tuple[str, ...] = ()
    segment: int | None = None
    container_image: str | None = None

    @classmethod
    def parse(cls, options: SubmitOptions | None) -> SlurmSettings:
        if options is None:  # the runner has no `submit:`
            return cls()
        values: dict = {}
        for key, value in submitted(options, cls).items():
            where = f"{options.where}.{key}"
            if key == "sbatch_args":
                if not isinstance(value, tuple) or not all(word(v, where).startswith("--") for v in value):
                    raise ConfigError(f"{where}: expected a list of --options, got {value!r}")
            elif key == "segment":
                positive_int(value, where)
            else:
                word(value, where)
            values[key] = value
        return cls(**values)


class SlurmEngine:
    """One Slurm job across the cell's hosts, submitted from this login node; the cluster shares the project
    folder, so the job runs the cell environment's interpreter and this harness as they are here."""

    name = "slurm"
    runs_here = False

    def settings(self, options: SubmitOptions | None) -> SlurmSettings:
        return SlurmSettings.parse(options)

    def run(self, launch: Launch, job: JobFields) -> Ran:
        cell, folder = launch.cell, launch.folder
        exit_code, cause = run_job(cell, folder=folder,
                                   pytest_command=pytest_command(cell, launch.python, folder, launch.pytest_args),
                                   environ=pytest_environment(cell, [], launch.import_path), project=launch.project,
                                   log=launch.log, record=job)
        return Ran(exit_code=exit_code, cause=cause, memory=hostmemory.of_cell(cell, folder, job.get("hosts") or []))


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobState:
    state: str  # JobState, e.g. RUNNING, NODE_FAIL ("" while unknown)
    hosts: tuple[str, ...]  # NodeList, expanded, host 0 first
    exit_code: int | None  # the batch script's (host 0's harness host: pytest's)
    reason: str


def batch_script(cell: Cell, host_command: list[str], folder: Path) -> str:
    """job.sh: one srun step, one task per host, each host's output to its own log in the cell's folder."""
    srun = ["srun", "--kill-on-bad-exit=1", f"--nodes={cell.hosts}", "--ntasks-per-node=1",
            f"--output={folder / HOST_LOG.format(index='%t')}"]
    image = SlurmSettings.parse(cell.submit).container_image
    if image:
        srun.append(f"--container-image={image}")  # pyxis
    return "#!/bin/sh\n# harness: one cell across hosts; harness host starts pytest on host 0, an agent elsewhere\n" \
           f"exec {shlex.join(srun + host_command)}\n"


def sbatch_command(cell: Cell, folder: Path, script: Path) -> list[str]:
    command = ["sbatch", "--parsable", f"--job-name=harness-{cell.id}", f"--nodes={cell.hosts}",
               "--ntasks-per-node=1", "--no-requeue", f"--output={folder / 'slurm.log'}"]
    if not cell.is_cpu:
        command.append(f"--gpus-per-node={cell.gpus}")
    submit = SlurmSettings.parse(cell.submit)
    command += [f"--{name}={value}" for name, value in (("partition", submit.partition), ("account", submit.account),
                                                        ("time", submit.time), ("segment", submit.segment)) if value]
    command += list(submit.sbatch_args)
    return [*command, str(script)]


def host_command(cell: Cell, pytest_command: list[str], folder: Path, project: Path, hub_port: int,
                 credentials: Path) -> list[str]:
    command = [sys.executable, "-m", "harness", "host", f"--hub-port={hub_port}", f"--ranks-per-host={cell.gpus}",
               f"--credentials={credentials}", f"--cause-file={folder / HOST_LOST_JSON}",
               f"--pytest-log={folder / PYTEST_LOG}", f"--cwd={project}"]
    if cell.is_cpu:
        command.append("--cpu-ranks")
    else:  # each host samples its own GPUs; harness merges them (hostmemory)
        command.append(f"--memory-file={folder / HOST_MEMORY_JSON}")  # {index}: each host's own
    return [*command, "--", *pytest_command]


def parse_job(text: str, expand: Callable[[str], list[str]]) -> JobState:
    """`scontrol show job -o J` -> JobState; `expand` turns a NodeList into host names."""
    fields = dict(re.findall(r"(\w+)=(\S*)", text))
    nodes = fields.get("NodeList", "")
    code = fields.get("ExitCode", "")
    exit_code = int(code.split(":")[0]) if re.fullmatch(r"\d+:\d+", code) else None
    return JobState(state=fields.get("JobState", ""), hosts=tuple(expand(nodes)) if nodes and nodes != "(null)"
                    else (), exit_code=exit_code, reason=fields.get("Reason", ""))


class SlurmClient:
    """The Slurm commands harness uses; tests may give a prefix (a login node's namespace)."""

    def __init__(self, prefix: list[str] | None = None):
        self.prefix = prefix or []

    def __call__(self, *command: str, check: bool = True, env: dict | None = None) -> str:
        result = subprocess.run([*self.prefix, *command], capture_output=True, text=True, env=env, timeout=60)
        if check and result.returncode:
            raise ConfigError(f"{command[0]} failed ({result.returncode}): {result.stderr.strip()[:500]}")
        return result.stdout

    def hostnames(self, nodelist: str) -> list[str]:
        return self("scontrol", "show", "hostnames", nodelist, check=False).split()

    def job(self, job_id: str) -> JobState | None:
        text = self("scontrol", "show", "job", "-o", job_id, check=False)
        return parse_job(text, self.hostnames) if "JobState=" in text else None

    def down_hosts(self, hosts: tuple[str, ...]) -> list[str]:
        """Of `hosts`, those Slurm holds down or failing."""
        if not hosts:
            return []
        text = self("sinfo", "-h", "-N", "-n", ",".join(hosts), "-o", "%N %T", check=False)
        return [name for name, state in (line.split()[:2] for line in text.splitlines() if len(line.split()) >= 2)
                if state.rstrip("*~#!%$@^-").lower() in ("down", "fail", "failing", "drained", "draining")]


class LogStreamer:
    """Each host's log as it grows, every line with the host's name in front."""

    def __init__(self, folder: Path, echo: Callable[[str], None]):
        self.folder, self.echo = folder, echo
        self.offsets: dict[int, int] = {}
        self.partial: dict[int, str] = {}

    def poll(self, hosts: tuple[str, ...], final: bool = False) -> None:
        for index in range(len(hosts)):
            path = self.folder / HOST_LOG.format(index=index)
            with contextlib.suppress(OSError), path.open("rb") as log:
                log.seek(self.offsets.get(index, 0))
                chunk = log.read()
                self.offsets[index] = self.offsets.get(index, 0) + len(chunk)
                text = self.partial.get(index, "") + chunk.decode(errors="replace")
                *lines, self.partial[index] = text.split("\n")
                if final and self.partial[index]:
                    lines.append(self.partial.pop(index))
                for line in lines:
                    self.echo(f"[{hosts[index]}] {printable(line)}")  # the tested code's: shown, not played


def run_job(cell: Cell, *, folder: Path, pytest_command: list[str], environ: dict[str, str], project: Path,
            log: Callable[[str], None], record: JobFields,
            client: SlurmClient | None = None) -> tuple[int | None, EngineCause | None]:
    """Submit, stream, wait; fills record's job_id and hosts. (pytest's exit code or None, the error or None)."""
    # The cell's TLS credentials, for the job's hosts alone, until nothing of the job runs anywhere.
    with private_credentials(private_folder(project), cell.id) as cell_credentials:
        return _run_job(cell, folder=folder, pytest_command=pytest_command, environ=environ, project=project,
                        log=log, record=record, client=client or SlurmClient(), credentials=cell_credentials)


def private_folder(project: Path) -> Path:
    """Where a job's credentials are kept while it runs: in the project, which every host shares, and not in the
    results folder, which is uploaded as it is (an artifact anyone who reads the repository may read)."""
    folder = project / PRIVATE_FOLDER
    with safedir.private(folder, "harness's private folder"):  # a link, a file or another user's: refused
        return folder


def _run_job(cell: Cell, *, folder: Path, pytest_command: list[str], environ: dict[str, str], project: Path,
             log: Callable[[str], None], record: JobFields, client: SlurmClient,
             credentials: Path) -> tuple[int | None, EngineCause | None]:
    port = port_outside_ephemeral_range()  # checked free here; the same range is quiet on the hosts
    script = folder / JOB_SCRIPT
    script.write_text(batch_script(cell, host_command(cell, pytest_command, folder, project, port, credentials),
                                   folder))
    script.chmod(0o755)
    if not cell.is_cpu:
        environ.pop("CUDA_VISIBLE_DEVICES", None)  # Slurm gives each host its GPUs
    command = sbatch_command(cell, folder, script)
    log("   " + shlex.join(command))
    job_id = client(*command, env=environ).strip().split(";")[0]
    if not job_id.isdigit():
        raise ConfigError(f"sbatch answered {job_id!r}, not a job id")
    record["job_id"] = job_id
    log(f"   {cell.id}: Slurm job {job_id}")
    streamer = LogStreamer(folder, log)
    deadline = time.monotonic() + cell.timeout_minutes * 60
    state: JobState | None = None
    dropped: list[str] = []
    cause: EngineCause | None = None
    try:
        while True:
            state = client.job(job_id) or state
            if state is not None:
                seen = record.get("hosts") or []
                if seen and state.hosts and set(state.hosts) < set(seen):
                    # A failed node leaves the job's NodeList first, then the others as they complete (and
                    # it may be back up by the time the job ends): the first to leave is the one.
                    dropped = dropped or sorted(set(seen) - set(state.hosts))
                elif state.hosts:
                    record["hosts"] = list(state.hosts)
                streamer.poll(tuple(record.get("hosts") or ()))
                if state.state in FINAL_STATES:
                    break
            if time.monotonic() > deadline:
                cause = EngineCause(contract.ERROR_TIMEOUT,
                                    f"timed out after {cell.timeout_minutes} min; job {job_id} cancelled")
                break
            time.sleep(POLL_S)
    finally:
        cancelled = cancel_and_wait(client, job_id)
        if state is not None:
            streamer.poll(tuple(record["hosts"]), final=True)
        if not cancelled:
            log(f"   {cell.id}: job {job_id} still has steps after {GONE_TIMEOUT_S:g}s")
    state = client.job(job_id) or state
    hosts = tuple(record.get("hosts") or ())  # as seen while it ran: an ended job may list no nodes
    return (state.exit_code if state is not None else None), \
        cause or job_cause(client, state, folder, job_id, hosts, dropped=dropped)


# Slurm's end states that say why, as the kind of error each is: a time limit is a hang or too slow, the OOM kill the
# cell's own memory (both the code under test's), a node that did not boot a lost host, preemption an interruption.
SLURM_END_KINDS = {"TIMEOUT": contract.ERROR_TIMEOUT, "DEADLINE": contract.ERROR_TIMEOUT,
                   "OUT_OF_MEMORY": contract.ERROR_SIGNAL, "BOOT_FAIL": contract.ERROR_HOST_LOST,
                   "PREEMPTED": contract.ERROR_INTERRUPTED}


def job_cause(client: SlurmClient, state: JobState | None, folder: Path, job_id: str,
              hosts: tuple[str, ...] = (), dropped: list[str] | None = None) -> EngineCause | None:
    """Why the job errored, first cause first, typed; None when it ran to its end (pytest's exit then decides)."""
    if state is None:
        return EngineCause(contract.ERROR_ENGINE, f"job {job_id} vanished from Slurm before it ended")
    seen = host_lost(folder)
    if state.state == "CANCELLED":
        return EngineCause(contract.ERROR_INTERRUPTED, f"job {job_id} cancelled (scancel, or an administrator)")
    hosts = hosts or state.hosts
    if state.state == "NODE_FAIL":
        # Slurm ends every host's task at once: which agent's connection closed first says nothing then.
        down = node_failures(folder / "slurm.log") or dropped or client.down_hosts(hosts)
        named = f"host {', '.join(down)} failed" if down else "a host failed"
        return EngineCause(contract.ERROR_HOST_LOST, f"Slurm NODE_FAIL: {named} (job {job_id})")
    if seen:
        return seen
    failed_task = first_failed_task(folder / "slurm.log", hosts)
    if failed_task:  # an agent's task ended (killed, or exited): the engine saw it end, not why
        return EngineCause(contract.ERROR_ENGINE, failed_task)
    if state.state in SLURM_END_KINDS:
        return EngineCause(SLURM_END_KINDS[state.state], f"Slurm ended job {job_id}: {state.state}")
    return None


SRUN_NODE_FAILURE = re.compile(r"srun: error: Node failure on (\S+)")


def node_failures(log: Path) -> list[str]:
    """The nodes srun says failed (`srun: error: Node failure on h3`), in its order."""
    with contextlib.suppress(OSError):
        return list(dict.fromkeys(match.group(1)[:64] for match in
                                  SRUN_NODE_FAILURE.finditer(log.read_text(errors="replace")[:100_000])))
    return []


SRUN_TASK_ERROR = re.compile(r"srun: error: (\S+): tasks? ([\d,-]+): (.+)")


def first_failed_task(log: Path, hosts: tuple[str, ...]) -> str:
    """srun's first `error: HOST: task N: Killed` (--kill-on-bad-exit then ended the others), unless host 0's
    own: that one is pytest's exit, which pytest's code explains."""
    with contextlib.suppress(OSError):
        for line in log.read_text(errors="replace")[:100_000].splitlines():
            match = SRUN_TASK_ERROR.search(line)
            if match and (not hosts or match.group(1) != hosts[0]):
                return f"host {match.group(2)} ({match.group(1)[:64]}) ended first: {match.group(3).strip()[:200]}"
    return ""


def cancel_and_wait(client: SlurmClient, job_id: str) -> bool:
    """scancel (a no-op for an ended job), then until Slurm lists no step of it: nothing runs on any host."""
    client("scancel", job_id, check=False)
    end = time.monotonic() + GONE_TIMEOUT_S
    while time.monotonic() < end:
        steps = client("squeue", "-h", "-s", "-j", job_id, check=False).strip()
        jobs = client("squeue", "-h", "-j", job_id, check=False).strip()
        if not steps and not jobs:
            return True
        time.sleep(POLL_S)
    return False
