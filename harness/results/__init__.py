"""Results: cell folders -> one frozen model, never raising on what a folder holds.

By stage: `model` (the frozen values, and `case_class`, each case's class in the release view; `values` makes
recorded numbers and texts safe), `reader` (folders -> model, through `files` for bounded reads, `junit` for junit.xml
and `records` for env.json and memory.json), `digest` (the bounded numbers a PR comment carries), `compare` (a result
set against a baseline, and the one rule for what is new since the night before: reds and releases), `training` (a
training case's per-step curve), `training_trends` (those curves against the baseline's), `triage` (the nightly's
class of each new red, by structure), `labels` (what a failure's words look like, shown beside the class) and
`nightly_records` (bisect.json and triage.json, typed). The names below are what callers import; the file names,
env.json record and metric names live in `harness.contract`.
"""

from harness.contract import CONTRACT_FILES, SCHEMA
from harness.results.compare import (
    MEMORY_CHANGE_FRACTION,
    MEMORY_CHANGE_MIB,
    CellChange,
    Comparison,
    MemoryChange,
    Regression,
    ReleaseChange,
    compare,
    new_releases,
    nightly_regressions,
)
from harness.results.digest import (
    DIGEST_TAG,
    BaselineUnreadable,
    CellDigest,
    Digest,
    cell_key,
    decode_digest,
    digest,
    encode_digest,
    load_baseline,
    test_key,
)
from harness.results.junit import parse_xml, read_junit_tests
from harness.results.model import (
    CaseCounts,
    CellInfo,
    CellResult,
    CellStatus,
    Counts,
    GpuMemory,
    NotRun,
    Outcome,
    Problem,
    ResultSet,
    SuiteInfo,
    TestResult,
    case_class,
    natural_key,
    nothing_distributed_ran,
)
from harness.results.reader import find_cell_folders, load_results, paused_gc, read_cell
from harness.results.training import TrainingCurve
from harness.results.values import Labelled, Number, finite, number, seconds_between, utc_moment

__all__ = [
    "CONTRACT_FILES",
    "DIGEST_TAG",
    "MEMORY_CHANGE_FRACTION",
    "MEMORY_CHANGE_MIB",
    "SCHEMA",
    "BaselineUnreadable",
    "CaseCounts",
    "CellChange",
    "CellDigest",
    "CellInfo",
    "CellResult",
    "CellStatus",
    "Comparison",
    "Counts",
    "Digest",
    "GpuMemory",
    "Labelled",
    "MemoryChange",
    "NotRun",
    "Number",
    "Outcome",
    "Problem",
    "Regression",
    "ReleaseChange",
    "ResultSet",
    "SuiteInfo",
    "TestResult",
    "TrainingCurve",
    "case_class",
    "cell_key",
    "compare",
    "decode_digest",
    "digest",
    "encode_digest",
    "find_cell_folders",
    "finite",
    "load_baseline",
    "load_results",
    "natural_key",
    "new_releases",
    "nightly_regressions",
    "nothing_distributed_ran",
    "number",
    "parse_xml",
    "paused_gc",
    "read_cell",
    "read_junit_tests",
    "seconds_between",
    "test_key",
    "utc_moment",
]
