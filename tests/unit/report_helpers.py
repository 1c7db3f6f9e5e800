"""Result values for the report's tests: a test with properties, a cell holding tests (shared by test_report.py
and test_report_training.py), and junit.xml cases as pytest writes them, for folders written to disk."""

from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

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


def junit_xml(*cases: str) -> str:
    """A junit.xml (xunit1, as pytest writes it) holding `cases` (case_xml's)."""
    return ('<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">' + "".join(cases)
            + "</testsuite></testsuites>")


def case_xml(name: str, outcome: str, message: str = "", attempts: int = 1, **properties: str) -> str:
    """One test as pytest's junitxml writes it: passed, failed (a strict XPASS too), errored, skipped or xfailed,
    with its properties (record_property); pytest-rerunfailures leaves one empty testcase per earlier attempt."""
    head = f'<testcase classname="tests.gpu.test_ep" name={quoteattr(name)} file="tests/gpu/test_ep.py" time="1.0"'
    recorded = "".join(f"<property name={quoteattr(key)} value={quoteattr(value)}/>"
                       for key, value in properties.items())
    body = (f"<properties>{recorded}</properties>" if recorded else "") + {
        "passed": "",
        "failed": f"<failure message={quoteattr(message)}>E   {escape(message)}</failure>",
        "errored": f"<error message={quoteattr(message)}>E   {escape(message)}</error>",
        "skipped": f'<skipped type="pytest.skip" message={quoteattr(message)}>{escape(message)}</skipped>',
        "xfailed": f'<skipped type="pytest.xfail" message={quoteattr(message)} />',
    }[outcome]
    return f"{head} />" * (attempts - 1) + f"{head}>{body}</testcase>"
