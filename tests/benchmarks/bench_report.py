"""Time `harness report` on synthetic result sets and show that it grows linearly. Not a pytest
file; run it directly:

    python tests/benchmarks/bench_report.py [--cells 100] [--cases 2000] [--repeat 3] [--load]
    python tests/benchmarks/bench_report.py --failures 300000 [--cells 100]

It renders every format for the full set (goal: under 2 s for 100 cells x 2,000 cases), a set with
half the cells and one with a quarter, and prints each time against the time of the smallest set
next to the size ratio: equal ratios mean linear. With --load it also writes the sets as cell
folders (junit.xml, env.json, memory.json) and times reading them back.

With --failures N it renders a night of N failures instead (the same tests failing in every one of --cells cells,
each with its own message, a 20-line traceback and the metrics a failing case records), as the nightly does: the
HTML report, the PR comment, the job summary, `harness triage`'s table and the nightly issue, each timed, its peak
Python memory taken with tracemalloc (a second, traced run) and its size printed. Run it at a base commit's checkout
and at this one to compare (the file imports the `harness` of the checkout it sits in).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import tracemalloc
import xml.etree.ElementTree as ElementTree
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for `harness`

from harness.report.render import FORMATS, render
from harness.results import (
    CellInfo,
    CellResult,
    CellStatus,
    Counts,
    GpuMemory,
    Outcome,
    ResultSet,
    TestResult,
    load_results,
)

SKIP_REASONS = ("needs 4 GPUs", "needs 8 GPUs", "needs torch>=2.14 for nvfp4 fake quant")
TRACEBACK = "\n".join(f"    line {line} of the traceback: tensor([0.1, 0.2, 0.3])" for line in range(20))


def synthetic_outcome(cell: int, case: int) -> Outcome:
    """About 1% failed, 0.3% errored, 0.5% flaky, 10% skipped, 1% xfailed; the rest passed."""
    roll = (cell * 7919 + case * 104729) % 1000
    if roll < 10:
        return Outcome.FAILED
    if roll < 13:
        return Outcome.ERRORED
    if roll < 18:
        return Outcome.FLAKY
    if roll < 118:
        return Outcome.SKIPPED
    if roll < 128:
        return Outcome.XFAILED
    return Outcome.PASSED


def synthetic_test(cell: int, case: int) -> TestResult:
    outcome = synthetic_outcome(cell, case)
    name = f"test_case_{case}[{2 ** (1 + case % 3)}-{('bf16', 'fp32')[case % 2]}]"
    message = None
    if outcome.is_failing:
        message = f"routing differs: layer {case % 4} sends {case % 32} of 32 tokens to other experts"
    elif outcome in (Outcome.SKIPPED, Outcome.XFAILED):
        message = SKIP_REASONS[case % len(SKIP_REASONS)]
    world = 2 ** (1 + case % 3)
    properties = (
        ("max_rel_grad_error", f"{1e-4 * (1 + (case * cell) % 250):.3e}"), ("grad_error_bound", "3e-02"),
        ("min_routing_margin", f"{0.1 + case % 7 / 50:.3f}"), ("world_size", str(world)), ("dtype", "bf16"),
        *((f"peak_allocated_mib.rank{rank}", "2048.5") for rank in range(world)),
    )
    return TestResult(test_id=f"tests/gpu/test_suite_{case % 10}.py::{name}", name=name, outcome=outcome,
                      message=message, excerpt=TRACEBACK if outcome.is_failing else None,
                      attempts=3 if outcome is Outcome.FLAKY else 1, duration_s=0.5, properties=properties)


def synthetic_set(cells: int, cases: int) -> ResultSet:
    results = []
    for cell in range(cells):
        tests = tuple(synthetic_test(cell, case) for case in range(cases))
        counts = Counts.of(tests)
        cell_id = f"h200-8gpu-torch2.{cell // 10}.0-tf5.{cell % 10}.0"
        results.append(CellResult(
            info=CellInfo(id=cell_id, gpu="h200", gpus=8, torch=f"2.{cell // 10}.0",
                          transformers=f"5.{cell % 10}.0", matrix="nightly"),
            status=CellStatus.FAILED if counts.failed or counts.errored else CellStatus.PASSED,
            tests=tests, duration_s=600.0 + cell,
            memory=tuple(GpuMemory(index=gpu, total_mib=143771.0, used_before_mib=512.0,
                                   peak_used_mib=40000.0 + 100 * gpu + cell) for gpu in range(8)),
            reproduce=f"harness run --matrix nightly --cell '{cell_id}'",
        ))
    return ResultSet(tuple(results))


def write_folders(result_set: ResultSet, root: Path) -> None:
    """The set as cell folders in the contract layout, junit.xml shaped like pytest's xunit1."""
    for cell in result_set.cells:
        folder = root / cell.id
        folder.mkdir(parents=True)
        document = ElementTree.Element("testsuites")
        suite = ElementTree.SubElement(document, "testsuite", name="pytest", time="600.0")
        for test in cell.tests:
            path, name = test.test_id.split("::")
            attributes = {"classname": path.removesuffix(".py").replace("/", "."), "name": name, "file": path,
                          "time": "0.5"}
            for _ in range(test.attempts - 1):  # pytest-rerunfailures: an empty entry per rerun attempt
                ElementTree.SubElement(suite, "testcase", attributes)
            case = ElementTree.SubElement(suite, "testcase", attributes)
            properties = ElementTree.SubElement(case, "properties")
            for key, value in test.properties:
                ElementTree.SubElement(properties, "property", name=key, value=value)
            kind = {Outcome.FAILED: "failure", Outcome.ERRORED: "error", Outcome.SKIPPED: "skipped",
                    Outcome.XFAILED: "skipped"}.get(test.outcome)
            if kind:
                result = ElementTree.SubElement(case, kind, message=test.message or "")
                result.set("type", "pytest.xfail" if test.outcome is Outcome.XFAILED else "pytest.skip")
                result.text = test.excerpt
        ElementTree.ElementTree(document).write(folder / "junit.xml", encoding="utf-8", xml_declaration=True)
        (folder / "env.json").write_text(json.dumps({
            "schema": 1, "cell": {"id": cell.id, "gpu": "h200", "gpus": 8, "matrix": "nightly"},
            "status": cell.status.value, "error": None, "exit_code": 1, "duration_s": cell.duration_s}))
        (folder / "memory.json").write_text(json.dumps({"schema": 1, "available": True, "gpus": [
            {"index": gpu.index, "total_mib": gpu.total_mib, "peak_used_mib": gpu.peak_used_mib}
            for gpu in cell.memory]}))


