"""A column of a night's cell as one compressed blob: a row per test and night made the history 578 MiB for 30
nights of 200,000 tests (SQLite spends some 40 bytes on a row); packed per cell and night it is a fraction.

Numbers are float32 (7 significant digits: memory to 0.1 MiB up to 1 TiB, time to a millisecond up to hours), little
endian whatever the machine, their bytes grouped by significance before zlib (the exponents of one column
differ little, so they compress). Not recorded is +inf: no finite value packs to it, and a value beyond float32's
range reads back as not recorded, as one out of the results model's range does. Reading is bounded: a blob says
how many values it holds and must inflate to exactly that many bytes, or it is refused (a tampered artifact).
"""

from __future__ import annotations

import math
import sys
import zlib
from array import array
from collections.abc import Iterable, Sequence

NOT_RECORDED = math.inf
_FLOAT = "f"  # float32
_COUNT = "I"  # uint32: test name ids, and the lengths of ragged lists
_LEVEL = 6


class Unpackable(ValueError):
    """A blob that is not one this module wrote."""


def pack_floats(values: Iterable[float | None]) -> bytes:
    packed = array(_FLOAT, (NOT_RECORDED if value is None else value for value in values))
    return _compress(_grouped(_little_endian(packed).tobytes(), packed.itemsize))


def float_array(blob: bytes, count: int) -> array:
    """The raw column, not recorded as +inf (what the ranking computes on)."""
    width = array(_FLOAT).itemsize
    packed = array(_FLOAT)
    packed.frombytes(_ungrouped(_inflate(blob, count * width), width))
    return _little_endian(packed)


def unpack_floats(blob: bytes, count: int) -> list[float | None]:
    return [None if not math.isfinite(value) else value for value in float_array(blob, count)]


def pack_counts(values: Iterable[int]) -> bytes:
    return _compress(_little_endian(array(_COUNT, values)).tobytes())


def unpack_counts(blob: bytes, count: int) -> list[int]:
    packed = array(_COUNT)
    packed.frombytes(_inflate(blob, count * packed.itemsize))
    return _little_endian(packed).tolist()


def pack_lists(lists: Sequence[Sequence[float | None]]) -> bytes:
    """Lists of floats of any length (a test's per-rank peaks, a training case's losses): lengths, then values."""
    lengths = pack_counts(len(values) for values in lists)
    flat = pack_floats(value for values in lists for value in values)
    return len(lengths).to_bytes(4, "little") + lengths + flat


def unpack_lists(blob: bytes, count: int, largest_total: int) -> list[tuple[float | None, ...]]:
    """Unpack `count` lists holding at most `largest_total` values together."""
    split = int.from_bytes(blob[:4], "little")
    if len(blob) < 4 or split > len(blob) - 4:
        raise Unpackable("a list blob's length prefix points past its end")
    lengths = unpack_counts(blob[4:4 + split], count)
    total = sum(lengths)
    if total > largest_total:
        raise Unpackable(f"a list blob holds {total} values, more than {largest_total}")
    flat = unpack_floats(blob[4 + split:], total)
    lists, start = [], 0
    for length in lengths:
        lists.append(tuple(flat[start:start + length]))
        start += length
    return lists


def _compress(data: bytes) -> bytes:
    return zlib.compress(data, _LEVEL)


def _inflate(blob: bytes, size: int) -> bytes:
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(blob, size)
    except (zlib.error, TypeError) as error:
        raise Unpackable(f"not a packed column: {error}") from None
    if len(data) != size or inflater.unconsumed_tail or not inflater.eof:
        raise Unpackable(f"a packed column inflates to other than the {size} bytes its row says")
    return data


def _grouped(data: bytes, width: int) -> bytes:
    # Byte k of every value together: the high bytes (sign, exponent) repeat and compress.
    return b"".join(data[offset::width] for offset in range(width))


def _ungrouped(data: bytes, width: int) -> bytes:
    values = len(data) // width
    out = bytearray(len(data))
    for offset in range(width):
        out[offset::width] = data[offset * values:(offset + 1) * values]
    return bytes(out)


def _little_endian(packed: array) -> array:
    if sys.byteorder == "big":
        packed.byteswap()
    return packed
