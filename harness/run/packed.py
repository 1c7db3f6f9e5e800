"""Cells that share this machine at once: the packs of runner types with `pack: true` (runners.yaml).

`rounds(plan)` orders the plan's cells into rounds: a cell alone, or a pack of cells that fit this machine
together, first-fit decreasing (harness.plan.packing) into its GPUs, or into its cores for cpu types (one core
per rank). A cell that fits nothing here, and every cell of a type that does not pack, is a round of its own.

`run_pack` starts each cell of a pack as a `harness run --in-pack --cell ID` of its own, all at once: each child
sees only its own GPUs (CUDA_VISIBLE_DEVICES by UUID, so its host, its NVML monitor and its env.json name those
alone), takes its own share of ports ($HARNESS_PORT_SLOT) and of the cores (OMP_NUM_THREADS), and has its own
containment and temporary folders: a cell that crashes or hangs ends inside its own process tree and takes no
neighbour with it. Each writes its folder as a cell run alone does. Their lines come through prefixed with the
cell's id; an interruption of this run is passed on to every child, which records it in its folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from harness import contract
from harness.containment.tether import tethered
from harness.engines import Interrupted, engine
from harness.engines.local import echo_terminal
from harness.plan.cells import Cell
from harness.plan.packing import first_fit_decreasing
from harness.ranks.ports import PORT_SLOT_ENV
from harness.results import read_cell
from harness.run import prepare, record
from harness.run.plan import Host, Plan
from harness.run.record import CellOutcome

# How long a child harness has to record an interruption before it is killed.
CHILD_STOP_GRACE_SECONDS = 60


def available_cores() -> int:
    """The cores this process may run on: a cpu pack's capacity, one rank per core."""
    return len(os.sched_getaffinity(0))


def rounds(plan: Plan, cores: int | None = None) -> list[tuple[Cell, ...]]:
    """The plan's cells in the order they run: one at a time, except packs, which run at once. A pack stands where
    its first cell stood in the plan."""
    cores = available_cores() if cores is None else cores
    gpu_pool = [cell for cell in plan.cells if _packs_on_gpus(cell, plan)]
    cpu_pool = [cell for cell in plan.cells if _packs_on_cores(cell, plan, cores)]
    packs = [pack.cells for pool, capacity in ((gpu_pool, len(plan.host.gpus)), (cpu_pool, cores)) if pool
             for pack in first_fit_decreasing(pool, capacity, runner="this machine")]
    placed = {cell.id: pack for pack in packs for cell in pack}
    ordered: list[tuple[Cell, ...]] = []
    for cell in plan.cells:
        pack = placed.get(cell.id, (cell,))
        if pack not in ordered:
            ordered.append(pack)
    return ordered


def _packs(cell: Cell, plan: Plan) -> bool:
    runner = plan.runners.get(cell.gpu)
    return runner is not None and runner.pack and engine(cell.engine).runs_here


def _packs_on_gpus(cell: Cell, plan: Plan) -> bool:
    # MIG slices of one GPU have no NVLink between them (nor with other GPUs): not for EP cells, so not packed.
    on_mig = any(gpu.uuid.startswith("MIG-") for gpu in plan.host.gpus)
    return not cell.is_cpu and not on_mig and _packs(cell, plan) and cell.gpus <= len(plan.host.gpus)


def _packs_on_cores(cell: Cell, plan: Plan, cores: int) -> bool:
    return cell.is_cpu and _packs(cell, plan) and cell.gpus <= cores


