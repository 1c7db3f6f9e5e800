"""A bisect's probe answered from a table of verdicts, for the bisect tests (test_bisect.py) and the nightly's
triage steps (test_nightly_triage.py)."""

from __future__ import annotations

from harness.bisect.search import Probe, Verdict

RELEASES = ["5.19.0", "5.20.0", "5.20.1", "5.20.2", "5.21.0", "5.21.1", "5.22.0", "5.22.1", "5.22.2", "5.23.0"]
GRAD = "test_fsdp_ep_moe[2-float32]"
HALF = "expert gradients differ: max relative error 0.5 > bound 1e-05"


def table_probe(verdicts: dict[str, Verdict], calls: list[str] | None = None):
    """A probe answering from a table; a failing version names GRAD and its first line."""

    def probe(version: str) -> Probe:
        if calls is not None:
            calls.append(version)
        verdict = verdicts[version]
        failure = (GRAD, HALF) if verdict is Verdict.FAIL else None
        note = "all 6 selected tests skipped: needs transformers>=5.20.0" if verdict is Verdict.UNTESTABLE else None
        return Probe(
            versions={"transformers": version},
            label=f"transformers {version}",
            verdict=verdict,
            failure=failure,
            note=note,
            nothing_selected=verdict is Verdict.UNTESTABLE and version == "none",
        )

    return probe


def regression_from(first_bad: str, versions=RELEASES) -> dict[str, Verdict]:
    index = versions.index(first_bad)
    return {v: Verdict.PASS if i < index else Verdict.FAIL for i, v in enumerate(versions)}
