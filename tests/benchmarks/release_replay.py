"""A release day replayed: the suite on the installed release with the known-bugs table as it stood when an older
release was the newest (HARNESS_KNOWN_BUGS_AS_OF), beside the same suite with the whole table. Not a pytest file:

    python tests/benchmarks/release_replay.py OUT.json --as-of 5.23.0 [--shards N] [-- EXTRA PYTEST ARGS]

Both runs go at once, each as N pytest processes with every N-th test (shard_plugin.py), each shard writing its own
junit.xml. The replay holds when the reds of the as-of run are the reds of the whole-table run plus exactly the cases
the whole table explains with entries first bad after the as-of release: the morning after, every red left is a
change of the new release, and each of them is later recorded as such. OUT.json has both sets and the verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "gpu"))


def run_shards(folder: Path, shards: int, environment: dict[str, str], extra: list[str]) -> list[subprocess.Popen]:
    folder.mkdir(parents=True, exist_ok=True)
    processes = []
    for shard in range(shards):
        command = [sys.executable, "-m", "pytest", "tests/gpu", "-p", "harness.ranks.plugin", "-p", "shard_plugin",
                   "-q", "-p", "no:cacheprovider", "-o", "junit_family=xunit1",
                   f"--junitxml={folder / f'junit-{shard}.xml'}", *extra]
        env = {**os.environ, **environment, "HARNESS_BENCH_SHARD": f"{shard}/{shards}",
               "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "benchmarks"), os.environ.get("PYTHONPATH", "")])}
        with open(folder / f"pytest-{shard}.log", "w") as log:
            processes.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
    return processes


def cases(folder: Path) -> dict[str, tuple[str, str | None]]:
    """test id -> (outcome, the known-bug key it xfailed with)."""
    found = {}
    for junit in sorted(folder.glob("junit-*.xml")):
        for case in ElementTree.parse(junit).getroot().iter("testcase"):
            test_id = f"{case.get('classname')}::{case.get('name')}"
            properties = {each.get("name"): each.get("value") for each in case.iter("property")}
            if case.find("failure") is not None or case.find("error") is not None:
                found[test_id] = ("red", None)
            elif (skipped := case.find("skipped")) is not None and skipped.get("type") == "pytest.xfail":
                found[test_id] = ("xfailed", properties.get("known_bug"))
            else:
                found[test_id] = ("other", None)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=Path)
    parser.add_argument("--as-of", required=True, metavar="V", help="the release that was the newest that morning")
    parser.add_argument("--shards", type=int, default=4, help="pytest processes per run (default 4)")
    args, extra = parser.parse_known_args()
    extra = [each for each in extra if each != "--"]
    import known_bugs
    from packaging.version import Version

    work = args.json.with_suffix("")
    start = time.monotonic()
    running = (run_shards(work / "as-of", args.shards, {known_bugs.AS_OF_ENV: args.as_of}, extra)
               + run_shards(work / "whole", args.shards, {known_bugs.AS_OF_ENV: ""}, extra))
    for process in running:
        process.wait()
    as_of, whole = cases(work / "as-of"), cases(work / "whole")
    later = {bug.key for bug in known_bugs.KNOWN_BUGS
             if (first := known_bugs.first_bad(bug)) is not None and first > Version(args.as_of)}
    reds_as_of = {test for test, (outcome, _) in as_of.items() if outcome == "red"}
    reds_whole = {test for test, (outcome, _) in whole.items() if outcome == "red"}
    new_in_release = {test for test, (outcome, key) in whole.items() if outcome == "xfailed" and key in later}
    figures = {
        "as_of": args.as_of, "wall_s": round(time.monotonic() - start, 1), "cases": len(whole),
        "reds_as_of": sorted(reds_as_of), "reds_whole_table": sorted(reds_whole),
        "explained_by_entries_first_bad_after": sorted(new_in_release), "entries_first_bad_after": sorted(later),
        "holds": reds_as_of == reds_whole | new_in_release,
    }
    args.json.write_text(json.dumps(figures, indent=1) + "\n")
    print(json.dumps({key: value if not isinstance(value, list) else len(value) for key, value in figures.items()}))
    return 0 if figures["holds"] else 1


if __name__ == "__main__":
    sys.exit(main())
