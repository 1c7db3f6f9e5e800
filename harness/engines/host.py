"""`harness host`: what an engine starts on every host of a cell (Slurm: one task per node of one `srun`).

Host 0 runs the cell's pytest command, with the environment that makes its rank pool place ranks on every
host (harness.ranks.hosts); every other host runs its agent (harness.ranks.agent). Every host is given the path
of the cell's TLS credentials (--credentials), which its engine wrote where only the job's user can read them.
Each host starts what it runs (pytest, or the agent's zygote and ranks) in a containment of its own (its
cgroup, else this process as their child subreaper, and a token: harness.containment.containment) and kills every
process of it on the way out, however it ends, and says how in its log: Slurm's proctrack/pgid does not reach
a rank that called setpgrp. The host's index, the number of hosts and host 0's name come from the options,
else from Slurm's environment.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from harness.cell.gpus import NvmlUnavailable, resolve_gpus
from harness.cell.memory import MemoryMonitor, write_memory_json
from harness.containment import cgroup
from harness.containment.containment import Containment, describe
from harness.containment.tether import tethered
from harness.environment import CPU_RANKS_ENV, HOST_CAUSE_ENV, HOST_RANKS_ENV, HOSTS_CREDENTIALS_ENV, HOSTS_ENV, HUB_ENV
from harness.errors import ConfigError

# Host 0's name may take a moment to resolve, and its hub a moment to listen, while the hosts start.
RENDEZVOUS_TIMEOUT_S = 300.0
STOP_GRACE_S = 3.0


def command(args) -> int:
    # Slurm: SLURM_NODEID; a JobSet's Indexed job: JOB_COMPLETION_INDEX.
    index = _int_option(args.index, ("SLURM_NODEID", "JOB_COMPLETION_INDEX"), "--index")
    count = _int_option(args.count, ("SLURM_NNODES",), "--count")
    host0 = args.host0 or _slurm_first_host()
    credentials = _credentials(args.credentials)
    address = _resolve(host0)
    containment = Containment(use_cgroup=cgroup.wanted(os.environ))
    os.environ.update(containment.environ)  # what this host starts carries it; ranks inherit it through the zygote
    temporary = tempfile.mkdtemp(prefix="harness-host-")
    os.environ["TMPDIR"] = temporary
    name = socket.gethostname()
    print(f"harness host {index}/{count} on {name}: host 0 is {host0} ({address})", flush=True)
    monitor = _monitor_gpus() if args.memory_file else None
    try:
        if index == 0:
            return run_leader(args, count, address, credentials, containment)
        with containment.born_inside():  # the agent's zygote, and the ranks it forks, are born in the cgroup
            reason = _agent(index, (address, args.hub_port), credentials)
        print(f"harness host {index} on {name}: stopped: {reason}", flush=True)
        return 0
    finally:
        if monitor is not None:
            write_memory_json(args.memory_file.replace("{index}", str(index)), monitor.stop())
        ended = containment.end()
        shutil.rmtree(temporary, ignore_errors=True)
        print(f"harness host {index} on {name}: {describe(ended)}", flush=True)


def run_leader(args, count: int, address: str, credentials: Path, containment: Containment) -> int:
    """Host 0: the cell's pytest command, its output to the terminal (the engine's log) and pytest.log."""
    command = list(args.host_command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError("harness host: host 0 needs the pytest command after --")
    environ = {**os.environ, HOSTS_ENV: str(count), HOST_RANKS_ENV: str(args.ranks_per_host),
               HUB_ENV: f"{address}:{args.hub_port}", HOSTS_CREDENTIALS_ENV: str(credentials)}
    if args.cause_file:
        environ[HOST_CAUSE_ENV] = args.cause_file
    if args.cpu_ranks:
        environ[CPU_RANKS_ENV] = str(count * args.ranks_per_host)
    log = Path(args.pytest_log).open("wb") if args.pytest_log else None  # noqa: SIM115 - closed below
    with containment.born_inside():
        # tethered: a SIGKILLed `harness host` (Slurm's last word after KillWait) takes pytest with it
        process = subprocess.Popen(containment.confined(tethered(command, signal.SIGKILL)), env=environ,
                                   cwd=args.cwd or None,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    containment.spare(process.pid)  # its exit status is Popen's to read
    reader = threading.Thread(target=_copy, args=(process.stdout, log), daemon=True)
    reader.start()

    def stop(signum, frame):  # Slurm's cancel: SIGTERM, KillWait, SIGKILL. pytest still writes junit.xml.
        os.killpg(process.pid, signal.SIGINT)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        code = containment.wait(process)
    finally:
        signal.signal(signal.SIGTERM, previous)
        containment.end()  # before the reader's join: a process left behind may hold pytest's output open
        reader.join(timeout=10)
        if log:
            log.close()
    return code if code >= 0 else 128 - code


def _monitor_gpus() -> MemoryMonitor:
    """Sample this host's GPUs (those its engine gave it) while the cell runs here."""
    try:
        gpus = resolve_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"))
    except NvmlUnavailable:
        gpus = []
    return MemoryMonitor(gpus).start()


def _agent(index: int, hub: tuple[str, int], credentials: Path) -> str:
    from harness.ranks.agent import run_agent

    return run_agent(index, hub, credentials, RENDEZVOUS_TIMEOUT_S)


def _credentials(option: str | None) -> Path:
    """The cell's TLS credentials file the engine wrote for this host (its path only ever travels)."""
    if not option:
        raise ConfigError("harness host: give --credentials FILE, the cell's TLS credentials its engine wrote")
    path = Path(option)
    if not path.is_file():
        raise ConfigError(f"harness host: --credentials {option}: no such file (the engine writes it for the cell)")
    return path


def _copy(source, log) -> None:
    while chunk := os.read(source.fileno(), 65536):
        if log:
            log.write(chunk)
            log.flush()
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()


def _int_option(value: int | None, variables: tuple[str, ...], option: str) -> int:
    if value is not None:
        return value
    for variable in variables:
        raw = os.environ.get(variable)
        if raw is not None:
            if not raw.isdigit():
                raise ConfigError(f"harness host: ${variable} is {raw[:40]!r}, not a whole number")
            return int(raw)
    raise ConfigError(f"harness host: give {option}, or run under an engine that sets ${' or $'.join(variables)}")


def _slurm_first_host() -> str:
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodelist:
        raise ConfigError("harness host: give --host0, or run under Slurm ($SLURM_JOB_NODELIST is not set)")
    names = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                           check=False).stdout.split()
    if not names:
        raise ConfigError(f"harness host: scontrol show hostnames {nodelist!r} named no host")
    return names[0]


def _resolve(name: str) -> str:
    deadline = time.monotonic() + RENDEZVOUS_TIMEOUT_S
    while True:
        try:
            return socket.gethostbyname(name)
        except OSError as error:
            if time.monotonic() > deadline:
                raise ConfigError(f"harness host: host 0's name {name!r} does not resolve: {error}") from None
            time.sleep(0.5)
