"""A night's results folders, as `harness run` leaves them, for the triage tests (test_triage.py,
test_nightly_triage.py): a cell's env.json and its junit.xml cases as pytest writes them."""

from __future__ import annotations

import json
from pathlib import Path
from xml.sax.saxutils import quoteattr


def junit_case(name: str, outcome: str, message: str = "", attempts: int = 1,
               properties: dict[str, str] | None = None) -> str:
    """xunit1 as pytest writes it, with the case's properties (record_property); pytest-rerunfailures leaves one
    empty testcase per earlier attempt."""
    head = (
        f'<testcase classname="tests.gpu.test_fsdp2" name="{name}" file="tests/gpu/test_fsdp2.py" line="39" time="1.0"'
    )
    recorded = "".join(f"<property name={quoteattr(key)} value={quoteattr(value)}/>"
                       for key, value in (properties or {}).items())
    body = (f"<properties>{recorded}</properties>" if recorded else "") + {
        "passed": "",
        "failed": f"<failure message={quoteattr(message)}>E   {message}</failure>",
        "skipped": f'<skipped type="pytest.skip" message={quoteattr(message)}>{message}</skipped>',
    }[outcome]
    return f"{head} />" * (attempts - 1) + (f"{head}>{body}</testcase>" if body else f"{head} />")


def write_cell(
    root: Path,
    torch: str,
    transformers: str,
    cases: list[str],
    *,
    gpu: str = "h200",
    gpus: int = 2,
    status: str = "failed",
    error: str | None = None,
    error_kind: str | None = None,
) -> Path:
    unit = "rank" if gpu == "cpu" else "gpu"
    cell_id = f"{gpu}-{gpus}{unit}-torch{torch}-tf{transformers}"
    folder = root / cell_id
    folder.mkdir(parents=True)
    (folder / "env.json").write_text(
        json.dumps(
            {
                "schema": 1,
                "status": status,
                "error": error,
                "error_kind": error_kind,
                "exit_code": 1 if status == "failed" else None,
                "cell": {
                    "id": cell_id,
                    "gpu": gpu,
                    "gpus": gpus,
                    "torch": torch,
                    "transformers": transformers,
                    "matrix": "nightly",
                },
                "versions": {"torch": torch, "transformers": transformers},
            }
        )
    )
    if cases:
        (folder / "junit.xml").write_text(
            '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">'
            + "".join(cases)
            + "</testsuite></testsuites>"
        )
    (folder / "memory.json").write_text(json.dumps({"gpus": [], "note": "test"}))
    return folder


GRAD = "expert gradients differ: max relative error 0.5 > bound 1e-05"