def best_of(repeat: int, work) -> tuple[float, object]:
    best, value = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        value = work()
        best = min(best, time.perf_counter() - start)
    return best, value


def failing_set(failures: int, cells: int) -> ResultSet:
    """`failures` failing tests over `cells` cells: the same tests in every cell, each failure its own message."""
    per_cell = failures // cells
    results = []
    for cell in range(cells):
        tests = tuple(
            TestResult(test_id=f"tests/gpu/test_suite_{case % 10}.py::test_case_{case}[2-bf16]",
                       name=f"test_case_{case}[2-bf16]", outcome=Outcome.FAILED,
                       message=f"routing differs: layer {case % 4} sends {1 + case % 31} of 32 tokens to other experts "
                               f"than the whole model (cell {cell})",
                       excerpt=TRACEBACK, duration_s=0.5,
                       properties=(("max_rel_grad_error", f"{1e-4 * (1 + (case * cell) % 250):.3e}"),
                                   ("grad_error_bound", "3e-02"), ("world_size", "2")))
            for case in range(per_cell))
        cell_id = f"h200-8gpu-torch2.{cell // 10}.0-tf5.{cell % 10}.0"
        results.append(CellResult(
            info=CellInfo(id=cell_id, gpu="h200", gpus=8, torch=f"2.{cell // 10}.0", transformers=f"5.{cell % 10}.0",
                          matrix="nightly"),
            status=CellStatus.FAILED, tests=tests, duration_s=600.0, reproduce=f"harness run --cell '{cell_id}'"))
    return ResultSet(tuple(results))


