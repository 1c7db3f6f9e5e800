"""The execute stage of `harness run`: the cell's engine runs its pytest, and this machine's GPUs are sampled.

Takes `Prepared` (from prepare). Where the cell can run, looks its engine up by runners.yaml's `engine:`
(harness.engines.REGISTRY) and hands it the `Launch`; while an engine that runs here runs, the memory
monitor samples the cell's GPUs. Hands on `Executed`: the record with pytest's exit code and the engine's
job (its id, its hosts, how it ended the cell's processes), how pytest ended (`Ran`), the cell's GPU memory,
and what was raised, if anything (harness interrupted, or a failure of harness itself), for the record stage
to record and raise again.
A cell that prepare stopped passes through with nothing run.
"""

from __future__ import annotations

import dataclasses

from harness.cell.memory import MemoryMonitor, MemoryReport
from harness.contract import EnvRecord
from harness.engines import JobFields, Ran, engine
from harness.run.prepare import Prepared


@dataclasses.dataclass(frozen=True, kw_only=True)
class Executed:
    """One cell after its engine: everything the record stage writes."""

    prepared: Prepared
    record: EnvRecord  # prepared's, with pytest's exit code and the engine's job_id and hosts
    ran: Ran | None  # None: nothing ran (prepare stopped the cell), or the engine raised
    memory: MemoryReport  # what memory.json says
    raised: BaseException | None = None  # from prepare or the engine: recorded, then raised again


def execute(prepared: Prepared) -> Executed:
    cell, launch = prepared.cell, prepared.launch
    report = MemoryReport.unavailable("cpu cell: no GPU" if cell.is_cpu else "no GPU was monitored")
    if launch is None or prepared.raised is not None:
        return Executed(prepared=prepared, record=prepared.record, ran=None, memory=report, raised=prepared.raised)
    job = JobFields(job_id=prepared.record.job_id, hosts=list(prepared.record.hosts), cleanup=None)
    ran: Ran | None = None
    raised: BaseException | None = None
    monitor = None
    try:
        # Only an engine that runs here has GPUs in its launch: an engine's hosts sample their own.
        monitor = MemoryMonitor(list(launch.gpus)) if launch.gpus else None
        if monitor:
            monitor.start()
        try:
            ran = engine(cell.engine).run(launch, job)
        finally:
            if monitor:
                report = monitor.stop()
    except BaseException as error:  # an interruption, a harness failure: recorded by the record stage, then raised
        raised = error
    finally:
        if prepared.gpu_locks is not None:  # the GPUs are free for another harness run on this host
            prepared.gpu_locks.release()
    if ran is not None and ran.memory is not None:
        report = ran.memory
    record = dataclasses.replace(prepared.record, job_id=job["job_id"], hosts=list(job["hosts"]),
                                 cleanup=job["cleanup"],
                                 exit_code=ran.exit_code if ran is not None else prepared.record.exit_code)
    return Executed(prepared=prepared, record=record, ran=ran, memory=report, raised=raised)
