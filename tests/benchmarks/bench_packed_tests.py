"""Tests packed within a cell (issue 45): one pytest selection run one test after another and with `--pack-tests`,
in one run on this machine, so the ratio is measured under the same load.

    python tests/benchmarks/bench_packed_tests.py [PYTEST_ARGS...] [--limit S] [--json OUT] [--logs DIR]

PYTEST_ARGS select the tests (default: the one-device tier, tests/gpu/test_one_device.py); both runs get
`-p harness.ranks.plugin -p no:randomly` and a junit.xml of their own. On a GPU host the one-device tests share
the GPU (harness.ranks.gpushare); with CUDA hidden (`CUDA_VISIBLE_DEVICES=`) the tests that name a world size are
packed on the cores. Prints each run's wall seconds, tests and outcomes, the packed / serial ratio (issue 45's goal
for the one-device tier on one GPU: at most 0.5) and every test whose outcome differs between the runs (must be
none). A run cut at --limit says so; its ratio is then of tests per second.
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
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEFAULT_SELECTION = ["tests/gpu/test_one_device.py"]


def run(pytest_args: list[str], junit: Path, limit: float, *extra: str, log: Path | None = None) -> dict:
    stream = junit.with_suffix(".jsonl")  # what a run cut before junit.xml is written finished (outcome_stream.py)
    command = [sys.executable, "-m", "pytest", "-p", "harness.ranks.plugin", "-p", "no:randomly",
               "-p", "no:cacheprovider", "-p", "outcome_stream", f"--outcome-stream={stream}", "-q",
               f"--junitxml={junit}", "-o", "junit_family=xunit1", *pytest_args, *extra]
    started = time.perf_counter()
    try:
        completed = subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   timeout=limit, env=with_outcome_stream())
        cut, output = False, completed.stdout
        tail = output.strip().splitlines()[-1:]
    except subprocess.TimeoutExpired as expired:
        cut, tail = True, [f"cut at {limit:.0f} s"]
        output = expired.output.decode(errors="replace") if isinstance(expired.output, bytes) else expired.output or ""
    if log is not None:  # the whole output: the pool's summary line, retirements, a failure's traceback
        log.write_text(output)
    wall = time.perf_counter() - started
    outcomes = read_outcomes(junit) if junit.exists() else read_stream(stream)
    return {"wall_s": round(wall, 1), "cut": cut, "tests": len(outcomes),
            "outcomes": dict(collections.Counter(outcomes.values())), "last_line": tail[0] if tail else "",
            "by_test": outcomes}


def with_outcome_stream() -> dict[str, str]:
    """This environment, with outcome_stream.py importable by pytest's `-p outcome_stream`."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}


def read_outcomes(junit: Path) -> dict[str, str]:
    found = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        tags = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        kind = tags[0] if tags else "passed"
        if kind == "skipped" and (case.find("skipped").get("type") == "pytest.xfail"):
            kind = "xfailed"
        found[f"{case.get('classname')}::{case.get('name')}"] = kind
    return found


def read_stream(stream: Path) -> dict[str, str]:
    if not stream.exists():
        return {}
    return {line["test"]: line["outcome"] for line in map(json.loads, stream.read_text().splitlines())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=float, default=580.0, help="seconds each run may take (default 580)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--logs", type=Path, help="keep each run's whole output here (serial.log, packed.log)")
    args, pytest_args = parser.parse_known_args()
    pytest_args = pytest_args or DEFAULT_SELECTION
    with tempfile.TemporaryDirectory(prefix="bench-packed-") as scratch:
        logs = args.logs
        if logs:
            logs.mkdir(parents=True, exist_ok=True)
        serial = run(pytest_args, Path(scratch) / "serial.xml", args.limit, log=logs and logs / "serial.log")
        packed = run(pytest_args, Path(scratch) / "packed.xml", args.limit, "--pack-tests",
                     log=logs and logs / "packed.log")
    common = serial["by_test"].keys() & packed["by_test"].keys()
    differ = sorted(test for test in common if serial["by_test"][test] != packed["by_test"][test])
    if serial["cut"] or packed["cut"]:
        rates = [run_["tests"] / run_["wall_s"] for run_ in (serial, packed)]
        ratio, what = (rates[0] / rates[1] if rates[1] else float("nan")), "seconds per test, packed / serial"
    else:
        ratio, what = packed["wall_s"] / serial["wall_s"], "wall, packed / serial"
    for name, figures in (("serial", serial), ("packed", packed)):
        print(f"{name}: {figures['wall_s']} s, {figures['tests']} tests {figures['outcomes']}"
              f"{' (cut)' if figures['cut'] else ''}: {figures['last_line']}")
    print(f"ratio ({what}): {ratio:.2f}; outcomes that differ: {len(differ)} {differ[:5]}")
    if args.json:
        args.json.write_text(json.dumps({"selection": pytest_args, "ratio": ratio, "ratio_of": what,
                                         "differ": differ, **{name: {k: v for k, v in run_.items() if k != "by_test"}
                                                              for name, run_ in (("serial", serial),
                                                                                 ("packed", packed))}}, indent=1))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