def measured(work) -> tuple[float, float, int]:
    """(seconds, peak MiB of Python allocations, characters of the text) of `work()`: timed untraced, then its peak
    taken in a second run under tracemalloc (which slows it)."""
    start = time.perf_counter()
    text = work()
    seconds = time.perf_counter() - start
    del text
    tracemalloc.start()
    text = work()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return seconds, peak / 2**20, len(text.encode("utf-8"))


def failures_main(failures: int, cells: int) -> int:
    from harness.report.render import render_nightly
    from harness.report.triage_view import render_triage
    from harness.results import nightly_regressions
    from harness.results.triage import triage, with_bisects

    result_set = failing_set(failures, cells)
    print(f"{result_set.counts.failed:,} failures in {cells} cells")
    renderings = {
        "html": lambda: render(result_set, "html"),
        "pr-comment": lambda: render(result_set, "pr-comment"),
        "summary": lambda: render(result_set, "summary"),
        "triage table": lambda: render_triage(with_bisects(triage(result_set, None), {}), baseline=False),
        "nightly issue": lambda: render_nightly(
            "issue", marker="<!-- harness-nightly -->", sha="0" * 12, run_url=None, matrix="nightly",
            against="no earlier results", report="", triage="",
            regressions=nightly_regressions(result_set, None, memory_mib=256, memory_percent=5)),
    }
    print(f"{'rendering':<14} {'seconds':>8} {'peak MiB':>9} {'bytes':>13}")
    for name, work in renderings.items():
        seconds, peak_mib, size = measured(work)
        print(f"{name:<14} {seconds:>8.2f} {peak_mib:>9.1f} {size:>13,}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=100)
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs (default 3)")
    parser.add_argument("--load", action="store_true", help="also time reading the sets back from disk")
    parser.add_argument("--failures", type=int, metavar="N",
                        help="render a night of N failures in every format the nightly writes, instead")
    args = parser.parse_args(argv)
    if args.failures:
        return failures_main(args.failures, args.cells)

    sizes = [max(1, args.cells // 4), max(1, args.cells // 2), args.cells]
    rows = []
    for cells in sizes:
        result_set = synthetic_set(cells, args.cases)
        timings = {}
        for fmt in FORMATS:
            timings[fmt], text = best_of(args.repeat, lambda f=fmt, results=result_set: render(results, f))
            timings[fmt + " chars"] = len(text)
        timings["all formats"] = sum(timings[fmt] for fmt in FORMATS)
        if args.load:
            with tempfile.TemporaryDirectory() as scratch:
                write_folders(result_set, Path(scratch))
                timings["load"], loaded = best_of(1, lambda scratch=scratch: load_results([scratch]))
                assert loaded.counts == result_set.counts, "the folders read back differently"
        rows.append((cells, timings))

    smallest_cells, smallest = rows[0]
    columns = [*FORMATS, "all formats", *(["load"] if args.load else [])]
    print(f"render time in seconds, best of {args.repeat}; {args.cases:,} cases per cell")
    print(f"{'cells':>6} {'tests':>9} " + " ".join(f"{column:>12}" for column in columns)
          + f" {'size ratio':>11} {'time ratio':>11}")
    for cells, timings in rows:
        times = " ".join(f"{timings[column]:>12.3f}" for column in columns)
        size_ratio, time_ratio = cells / smallest_cells, timings["all formats"] / smallest["all formats"]
        print(f"{cells:>6} {cells * args.cases:>9,} {times} {size_ratio:>11.2f} {time_ratio:>11.2f}")
    largest = rows[-1][1]
    print("output size (chars): " + ", ".join(f"{fmt} {largest[fmt + ' chars']:,}" for fmt in FORMATS))
    slowest = max(largest[fmt] for fmt in FORMATS)
    verdict = "under" if slowest < 2.0 else "OVER"
    print(f"slowest format for {args.cells} x {args.cases:,}: {slowest:.3f} s ({verdict} the 2 s goal)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
