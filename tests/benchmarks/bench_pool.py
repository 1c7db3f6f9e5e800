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

`--shards N` runs each mode as N pytest processes at once, each with every N-th test (shard_plugin.py), for a
machine with more cores than one suite uses (the device's 16): a mode's wall is from the first start to the
last exit, its outcomes and calls are the shards' sums. Both modes are sharded alike, so the ratio still
compares one spawn per call with the pool on the same tests under the same load.
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
    parser.add_argument("--shards", type=int, default=1, help="pytest processes at once per mode, each with every "
                        "N-th test (default 1)")
    parser.add_argument("--sample", type=int, default=1, help="keep every M-th test of the selection (default 1: all)")
    args = parser.parse_args(ours)
    args.pytest_args = pytest_args
    args.modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    unknown = [mode for mode in args.modes if mode not in MODES]
    if unknown or not args.modes:
        parser.error(f"--modes takes {', '.join(MODES)}; got {args.modes}")
    if args.shards < 1 or args.sample < 1:
        parser.error(f"--shards and --sample take whole numbers >= 1; got {args.shards}, {args.sample}")
    return args


def suite(mode: str, pytest_args: list[str], timing: Path, shards: int = 1,
          sample: int = 1) -> tuple[list[str], int, float]:
    """Run the suite once (as `shards` processes at once); the output's lines of each shard, the worst exit code
    and the wall time from the first start to the last exit. Shard k's calls go to `timing` with suffix .k."""
    command = [sys.executable, *SUITE_COMMAND, *pytest_args]
    if shards > 1 or sample > 1:
        command += ["-p", "shard_plugin"]
    print(f"[{mode}] {' '.join(command[1:])}" + (f" (x{shards} shards)" if shards > 1 else ""), file=sys.stderr,
          flush=True)
    started = time.perf_counter()
    processes = []
    for shard in range(shards):
        environ = suite_environ(timing.with_suffix(f".{shard}") if shards > 1 else timing,
                                HARNESS_RANKS_POOL=MODES[mode])
        if shards > 1 or sample > 1:
            environ.update(HARNESS_BENCH_SHARD=f"{shard}/{shards}", HARNESS_BENCH_SAMPLE=str(sample))
            environ["PYTHONPATH"] = os.pathsep.join([environ["PYTHONPATH"], str(Path(__file__).resolve().parent)])
        processes.append(subprocess.Popen(command, cwd=REPO, env=environ, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
    outputs = [process.communicate()[0] for process in processes]
    wall_s = time.perf_counter() - started
    codes = [process.returncode for process in processes]
    worst = next((code for code in codes if code not in (0, 1)), max(codes))
    return outputs, worst, wall_s


def run_suite(mode: str, pytest_args: list[str], scratch: Path, shards: int = 1, sample: int = 1) -> dict[str, Any]:
    timing = scratch / f"timing-{mode}.jsonl"
    outputs, exit_code, wall_s = suite(mode, pytest_args, timing, shards, sample)
    summaries = [lines[-1] if (lines := output.strip().splitlines()) else "" for output in outputs]
    outcomes: dict[str, int] = {}
    for summary in summaries:
        for count, kind in OUTCOME.findall(summary):
            key = kind.rstrip("s") if kind in ("errors", "warnings") else kind
            outcomes[key] = outcomes.get(key, 0) + int(count)
    pool_lines = [line for output in outputs for line in output.splitlines()
                  if line.startswith("rank pool: ") and "calls" in line]
    figures = {"mode": mode, "exit_code": exit_code, "wall_s": wall_s, "shards": shards,
               "summary": " | ".join(summaries), "outcomes": outcomes,
               "pool_line": " | ".join(pool_lines) or None}
    calls = [call for path in ([timing] if shards == 1 else [timing.with_suffix(f".{k}") for k in range(shards)])
             for call in read_timing(path)]
    if calls:
        figures.update(calls=len(calls), work_s=sum(call["work_s"] or 0.0 for call in calls),
                       calls_s=sum(call["call_s"] for call in calls),
                       pool_start_s=sum(call["pool_start_s"] for call in calls),
                       pools_started=pools_started(calls))
    if exit_code not in (0, 1):  # 1: tests failed; anything else: the run itself broke
        print("\n".join(output[-4000:] for output in outputs), file=sys.stderr)
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
        *_, startup_s = suite("on", [*args.pytest_args, "--collect-only"], Path(scratch) / "unused")
        for mode in args.modes:
            runs[mode] = run_suite(mode, args.pytest_args, Path(scratch), args.shards, args.sample)
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
    report = {"schema": 1, "shards": args.shards, "sample": args.sample,
              "command": [Path(sys.executable).name, *SUITE_COMMAND, *args.pytest_args],
              "host": describe_host(), "runs": runs, **figures, "goals": GOALS,
              "same_outcomes": same_outcomes(runs), "modes_asked": args.modes}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
