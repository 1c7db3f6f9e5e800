"""Time from `harness run` to the first test starting: cold (new environment), warm (cached), current; or, with
--hosts, a cell across hosts from its hosts' start to its first call answered, at another commit and here.

Whole-process figures: each run is a fresh `harness run` process; the clock stops when pytest prints
"collected N items", the moment before the first test starts, and the run is then stopped.

    python tests/benchmarks/bench_startup.py [--json OUT]
    python tests/benchmarks/bench_startup.py --hosts 4 [--base REV] [--repeat N] [--json OUT]

cold:    an interpreter without torch, so the cpu cell's environment is built (uv, or pip) in a new folder
warm:    the same again, the environment now cached
current: the interpreter running this script, when it already holds the cell's releases

--hosts H: H `harness host` processes on this machine (host 0 at 127.0.0.1, one CPU rank each, as the multi-host
tests run them); the clock starts as the first is started and stops when host 0's first call on all H ranks has
answered: every agent dialled and was admitted, every zygote imported torch, every rank dialled its listener and
formed the process group. The base commit's tree (`git archive`) and this checkout take turns, N runs each, with
this interpreter; each side is handed its cell's secret as it expects it (the base: HARNESS_HOSTS_KEY in the
environment, if its `harness host` has no --credentials; here: a credentials file). Medians and their ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

from base_tree import export

REPO = Path(__file__).resolve().parents[2]


def time_to_first_test(python: str, env_dir: Path, results: Path) -> float:
    command = [python, "-m", "harness", "run", "--env-dir", str(env_dir), "--results", str(results)]
    environ = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    try:
        for line in process.stdout:
            if line.startswith("collected "):
                return time.perf_counter() - started
        raise RuntimeError(f"{' '.join(command)} ended before any test started (exit {process.wait()})")
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def bare_interpreter(folder: Path) -> str:
    """A venv with harness's core dependencies only (no torch), so the cell needs its own environment."""
    venv.create(folder, with_pip=True)
    python = str(folder / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "jinja2", "junitparser", "pyyaml", "nvidia-ml-py",
                    "pytest", "uv"], check=True)
    return python


HOSTS_SUITE = """
def rank_of():
    import torch.distributed as dist

    return dist.get_rank()


def test_first_call(ranks):
    assert ranks.run(WORLD, rank_of) == list(range(WORLD))
    print("FIRST CALL ANSWERED", flush=True)
"""


def cell_secret(tree: Path, folder: Path) -> tuple[list[str], dict[str, str]]:
    """The options and environment that hand `tree`'s hosts their cell's secret, as its engines do."""
    if "--credentials" not in (tree / "harness" / "cli.py").read_text():
        return [], {"HARNESS_HOSTS_KEY": os.urandom(32).hex()}
    made = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                           "from harness.engines.credentials import write; print(write(Path(sys.argv[1]), 'bench'))",
                           str(folder / "private")], env={**os.environ, "PYTHONPATH": str(tree)},
                          capture_output=True, text=True, check=True)
    return ["--credentials", made.stdout.strip()], {}


def time_hosts_startup(tree: Path, hosts: int, folder: Path) -> float:
    """Seconds from starting a cell's `harness host` processes to its first call on every host answered."""
    from harness.ranks.ports import port_outside_ephemeral_range

    folder.mkdir(parents=True)
    (folder / "test_startup.py").write_text(HOSTS_SUITE.replace("WORLD", str(hosts)))
    options, secret = cell_secret(tree, folder)
    environ = {**os.environ, **secret, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": ""}
    environ.pop("HARNESS_RANKS_POOL", None)
    host = [sys.executable, "-m", "harness", "host", f"--count={hosts}", "--host0=127.0.0.1", "--ranks-per-host=1",
            f"--hub-port={port_outside_ephemeral_range('127.0.0.1')}", *options]
    processes = []
    started = time.perf_counter()
    try:
        for index in range(1, hosts):
            processes.append(subprocess.Popen([*host, f"--index={index}"], env=environ, cwd=folder,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                              start_new_session=True))
        leader = subprocess.Popen([*host, "--index=0", "--cpu-ranks", f"--cwd={folder}", "--", sys.executable, "-m",
                                   "pytest", "-s", "-q", "-p", "no:cacheprovider", "test_startup.py"], env=environ,
                                  cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True)
        processes.append(leader)
        seen = []
        for line in leader.stdout:
            seen.append(line)
            if "FIRST CALL ANSWERED" in line:
                return time.perf_counter() - started
        raise RuntimeError(f"the cell at {tree} ended before its first call answered:\n{''.join(seen)[-3000:]}")
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def hosts_main(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-hosts-") as scratch:
        folder = Path(scratch)
        trees = {"base": export(args.base, folder), "current": REPO}
        seconds: dict[str, list[float]] = {"base": [], "current": []}
        for run in range(args.repeat):
            for side in ("base", "current") if run % 2 == 0 else ("current", "base"):  # neither always goes first
                seconds[side].append(time_hosts_startup(trees[side], args.hosts, folder / f"{side}{run}"))
                print(f"{side:>8} run {run + 1}: {seconds[side][-1]:6.2f} s", flush=True)
    medians = {side: statistics.median(values) for side, values in seconds.items()}
    return {"hosts": args.hosts, "base_revision": args.base, "runs": seconds,
            "base_median_s": round(medians["base"], 2), "current_median_s": round(medians["current"], 2),
            "current_over_base": round(medians["current"] / medians["base"], 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--hosts", type=int, help="time a cell across this many hosts (on this machine) instead")
    parser.add_argument("--base", default="main", help="--hosts: the commit to compare with (default main)")
    parser.add_argument("--repeat", type=int, default=3, help="--hosts: runs of each side (default 3)")
    args = parser.parse_args()
    figures = hosts_main(args) if args.hosts else single_host_figures()
    for name, value in figures.items():
        print(f"{name:>18}: {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


def single_host_figures() -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        bare = bare_interpreter(scratch / "bare")
        figures = {
            "cold_s": time_to_first_test(bare, scratch / "envs", scratch / "results"),
            "warm_s": time_to_first_test(bare, scratch / "envs", scratch / "results"),
            "current_s": time_to_first_test(sys.executable, scratch / "unused", scratch / "results"),
        }
    figures["cold_over_warm"] = figures["cold_s"] / figures["warm_s"]
    return figures


if __name__ == "__main__":
    raise SystemExit(main())