def shares(pack: Sequence[Cell], host: Host, cores: int) -> list[dict[str, str]]:
    """What each cell of a pack gets on top of this run's environment: disjoint GPUs (by UUID, the next ones in
    the host's order), its slot of the ports, and the cores divided by every rank of the pack."""
    threads = max(1, cores // sum(cell.gpus for cell in pack))
    environs, next_gpu = [], 0
    for index, cell in enumerate(pack):
        environ = {PORT_SLOT_ENV: f"{index}/{len(pack)}", "OMP_NUM_THREADS": str(threads)}
        if not cell.is_cpu:
            gpus = host.gpus[next_gpu:next_gpu + cell.gpus]
            next_gpu += cell.gpus
            environ.update(CUDA_VISIBLE_DEVICES=",".join(gpu.uuid for gpu in gpus), CUDA_DEVICE_ORDER="PCI_BUS_ID")
        environs.append(environ)
    return environs


def member_command(cell: Cell, plan: Plan, *, matrix_argument: str, force: bool) -> list[str]:
    """One cell of a pack as a harness run of its own, with this run's settings."""
    command = [sys.executable, "-m", "harness", "run", "--in-pack", "--matrix", matrix_argument, "--cell", cell.id,
               "--results", str(plan.results_root), "--env-dir", str(plan.env_dir), "--reruns", str(cell.reruns),
               "--serial-tests"]  # its cores are shared with the pack's other cells: one test at a time in each
    if force:
        command.append("--force")
    return [*command, "--", *plan.pytest_args]


def run_pack(pack: Sequence[Cell], plan: Plan, *, matrix_argument: str, force: bool,
             log: Callable[[str], None], cores: int | None = None) -> list[CellOutcome]:
    """The pack's cells at once, each a child harness run; their outcomes, read from their folders."""
    cores = available_cores() if cores is None else cores
    log(f"== packing {len(pack)} cells on this machine at once: {', '.join(cell.id for cell in pack)}")
    started = time.time()
    lock = threading.Lock()
    children: list[subprocess.Popen] = []
    readers: list[threading.Thread] = []
    try:
        for cell, extra in zip(pack, shares(pack, plan.host, cores), strict=True):
            # Signals reach it from this run alone; tethered: SIGTERM, as an interrupt, if this run is SIGKILLed,
            # so it ends its cell and records it interrupted rather than run on unseen.
            command = tethered(member_command(cell, plan, matrix_argument=matrix_argument, force=force),
                               signal.SIGTERM)
            child = subprocess.Popen(command, env={**os.environ, **extra}, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
            children.append(child)
            reader = threading.Thread(target=relay, args=(child.stdout, f"[{cell.id}] ", lock), daemon=True)
            reader.start()
            readers.append(reader)
        for child in children:
            child.wait()
    except Interrupted as interrupted:
        _stop(children, interrupted.signum)
        raise
    finally:
        # A failure of this run itself (or a child that would not start): no child is left behind.
        _stop([child for child in children if child.poll() is None], signal.SIGTERM)
        for reader in readers:
            reader.join(timeout=10)
    return [_outcome(cell, child.returncode, plan, started) for cell, child in zip(pack, children, strict=True)]


def relay(source: BinaryIO, prefix: str, lock: threading.Lock) -> None:
    """A child's output, line by line, each line prefixed with its cell's id (lines of cells never interleave)."""
    prefix_bytes = prefix.encode()
    for line in iter(source.readline, b""):
        # The terminal may have gone away: the folders still get it all.
        with lock, contextlib.suppress(OSError, ValueError):
            echo_terminal(prefix_bytes + line if line.endswith(b"\n") else prefix_bytes + line + b"\n")


def _stop(children: Sequence[subprocess.Popen], signum: int) -> None:
    """The children get the signal this run got (each records its cell as interrupted), then SIGKILL if they
    do not end."""
    for child in children:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)
    deadline = time.monotonic() + CHILD_STOP_GRACE_SECONDS
    for child in children:
        try:
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _outcome(cell: Cell, exit_code: int | None, plan: Plan, started: float) -> CellOutcome:
    """The cell's outcome from the folder its harness run wrote; a child that died before writing env.json
    leaves an errored folder written here."""
    folder = plan.results_root / cell.id
    if not (folder / contract.ENV_JSON).is_file():
        _write_lost_record(cell, folder, exit_code, plan, started)
    result = read_cell(folder)
    duration = result.duration_s if isinstance(result.duration_s, float) else time.time() - started
    return CellOutcome(cell=cell, folder=folder, status=result.status.value, error=result.reason,
                       duration_s=duration)


def _write_lost_record(cell: Cell, folder: Path, exit_code: int | None, plan: Plan, started: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    env = prepare.start_record(cell, plan.host, [], started, project=plan.matrix.root,
                               matrix_reference=plan.matrix.reference,
                               pytest_args=plan.pytest_args)
    ended = time.time()
    words = f"its harness run (packed) exited {exit_code} before writing {contract.ENV_JSON}"
    record.write_env_json(folder, dataclasses.replace(env, error=words, error_kind=contract.ERROR_HARNESS,
                                                      end=prepare.iso(ended), duration_s=round(ended - started, 3)))
