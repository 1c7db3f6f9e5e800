"""The suite (tests/gpu) with the persistent rank pool off and on, in one invocation. Not a pytest file:

    python tests/benchmarks/bench_pool.py OUT.json [--modes off,on] [-- EXTRA PYTEST ARGS]

Each mode is one `python -m pytest tests/gpu -p harness.ranks.plugin -q -p no:cacheprovider` process, timed
from start to exit (interpreter start, collection and the tests that run without ranks included), under
the caller's environment (CUDA_VISIBLE_DEVICES, NCCL_*, HARNESS_CPU_RANKS pass through unchanged):

- off:   HARNESS_RANKS_POOL=0, every ranks.run spawns its ranks (harness.ranks.spawn.run_distributed)
- on:    the pool, ranks forked from the zygote
- spawn: the pool, ranks spawned (only with --modes ...,spawn)

The pool writes one line per ranks.run (HARNESS_RANKS_TIMING): `work_s`, how long the test's function ran
in its slowest rank, and `call_s`, the call's wall time in pytest. The figures:

- speedup          = wall(off) / wall(on)                          goal >= 5
- wall_over_work   = wall(on) / sum(work_s)                         goal <= 1.5
- calls_over_work  = sum(call_s) / sum(work_s): the pool's own overhead inside the calls (starting pools,
  sending calls, collecting results); the rest of wall(on) is pytest and the tests without ranks.
- startup_s        = wall of the same command with --collect-only: interpreter, plugins, imports and
  collection, which every mode pays before its first test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SUITE_COMMAND = ["-m", "pytest", "tests/gpu", "-p", "harness.ranks.plugin", "-q", "-p", "no:cacheprovider"]
MODES = {"off": "0", "on": "1", "spawn": "spawn"}
GOALS = {"speedup": 5.0, "wall_over_work": 1.5}
OUTCOME = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|rerun|warnings?)\b")


def split_pytest_args(argv: list[str] | None) -> tuple[list[str], list[str]]:
    """(the benchmark's arguments, pytest's): everything after the first `--` goes to pytest untouched
    (argparse would read `-k` as its own)."""
    argv = sys.argv[1:] if argv is None else argv
    return (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])


def suite_environ(timing: Path | None = None, **extra: str) -> dict[str, str]:
    """The caller's environment with this checkout's harness first on the path (and the pool's timing file)."""
    environ = {**os.environ, **extra,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    if timing is not None:
        environ["HARNESS_RANKS_TIMING"] = str(timing)
    return environ


def read_timing(timing: Path) -> list[dict[str, Any]]:
    """The pool's HARNESS_RANKS_TIMING lines, one per call (none when ranks were spawned per call)."""
    return [json.loads(line) for line in timing.read_text().splitlines()] if timing.exists() else []


def pools_started(calls: list[dict[str, Any]]) -> int:
    return sum(1 for call in calls if call["pool_start_s"] > 0)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ours, pytest_args = split_pytest_args(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", type=Path, help="where to write the figures (rewritten after each mode)")
    parser.add_argument("--modes", default="off,on", help=f"comma-separated, of {', '.join(MODES)} (default off,on)")
    args = parser.parse_args(ours)
    args.pytest_args = pytest_args
    args.modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    unknown = [mode for mode in args.modes if mode not in MODES]
    if unknown or not args.modes:
        parser.error(f"--modes takes {', '.join(MODES)}; got {args.modes}")
    return args


def suite(mode: str, pytest_args: list[str], timing: Path) -> tuple[subprocess.CompletedProcess, float]:
    """Run the suite once; its output and wall time."""
    environ = suite_environ(timing, HARNESS_RANKS_POOL=MODES[mode])
    command = [sys.executable, *SUITE_COMMAND, *pytest_args]
    print(f"[{mode}] {' '.join(command[1:])}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    completed = subprocess.run(command, cwd=REPO, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    return completed, time.perf_counter() - started


def run_suite(mode: str, pytest_args: list[str], scratch: Path) -> dict[str, Any]:
    timing = scratch / f"timing-{mode}.jsonl"
    completed, wall_s = suite(mode, pytest_args, timing)
    lines = completed.stdout.strip().splitlines()
    summary = lines[-1] if lines else ""
    figures = {"mode": mode, "exit_code": completed.returncode, "wall_s": wall_s, "summary": summary,
               "outcomes": {kind.rstrip("s") if kind in ("errors", "warnings") else kind: int(count)
                            for count, kind in OUTCOME.findall(summary)},
               "pool_line": next((line for line in lines if line.startswith("rank pool: ") and "calls" in line), None)}
    calls = read_timing(timing)
    if calls:
        figures.update(calls=len(calls), work_s=sum(call["work_s"] or 0.0 for call in calls),
                       calls_s=sum(call["call_s"] for call in calls),
                       pool_start_s=sum(call["pool_start_s"] for call in calls),
                       pools_started=pools_started(calls))
    if completed.returncode not in (0, 1):  # 1: tests failed; anything else: the run itself broke
        print(completed.stdout[-4000:], file=sys.stderr)
    return figures


def ratios(runs: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    off, on = runs.get("off"), runs.get("on")
    figures: dict[str, float | None] = {"speedup": None, "wall_over_work": None, "calls_over_work": None}
    if off and on:
        figures["speedup"] = off["wall_s"] / on["wall_s"]
    if on and on.get("work_s"):
        figures["wall_over_work"] = on["wall_s"] / on["work_s"]
        figures["calls_over_work"] = on["calls_s"] / on["work_s"]
    return figures


def describe_host() -> dict[str, Any]:
    host = {"python": platform.python_version(), "machine": platform.node(), "cpus": os.cpu_count(),
            "torch": None, "gpus": [], "cpu_ranks": os.environ.get("HARNESS_CPU_RANKS", "2 (default)")}
    try:
        import torch
    except ImportError:
        return host
    host["torch"] = torch.__version__
    if torch.cuda.is_available():
        host["gpus"] = [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]
    return host


def print_table(runs: dict[str, dict[str, Any]], figures: dict[str, float | None]) -> None:
    print(f"{'mode':<6} {'wall s':>8} {'calls':>6} {'work s':>8} {'in calls s':>11} {'pool starts':>12}  outcome")
    for mode, run in runs.items():
        numbers = (f"{run.get('calls', '-'):>6} {_seconds(run.get('work_s')):>8} {_seconds(run.get('calls_s')):>11} "
                   f"{run.get('pools_started', '-'):>12}")
        print(f"{mode:<6} {run['wall_s']:8.1f} {numbers}  {run['summary']}")
    for name, value in figures.items():
        if name == "startup_s":
            print(f"{name:>16}: {value:.1f} s (pytest start and collection, in every mode)")
            continue
        goal = GOALS.get(name)
        verdict = "" if goal is None or value is None else \
            ("  (goal >= {:g}: {})" if name == "speedup" else "  (goal <= {:g}: {})").format(
                goal, "met" if (value >= goal if name == "speedup" else value <= goal) else "missed")
        print(f"{name:>16}: {'-' if value is None else f'{value:.2f}x'}{verdict}")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-pool-") as scratch:
        _, startup_s = suite("on", [*args.pytest_args, "--collect-only"], Path(scratch) / "unused")
        for mode in args.modes:
            runs[mode] = run_suite(mode, args.pytest_args, Path(scratch))
            # Written after every mode, so a run cut short by a time limit keeps the modes it finished.
            figures = {**ratios(runs), "startup_s": startup_s}
            write_report(args, runs, figures)
    print_table(runs, figures)
    consistent = same_outcomes(runs)
    if not consistent:
        print("warning: the modes' test outcomes differ", file=sys.stderr)
    broken = [mode for mode, run in runs.items() if run["exit_code"] not in (0, 1)]
    return 1 if broken or not consistent else 0


def same_outcomes(runs: dict[str, dict[str, Any]]) -> bool:
    return len({json.dumps(run["outcomes"], sort_keys=True) for run in runs.values()}) <= 1


def write_report(args: argparse.Namespace, runs: dict[str, dict[str, Any]], figures: dict[str, Any]) -> None:
    report = {"schema": 1, "command": [Path(sys.executable).name, *SUITE_COMMAND, *args.pytest_args],
              "host": describe_host(), "runs": runs, **figures, "goals": GOALS,
              "same_outcomes": same_outcomes(runs), "modes_asked": args.modes}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
