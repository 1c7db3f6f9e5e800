"""The record stage of `harness run`: how the cell ended, written to its folder (env.json, memory.json).

Takes `Executed` (from execute). Decides the cell's status: from the engine's cause where it named one, else
from how pytest ended (`classify`: passed, failed, not_run, or errored with the kind of error); where harness
was interrupted or failed, says that instead, and where the cell's own processes signalled harness, says that
above all (harness.engines.interruption). Writes memory.json and env.json on every way out, then raises
again what an earlier stage caught, or hands on `CellOutcome` for the render stage.
"""

from __future__ import annotations

import dataclasses
import signal
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

from harness import contract
from harness.cell import memory
from harness.contract import (
    ENV_JSON,
    JUNIT_XML,
    MEMORY_JSON,
    STATUS_ERRORED,
    STATUS_FAILED,
    STATUS_NOT_RUN,
    STATUS_PASSED,
    EnvRecord,
)
from harness.engines import Interrupted
from harness.engines.interruption import CellSignal, signals_from_the_cell
from harness.plan.cells import Cell
from harness.results import nothing_distributed_ran, read_junit_tests
from harness.results.files import write_json_whole
from harness.run.execute import Executed
from harness.run.prepare import iso

JUNIT_SCAN_BYTES = 64 * 1024 * 1024
# pytest's exit codes past 1: its words, and the kind of error (2 is also a collection error: see classify). pytest's
# own "interrupted" is not an interruption harness saw (a SIGINT or SIGTERM to harness from outside the cell is, and
# is recorded as ERROR_INTERRUPTED by `record`): the tested code can raise KeyboardInterrupt or call pytest.exit itself.
PYTEST_EXITS = {2: ("interrupted", contract.ERROR_PYTEST), 3: ("internal error", contract.ERROR_PYTEST),
                4: ("usage error", contract.ERROR_PYTEST), 5: ("no tests collected", contract.ERROR_NO_TESTS)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class CellOutcome:
    cell: Cell
    folder: Path
    status: str
    error: str | None
    duration_s: float


def record(executed: Executed, log: Callable[[str], None]) -> CellOutcome:
    prepared = executed.prepared
    cell, folder, env = prepared.cell, prepared.folder, executed.record
    raised = executed.raised
    from_the_cell: list[CellSignal] = []
    try:
        from_the_cell = signals_from_the_cell(since=prepared.started)
        if raised is None and executed.ran is not None:
            ran = executed.ran
            if ran.cause is not None:  # the engine knows why, typed (a host lost, scancel, NODE_FAIL, its timeout)
                env = dataclasses.replace(env, status=STATUS_ERRORED, error=ran.cause.words, error_kind=ran.cause.kind)
            else:
                status, error, kind = classify(cell, ran.exit_code, ran.timed_out, folder / JUNIT_XML)
                env = dataclasses.replace(env, status=status, error=error, error_kind=kind)
    except BaseException as failure:  # interrupted, or harness failed, while classifying: recorded, then raised
        raised = failure
    if isinstance(raised, Interrupted):
        error = raised.words() if raised.unattributed else str(raised)
        if env.job_id:  # an engine's job: harness cancelled it on the way out
            error = f"cancelled: harness {error}; {cell.engine} job {env.job_id} cancelled"
        kind = contract.ERROR_SIGNALLED_HARNESS if raised.unattributed else contract.ERROR_INTERRUPTED
        env = dataclasses.replace(env, status=STATUS_ERRORED, error=error, error_kind=kind)
    elif isinstance(raised, Exception):
        env = dataclasses.replace(env, error=f"harness: {type(raised).__name__}: {raised}",
                                  error_kind=contract.ERROR_HARNESS)
    env = _signalled_by_the_cell(env, from_the_cell)
    ended = time.time()
    duration_s = round(ended - prepared.started, 3)
    env = dataclasses.replace(env, end=iso(ended), duration_s=duration_s)
    memory.write_memory_json(folder / MEMORY_JSON, executed.memory)
    write_env_json(folder, env)
    if raised is not None:
        raise raised
    if env.error:
        log(f"   {cell.id}: {env.status}: {env.error}")
    return CellOutcome(cell=cell, folder=folder, status=env.status, error=env.error, duration_s=duration_s)


def _signalled_by_the_cell(env: EnvRecord, signals: list[CellSignal]) -> EnvRecord:
    """A cell whose own processes sent harness SIGTERM or SIGINT is a red of the code under test, whatever else
    happened (a later interruption included): the first such signal leads its words, how the cell ended follows."""
    if not signals:
        return env
    words = signals[0].words() + (" (the first of several)" if len(signals) > 1 else "")
    return dataclasses.replace(env, status=STATUS_ERRORED, error="; ".join(filter(None, [words, env.error])),
                               error_kind=contract.ERROR_SIGNALLED_HARNESS)


def write_env_json(folder: Path, record: EnvRecord) -> None:
    write_json_whole(folder / ENV_JSON, record.to_json())


def classify(cell: Cell, exit_code: int | None, timed_out: bool,
             junit: Path) -> tuple[str, str | None, str | None]:
    """(status, error, error_kind) from how pytest ended. Failed tests are 'failed'; anything else abnormal
    is 'errored'; a clean run where cases were skipped for too few GPUs or ranks and no distributed case ran is
    'not_run' (from the cases' typed properties in junit.xml, read as the reports read them)."""
    if timed_out:
        return STATUS_ERRORED, f"timed out after {cell.timeout_minutes} min; killed", contract.ERROR_TIMEOUT
    if exit_code is not None and exit_code < 0:
        signal_name = signal.Signals(-exit_code).name
        return STATUS_ERRORED, f"pytest crashed: killed by signal {signal_name}", contract.ERROR_SIGNAL
    if not junit.is_file() or junit.stat().st_size == 0:
        return STATUS_ERRORED, f"pytest exited {exit_code} and wrote no junit.xml", contract.ERROR_NO_JUNIT
    if exit_code == 0:
        return (STATUS_NOT_RUN if nothing_distributed_ran(read_junit_tests(junit)) else STATUS_PASSED), None, None
    if exit_code == 1:
        return STATUS_FAILED, None, None
    unexpected = ("unexpected exit", contract.ERROR_PYTEST)  # an exit code not known, or none at all
    words, kind = unexpected if exit_code is None else PYTEST_EXITS.get(exit_code, unexpected)
    if exit_code == 2 and _collection_failed(junit):
        words, kind = "errors during collection", contract.ERROR_COLLECTION
    return STATUS_ERRORED, f"pytest exited {exit_code} ({words}); see pytest.log", kind


def _collection_failed(junit: Path) -> bool:
    """pytest's junitxml marks a module that did not collect with message="collection failure"."""
    try:
        if junit.stat().st_size > JUNIT_SCAN_BYTES:  # written by the tested code's run: bounded
            return False
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError):
        return False
    return any(error.get("message") == "collection failure" for error in root.iter("error"))
