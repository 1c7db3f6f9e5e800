"""Result values for the report's tests: a test with properties, a cell holding tests (shared by test_report.py
and test_report_training.py)."""

from __future__ import annotations

from harness.results import (
    CellInfo,
    CellResult,
    CellStatus,
    Counts,
    GpuMemory,
    Outcome,
    SuiteInfo,
    TestResult,
    nothing_distributed_ran,
)


def make_test(index: int, outcome: Outcome = Outcome.PASSED, *, name: str | None = None,
                message: str | None = None, **properties: float) -> TestResult:
    name = name or f"test_case_{index}[2-bf16]"
    return TestResult(test_id=f"tests/gpu/test_ep.py::{name}", name=name, outcome=outcome, message=message,
                      excerpt="E   " + (message or "") if outcome is Outcome.FAILED else None,
                      properties=tuple((key, str(value)) for key, value in properties.items()))


def not_run_test(index: int, needs: int = 4, host: int = 1, unit: str = "GPUs") -> TestResult:
    """A case the ranks fixture skipped for too few GPUs or ranks, with the properties it records."""
    return make_test(index, Outcome.SKIPPED, message=f"needs {needs} {unit}", needs_world_size=needs,
                     host_ranks=host, host_rank_unit=unit)


def ran_test(index: int, family: str, outcome: Outcome = Outcome.PASSED, world_size: int = 2) -> TestResult:
    return make_test(index, outcome, world_size=world_size, family=family)


def cell(cell_id: str, *tests: TestResult, status: CellStatus | None = None, reason: str | None = None,
         peaks: tuple[float | None, ...] = (), gpu: str = "h200", torch: str = "2.11.0",
         suite: SuiteInfo | None = None) -> CellResult:
    counts = Counts.of(tests)
    if status is None:
        status = CellStatus.FAILED if counts.failed or counts.errored else CellStatus.PASSED
        status = CellStatus.NOT_RUN if status is CellStatus.PASSED and nothing_distributed_ran(tests) else status
    memory = tuple(GpuMemory(index=index, peak_used_mib=peak, total_mib=143771.0)
                   for index, peak in enumerate(peaks))
    info = CellInfo(id=cell_id, gpu=gpu, gpus=len(peaks) or 2, torch=torch, transformers="5.18.0")
    return CellResult(info=info, status=status, reason=reason, tests=tests, memory=memory, suite=suite or SuiteInfo(),
                      duration_s=61.0, reproduce=f"harness run --cell '{cell_id}'")
