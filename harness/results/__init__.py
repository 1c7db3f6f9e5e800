"""Results: cell folders -> one frozen model, never raising on what a folder holds.

By stage: `model` (the frozen values), `reader` (folders -> model), `digest` (the bounded numbers a PR
comment carries), `compare` (a result set against a baseline, nightly regressions). The names below
are what callers import; the file names, env.json record and metric names live in `harness.contract`.
"""

from harness.contract import CONTRACT_FILES, SCHEMA
from harness.results.compare import (
    MEMORY_CHANGE_FRACTION,
    MEMORY_CHANGE_MIB,
    CellChange,
    Comparison,
    MemoryChange,
    Regression,
    compare,
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
from harness.results.model import (
    CellInfo,
    CellResult,
    CellStatus,
    Counts,
    GpuMemory,
    Labelled,
    Number,
    Outcome,
    Problem,
    ResultSet,
    SuiteInfo,
    TestResult,
    finite,
    natural_key,
    number,
)
from harness.results.reader import find_cell_folders, load_results, parse_xml, paused_gc, read_cell

__all__ = [
    "CONTRACT_FILES",
    "DIGEST_TAG",
    "MEMORY_CHANGE_FRACTION",
    "MEMORY_CHANGE_MIB",
    "SCHEMA",
    "BaselineUnreadable",
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
    "Number",
    "Outcome",
    "Problem",
    "Regression",
    "ResultSet",
    "SuiteInfo",
    "TestResult",
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
    "nightly_regressions",
    "number",
    "parse_xml",
    "paused_gc",
    "read_cell",
    "test_key",
]
