"""Time from `harness run` to the first test starting: cold (new environment), warm (cached), current.

Whole-process figures: each run is a fresh `harness run` process; the clock stops when pytest prints
"collected N items", the moment before the first test starts, and the run is then stopped.

    python tests/benchmarks/bench_startup.py [--json OUT]

cold:    an interpreter without torch, so the cpu cell's environment is built (uv, or pip) in a new folder
warm:    the same again, the environment now cached
current: the interpreter running this script, when it already holds the cell's releases
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        bare = bare_interpreter(scratch / "bare")
        figures = {
            "cold_s": time_to_first_test(bare, scratch / "envs", scratch / "results"),
            "warm_s": time_to_first_test(bare, scratch / "envs", scratch / "results"),
            "current_s": time_to_first_test(sys.executable, scratch / "unused", scratch / "results"),
        }
    figures["cold_over_warm"] = figures["cold_s"] / figures["warm_s"]
    for name, value in figures.items():
        print(f"{name:>15}: {value:6.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
