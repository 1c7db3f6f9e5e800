"""Packing (runners.yaml `pack: true`, issue 33): N cpu cells of R ranks each, run packed (one `harness run`, the
cells at once) and one after another (each cell alone, a `harness run` of its own), in one run on this machine.

    python tests/benchmarks/bench_packing.py [--cells 4] [--ranks 2] [-k EXPR] [--json OUT]

Every cell runs tests/gpu's `-k EXPR` selection on R gloo ranks with this interpreter's torch and transformers;
the cells differ only by their runner type (`pack1` ... `packN`, written to a runners.yaml beside a temporary
matrix), so their ids differ and they do the same work. Alone, a rank takes the machine's cores / R threads (the
rank's own default); packed, harness gives each cell OMP_NUM_THREADS = cores / (N x R), so cells do not
oversubscribe. Prints each cell's seconds alone, the packed run's wall time and the issue's ratios:
packed_wall / slowest_cell_alone (goal: at most 1.3 for 4 x 2 ranks on 16 cores) and packed_wall / serial_wall.
Every cell must end the same way packed as alone (their statuses are printed and compared).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))  # run_helpers

from run_helpers import TORCH, TRANSFORMERS, write_packed_matrix

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SELECTION = "test_training_steps and mixtral"  # EP and FSDP2+EP training, world 2


def harness_run(matrix: str, results: Path, envs: Path, selection: str, *cell: str) -> float:
    """One `harness run` from the repository root; its wall seconds (harness's start included, as a job's is)."""
    command = [sys.executable, "-m", "harness", "run", "--matrix", matrix, "--results", str(results),
               "--env-dir", str(envs), *[arg for cell_id in cell for arg in ("--cell", cell_id)], "--", "-k", selection]
    started = time.perf_counter()
    completed = subprocess.run(command, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds = time.perf_counter() - started
    # 1: a red cell (or a traceback: the folders tell), 6: nothing distributed ran; both still measured
    missing = [cell_id for cell_id in cell if not (results / cell_id / "env.json").is_file()] if cell else []
    if completed.returncode not in (0, 1, 6) or missing:
        sys.exit(f"harness run exited {completed.returncode}" + (f", no env.json for {missing}" if missing else "")
                 + f":\n{completed.stdout[-4000:]}")
    return seconds


def statuses(results: Path, ids: list[str]) -> dict[str, str]:
    """Each cell's status, with its error where it has one."""
    found = {}
    for cell_id in ids:
        env = json.loads((results / cell_id / "env.json").read_text())
        found[cell_id] = env["status"] + (f": {env['error']}" if env.get("error") else "")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=4)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("-k", dest="selection", default=DEFAULT_SELECTION, help=f"default: {DEFAULT_SELECTION!r}")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    names = [f"pack{index}" for index in range(1, args.cells + 1)]
    ids = [f"{name}-{args.ranks}rank-torch{TORCH}-tf{TRANSFORMERS}" for name in names]
    with tempfile.TemporaryDirectory(prefix="bench-packing-") as folder:
        root = Path(folder)
        # Each runner offers the whole machine's cores: packed, harness fits the cells into them (one core a rank).
        runner = {"labels": ["bench"], "gpus": 0, "ranks": max(args.ranks, cores)}
        alone = write_packed_matrix(root / "alone", ["tests/gpu"], {name: runner for name in names},
                                    gpus=[args.ranks], timeout_minutes=60, test_timeout_seconds=1800)
        packed = write_packed_matrix(root / "packed", ["tests/gpu"],
                                     {name: {**runner, "pack": True} for name in names},
                                     gpus=[args.ranks], timeout_minutes=60, test_timeout_seconds=1800)
        print(f"{args.cells} cells x {args.ranks} ranks on {cores} cores; tests/gpu -k {args.selection!r}", flush=True)
        alone_seconds, alone_status = {}, {}
        for cell_id in ids:  # a results folder holds one run: each alone run its own
            results = root / f"results-alone-{cell_id}"
            alone_seconds[cell_id] = harness_run(alone, results, root / "envs", args.selection, cell_id)
            alone_status.update(statuses(results, [cell_id]))
            print(f"  alone  {cell_id}: {alone_seconds[cell_id]:.1f} s", flush=True)
        packed_wall = harness_run(packed, root / "results-packed", root / "envs", args.selection)
        packed_status = statuses(root / "results-packed", ids)
    serial_wall, slowest = sum(alone_seconds.values()), max(alone_seconds.values())
    figures = {"cells": args.cells, "ranks": args.ranks, "cores": cores, "selection": args.selection,
               "alone_s": {k: round(v, 1) for k, v in alone_seconds.items()}, "serial_wall_s": round(serial_wall, 1),
               "slowest_alone_s": round(slowest, 1), "packed_wall_s": round(packed_wall, 1),
               "packed_over_slowest_alone": round(packed_wall / slowest, 3),
               "packed_over_serial": round(packed_wall / serial_wall, 3),
               "statuses_alone": alone_status, "statuses_packed": packed_status}
    print(f"  packed (all {args.cells} at once): {packed_wall:.1f} s")
    print(f"packed_wall / slowest_cell_alone = {figures['packed_over_slowest_alone']:.3f} (goal <= 1.3)")
    print(f"packed_wall / serial_wall        = {figures['packed_over_serial']:.3f}")
    for cell_id in ids:
        print(f"  {cell_id}: alone {alone_status[cell_id]}; packed {packed_status[cell_id]}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    if alone_status != packed_status:
        print("a cell ended otherwise packed than alone", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
