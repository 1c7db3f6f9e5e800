"""The suite's wall time at another commit and at this checkout, one after the other on this machine, and their
ratio (issue 31: the embedded default with the training layer at most 1.5x the suite before it).

    python tests/benchmarks/bench_suite_time.py [--base REV] [--json OUT] [-- PYTEST_ARGS...]

Each side runs `python -m pytest tests/gpu` (its own tree: the base commit exported with `git archive` into a
temporary folder, its `harness` first on the import path) with this interpreter's torch and transformers, 2 gloo
ranks unless HARNESS_CPU_RANKS says otherwise, and the same PYTEST_ARGS (e.g. `-k mixtral` for a quick look).
Prints each side's seconds, its outcome counts and its slowest test files (from its junit.xml), then the ratio.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from xml.etree import ElementTree

from base_tree import export

REPO = Path(__file__).resolve().parents[2]
DEFAULT_BASE = "ba0dc9e"  # the commit before the training layer


def timed_suite(tree: Path, junit: Path, pytest_args: list[str]) -> dict:
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")])),
               "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "pytest", "tests/gpu", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
               *pytest_args]
    started = time.perf_counter()
    completed = subprocess.run(command, cwd=tree, env=environ, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    return {"seconds": round(seconds, 1), "exit": completed.returncode, **junit_summary(junit)}


def junit_summary(junit: Path) -> dict:
    """Outcome counts and the five test files that took longest, from a junit.xml."""
    outcomes, by_file = collections.Counter(), collections.Counter()
    for case in ElementTree.parse(junit).iter("testcase"):
        skipped = case.find("skipped")
        if case.find("failure") is not None or case.find("error") is not None:
            outcomes["failed"] += 1
        elif skipped is not None:
            outcomes["xfailed" if "xfail" in (skipped.get("type") or "") else "skipped"] += 1
        else:
            outcomes["passed"] += 1
        by_file[case.get("classname", "").rsplit(".", 1)[-1]] += float(case.get("time") or 0)
    return {"outcomes": dict(outcomes), "slowest_files": {name: round(t, 1) for name, t in by_file.most_common(5)}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=DEFAULT_BASE, help=f"the commit to compare with (default {DEFAULT_BASE})")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: passed to both sides' pytest")
    args = parser.parse_args()
    pytest_args = [arg for arg in args.pytest_args if arg != "--"]
    with tempfile.TemporaryDirectory(prefix="bench-suite-") as scratch:
        folder = Path(scratch)
        base = timed_suite(export(args.base, folder), folder / "base.xml", pytest_args)
        current = timed_suite(REPO, folder / "current.xml", pytest_args)
    figures = {"base": {"revision": args.base, **base}, "current": current,
               "ratio": round(current["seconds"] / base["seconds"], 2)}
    for side in ("base", "current"):
        each = figures[side]
        print(f"{side:8s} {each['seconds']:7.1f} s  exit {each['exit']}  {each['outcomes']}  slowest: "
              f"{each['slowest_files']}")
    print(f"ratio    {figures['ratio']}x (current / base, one after the other on this machine)")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
