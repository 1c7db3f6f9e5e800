"""The digest: the numbers a later run compares against, small enough to ride in a PR comment.

A digest is bounded whatever the results hold: ids are capped (with a hash, so they stay apart), and
`encode_digest` drops skipped ids, then failing ids, then cells, until it fits, so a comment always
carries one and the next run can always read it.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import ConfigError
from harness.results.model import CellResult, CellStatus, Counts, Outcome, ResultSet
from harness.results.reader import load_results
from harness.results.training import TrainingCurve
from harness.results.values import Number, capped, finite

DIGEST_TAG = "harness-digest v1"
CELL_ID_CHARS = 120  # cell ids are ~40 characters; anything longer is cut, keyed by its hash
TEST_ID_CHARS = 240
SHA_CHARS = 40
MATRIX_CHARS = 64
_COUNT_FIELDS = ("passed", "failed", "errored", "skipped", "xfailed", "flaky")
_DIGEST_PAYLOAD = re.compile(re.escape(DIGEST_TAG) + r"\s+([A-Za-z0-9+/=]+)")
_MAX_DECODED_BYTES = 16 * 1024 * 1024  # a digest that inflates beyond this is not one we wrote


@dataclass(frozen=True, slots=True, kw_only=True)
class CellDigest:
    status: CellStatus
    counts: Counts
    failing: frozenset[str] | None  # test ids (digest keys); None where a shortened digest dropped them
    skipped: frozenset[str] | None
    peak_used_mib: tuple[float | None, ...] = ()  # per GPU index
    # Each training case's curve (steps capped as results.training caps them), by test key: what
    # harness.results.training_trends compares night to night. A digest built from a results folder holds them (the
    # nightly's record of a night is its results artifact, kept as long as its artifacts are); a comment's payload
    # never carries them (None: not carried): float losses do not compress, and a comment's digest has 16,000
    # characters for the next push's deltas. Not part of a digest's equality, which is what a comment carries.
    training: Mapping[str, TrainingCurve] | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Digest:
    cells: Mapping[str, CellDigest]  # by cell_key(cell id)
    git_sha: str | None = None
    matrix: str | None = None
    complete: bool = True  # False: cells were dropped to fit; a cell missing from it says nothing


def cell_key(cell_id: str) -> str:
    """How a digest names a cell: the id, capped."""
    return capped(cell_id, CELL_ID_CHARS)


def test_key(test_id: str) -> str:
    """How a digest names a test: the id, capped."""
    return capped(test_id, TEST_ID_CHARS)


test_key.__test__ = False  # type: ignore[attr-defined]  # pytest: not a test (functions take any attribute)


def _text(value: str | None, limit: int) -> str | None:
    return None if value is None else value[:limit]


def _whole_mib(value: Number | None) -> float | None:
    value = finite(value)
    return None if value is None else float(round(value))


def cell_digest(cell: CellResult) -> CellDigest:
    return CellDigest(
        status=cell.status,
        counts=cell.counts,
        failing=frozenset(test_key(test.test_id) for test in cell.failing_tests),
        skipped=frozenset(test_key(test.test_id) for test in cell.tests if test.outcome is Outcome.SKIPPED),
        # Whole MiB: what the comment carries, so a folder and a comment give the same digest.
        peak_used_mib=tuple(_whole_mib(gpu.peak_used_mib) for gpu in cell.memory),
        training={test_key(test.test_id): test.training for test in cell.tests if test.training is not None},
    )


def digest(result_set: ResultSet, *, sha: str | None = None, matrix: str | None = None) -> Digest:
    cells = {cell_key(cell.id): cell_digest(cell) for cell in result_set.cells}
    return Digest(
        cells=cells,
        git_sha=_text(sha or result_set.git_sha, SHA_CHARS),
        matrix=_text(matrix or result_set.matrix, MATRIX_CHARS),
    )


def encode_digest(summary: Digest, max_chars: int) -> str:
    """base64 of zlib-compressed compact JSON; drops skipped ids, then failing ids, then cells, to fit."""
    for keep_skipped, keep_failing in ((True, True), (False, True), (False, False)):
        payload = _digest_payload(summary, keep_skipped=keep_skipped, keep_failing=keep_failing)
        if len(payload) <= max_chars:
            return payload
    cells = list(summary.cells.items())
    while cells:  # counts of the first cells only; the reader knows the rest is missing
        cells = cells[: len(cells) // 2]
        payload = _digest_payload(
            Digest(cells=dict(cells), git_sha=summary.git_sha, matrix=summary.matrix, complete=False),
            keep_skipped=False,
            keep_failing=False,
        )
        if len(payload) <= max_chars:
            return payload
    return payload


def _digest_payload(summary: Digest, *, keep_skipped: bool, keep_failing: bool) -> str:
    test_ids: dict[str, int] = {}

    def indices(ids: frozenset[str] | None, keep: bool) -> list[int] | None:
        if ids is None or not keep:
            return None
        return [test_ids.setdefault(test_id, len(test_ids)) for test_id in sorted(ids)]

    cells = []
    for cell_id, cell in summary.cells.items():
        counts = cell.counts
        cells.append(
            {
                "id": cell_id,
                "status": cell.status.value,
                "counts": [getattr(counts, name) for name in _COUNT_FIELDS],
                "failing": indices(cell.failing, keep_failing),
                "skipped": indices(cell.skipped, keep_skipped),
                "peak": [None if peak is None else round(peak) for peak in cell.peak_used_mib],
            }
        )
    document = {"v": 1, "sha": summary.git_sha, "matrix": summary.matrix, "tests": list(test_ids), "cells": cells}
    if not summary.complete:
        document["partial"] = True
    packed = zlib.compress(json.dumps(document, separators=(",", ":")).encode(), 9)
    return base64.b64encode(packed).decode("ascii")


def decode_digest(text: str) -> Digest:
    """The digest inside a previous comment's text; ValueError says why there is none."""
    # The last one: the comment ends with its digest, and a test's message quoted above it may hold a fake.
    found = next(reversed(list(_DIGEST_PAYLOAD.finditer(text))), None)
    if not found:
        raise ValueError(f"no '<!-- {DIGEST_TAG} ... -->' digest in it")
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(base64.b64decode(found.group(1), validate=True), _MAX_DECODED_BYTES)
        if inflater.unconsumed_tail:
            raise ValueError("it inflates beyond 16 MiB")
        document = json.loads(raw)
        tests = document["tests"]

        def ids(indices: list[int] | None) -> frozenset[str] | None:
            return None if indices is None else frozenset(str(tests[index]) for index in indices)

        cells = {
            str(cell["id"]): CellDigest(
                status=CellStatus(cell["status"]),
                counts=Counts(**dict(zip(_COUNT_FIELDS, map(int, cell["counts"]), strict=True))),
                failing=ids(cell["failing"]),
                skipped=ids(cell["skipped"]),
                peak_used_mib=tuple(None if peak is None else float(peak) for peak in cell["peak"]),
            )
            for cell in document["cells"]
        }
    except (binascii.Error, zlib.error, KeyError, IndexError, TypeError, ValueError, OverflowError) as error:
        raise ValueError(f"the digest is unreadable ({type(error).__name__}: {str(error)[:200]})") from None
    return Digest(
        cells=cells,
        git_sha=_text(_str_or_none(document.get("sha")), SHA_CHARS),
        matrix=_text(_str_or_none(document.get("matrix")), MATRIX_CHARS),
        complete=not document.get("partial"),
    )


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def load_baseline(path: str | Path) -> Digest:
    """A baseline is a results folder, or a file holding a previous comment's text with its digest.
    Raises ConfigError for a path that is not there; `BaselineUnreadable` (a ValueError) for a file
    that holds no readable digest, which callers report as a warning: a broken old comment must
    never stop the new one from being written."""
    path = Path(path)
    if path.is_dir():
        return digest(load_results([path]))
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        raise ConfigError(f"baseline {path}: {error.strerror or error}") from None
    try:
        return decode_digest(text)
    except ValueError as error:
        raise BaselineUnreadable(f"baseline {path}: {error}; pass a results folder or a previous comment") from None


class BaselineUnreadable(ValueError):
    """A baseline file without a readable digest."""
