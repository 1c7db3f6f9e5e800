"""Nights of results for the history's tests and benchmark: cell folders in the contract layout (junit.xml shaped
like pytest's, env.json), and the generated 30-night history with one planted creep."""

from __future__ import annotations

import json
import random
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    test_id: str = "tests/gpu/test_ep.py::test_ep_gradients[qwen3_moe-eager-2-float32]"
    outcome: str = "passed"  # passed, failed or skipped
    time_s: float | str = 2.0
    peaks_mib: tuple[float | str, ...] = (1000.0, 1010.0)  # per rank
    error: float | str | None = 1e-6
    bound: float | str | None = 1e-4
    losses: tuple[float | str, ...] = ()
    extra: tuple[tuple[str, str], ...] = field(default=())


def write_cell(root: Path, cell_id: str, cases: list[Case]) -> Path:
    folder = root / cell_id
    folder.mkdir(parents=True)
    document = ElementTree.Element("testsuites")
    suite = ElementTree.SubElement(document, "testsuite", name="pytest", time="1.0")
    failed = False
    for case in cases:
        path, name = case.test_id.split("::", 1)
        element = ElementTree.SubElement(suite, "testcase", classname=path.removesuffix(".py").replace("/", "."),
                                         name=name, file=path, time=str(case.time_s))
        properties = ElementTree.SubElement(element, "properties")
        values = [("world_size", "2"), *((f"peak_allocated_mib.rank{rank}", str(peak))
                                         for rank, peak in enumerate(case.peaks_mib))]
        if case.error is not None:
            values += [("max_rel_grad_error", str(case.error)), ("grad_error_bound", str(case.bound))]
        if case.losses:
            values.append(("train_steps", str(len(case.losses))))
            values += [(f"loss_step_{step}", str(loss)) for step, loss in enumerate(case.losses, start=1)]
        for key, value in (*values, *case.extra):
            ElementTree.SubElement(properties, "property", name=key, value=value)
        if case.outcome == "failed":
            failed = True
            ElementTree.SubElement(element, "failure", message="gradients differ").text = "Traceback"
        elif case.outcome == "skipped":
            ElementTree.SubElement(element, "skipped", type="pytest.skip", message="needs 8 GPUs")
    ElementTree.ElementTree(document).write(folder / "junit.xml", encoding="utf-8", xml_declaration=True)
    (folder / "env.json").write_text(json.dumps({
        "schema": 1, "cell": {"id": cell_id, "gpu": "h200", "gpus": 8, "matrix": "nightly"},
        "status": "failed" if failed else "passed", "error": None, "exit_code": 1 if failed else 0}))
    return folder


CREEP_CELL = "h200-8gpu-torch2.11.0-tf5.9.0"
CREEP_TEST = "tests/gpu/test_ep.py::test_ep_gradients[gpt_oss-grouped_mm-2-bfloat16]"
SPIKE_TEST = "tests/gpu/test_ep.py::test_ep_gradients[mixtral-eager-2-float32]"


def generated_night(night: int, nights: int, *, cells: int = 2, cases: int = 10, seed: int = 0,
                    creep_from: int | None = None) -> dict[str, list[Case]]:
    """Night `night` of `nights`: every test's time and memory jitter a few percent around its own level; the
    creep test's memory grows 30% from night `creep_from` on (None: never); the spike test's time triples on the
    last night only."""
    rng = random.Random(seed * 1_000_003 + night)
    cell_ids = [CREEP_CELL, *(f"h200-8gpu-torch2.11.0-tf5.{minor}.0" for minor in range(10, 9 + cells))][:cells]
    out: dict[str, list[Case]] = {}
    for cell_index, cell_id in enumerate(cell_ids):
        listed = []
        for index in range(cases):
            test_id = f"tests/gpu/test_ep.py::test_ep_gradients[family{index}-eager-2-float32]"
            if cell_index == 0 and index == 0:
                test_id = CREEP_TEST
            elif cell_index == 0 and index == 1:
                test_id = SPIKE_TEST
            level = 500.0 + 50.0 * index
            memory = level * rng.uniform(0.98, 1.02)
            time_s = (3.0 + index % 7) * rng.uniform(0.9, 1.1)
            if test_id == CREEP_TEST and creep_from is not None and night >= creep_from:
                memory *= 1.3
            if test_id == SPIKE_TEST and night == nights - 1:
                time_s *= 3
            listed.append(Case(test_id=test_id, time_s=round(time_s, 3),
                               peaks_mib=(round(memory, 1), round(memory * 0.99, 1)),
                               error=round(rng.uniform(1e-6, 5e-6), 9), bound=1e-4,
                               losses=(2.5, 2.1, 1.9) if index % 5 == 0 else ()))
        out[cell_id] = listed
    return out


def stored(db: Path, night: str) -> dict:
    """What the history kept of each test of `night` (harness.history.rows.NightTest), by (cell, test)."""
    from harness.history import open_history
    from harness.history.query import stored_night

    connection = open_history(db, create=False)
    try:
        return {(cell.cell, test.test): test for cell in stored_night(connection, night) for test in cell.tests}
    finally:
        connection.close()


def write_night(root: Path, cells: dict[str, list[Case]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for cell_id, cases in cells.items():
        write_cell(root, cell_id, cases)
    return root
