"""Time the history: appending one night of --cells x --cases to a history of --nights nights, and rendering the
trend page from it. Not a pytest file; run it directly:

    python tests/benchmarks/bench_history.py [--cells 100] [--cases 2000] [--nights 30]

The earlier nights go into the database through `append_night` (generated: a few percent of noise around each
test's level, one test's memory 30% up from three nights before the last); the last night is written as cell
folders and appended as the nightly does it (read the folders, then append), each step timed. Goal (issue 33):
append under 5 s, trend page under 2 s. Prints the database's size and checks the planted creep is the regression
found.
"""

from __future__ import annotations

import argparse
import gc
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for `harness`
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))  # history_helpers

from history_helpers import Case, write_cell

from harness.history import append_night, build_trend, open_history
from harness.history.night_reader import read_night
from harness.history.rows import NightCell, NightTest
from harness.report.trend_page import render_page

CREEP = (0, 0)  # (cell, case)


def cpu_seconds() -> float:
    """This process's CPU time and that of its children that ended (read_night's worker processes)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def level(cell: int, case: int) -> tuple[float, float]:
    return 500.0 + 7.0 * (case % 300), 2.0 + (cell + case) % 9


def value(rng: random.Random, night: int, nights: int, cell: int, case: int) -> tuple[float, float]:
    memory, seconds = level(cell, case)
    memory *= rng.uniform(0.98, 1.02)
    if (cell, case) == CREEP and night >= nights - 3:
        memory *= 1.3
    return round(memory, 1), round(seconds * rng.uniform(0.9, 1.1), 3)


def cell_id(cell: int) -> str:
    return f"h200-8gpu-torch2.11.0-tf5.{cell}.0"


def test_id(case: int) -> str:
    return f"tests/gpu/test_ep.py::test_ep_gradients[family{case}-eager-{2 ** (case % 3 + 1)}-float32]"


def fill_earlier_nights(db: Path, nights: int, cells: int, cases: int) -> None:
    connection = open_history(db, create=True)
    rng = random.Random(1)
    for night in range(nights - 1):
        night_cells = []
        for cell in range(cells):
            tests = []
            for case in range(cases):
                memory, seconds = value(rng, night, nights, cell, case)
                tests.append(NightTest(test=test_id(case), outcome="passed", time_s=seconds, peak_mib=memory,
                                       error_over_bound=rng.uniform(0.01, 0.05),
                                       rank_peaks=((0, memory), (1, round(memory * 0.99, 1))),
                                       losses=(2.5, 2.1, 1.9) if case % 10 == 0 else ()))
            night_cells.append(NightCell(cell=cell_id(cell), tests=tuple(tests)))
        append_night(connection, f"run-{night}", f"2026-01-{night + 1:02d}T02:00:00+00:00", night_cells)
    connection.close()


def write_last_night(root: Path, nights: int, cells: int, cases: int) -> None:
    rng = random.Random(2)
    for cell in range(cells):
        listed = []
        for case in range(cases):
            memory, seconds = value(rng, nights - 1, nights, cell, case)
            listed.append(Case(test_id=test_id(case), time_s=seconds, peaks_mib=(memory, round(memory * 0.99, 1)),
                               error=round(rng.uniform(1e-6, 5e-6), 9), bound=1e-4,
                               losses=(2.5, 2.1, 1.9) if case % 10 == 0 else ()))
        write_cell(root, cell_id(cell), listed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=100)
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--nights", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        root = Path(temporary)
        db = root / "history.db"
        fill_earlier_nights(db, args.nights, args.cells, args.cases)
        write_last_night(root / "last", args.nights, args.cells, args.cases)
        tests = args.cells * args.cases

        # Wall and CPU seconds: on a machine shared with other work the wall clock says more about them than us.
        start, cpu = time.perf_counter(), cpu_seconds()
        results = read_night([root / "last"])
        read_s, read_cpu = time.perf_counter() - start, cpu_seconds() - cpu
        connection = open_history(db, create=False)
        start, cpu = time.perf_counter(), cpu_seconds()
        append_night(connection, f"run-{args.nights - 1}", f"2026-02-{args.nights:02d}T02:00:00+00:00", results)
        append_s, append_cpu = time.perf_counter() - start, cpu_seconds() - cpu
        start = time.perf_counter()
        append_night(connection, f"run-{args.nights - 1}", f"2026-02-{args.nights:02d}T02:00:00+00:00", results)
        again_s = time.perf_counter() - start
        connection.close()
        # The nightly renders in its own process (`harness trend`): not with the night just read still in memory.
        del results
        gc.collect()

        start, cpu = time.perf_counter(), cpu_seconds()
        connection = open_history(db, create=False)
        trend = build_trend(connection, 30)
        connection.close()
        page = render_page(trend)
        trend_s, trend_cpu = time.perf_counter() - start, cpu_seconds() - cpu

        print(f"{args.nights} nights x {args.cells} cells x {args.cases} cases ({tests:,} tests a night); "
              f"database {db.stat().st_size / 2**20:.0f} MiB")
        print(f"append one night: read folders {read_s:.2f} s + append {append_s:.2f} s = {read_s + append_s:.2f} s "
              f"(goal < 5 s; CPU {read_cpu:.2f} + {append_cpu:.2f} s); again (same night, replaced) {again_s:.2f} s")
        print(f"trend page: {trend_s:.2f} s (goal < 2 s; CPU {trend_cpu:.2f} s), {len(page) / 2**20:.1f} MiB, "
              f"{len(trend.plotted)} tests "
              f"plotted, regressions: {[(r.cell, r.test, r.creep.metric) for r in trend.regressions]}")
        found = [(r.cell, r.test) for r in trend.regressions]
        return 0 if found == [(cell_id(CREEP[0]), test_id(CREEP[1]))] else 1


if __name__ == "__main__":
    raise SystemExit(main())
