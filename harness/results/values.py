"""Recorded values made safe to show and compute with: numbers (a `Labelled` one where unusable), counts, texts."""

from __future__ import annotations

import datetime
import hashlib
import math
from dataclasses import dataclass
from typing import overload

# Magnitudes outside this range are shown, never computed with: a log scale, round() or a sum of them
# overflows or underflows (5e-324 on a log axis, 1e308 summed).
SMALLEST = 1e-300
LARGEST = 1e300
# A world size or a host's rank count read from junit.xml: a whole number up to this (GB200 NVL72 racks hold
# 72 GPUs; a cell of many hosts a few thousand). Anything else reads as not recorded.
LARGEST_WORLD = 1_000_000
TEXT_CHARS = 2_000  # any text read from a file that has no limit of its own


@dataclass(frozen=True, slots=True)
class Labelled:
    """A recorded number the model cannot compute with (inf, nan, out of range): shown as its label."""

    label: str
    tiny: bool = False  # a magnitude below SMALLEST (not zero), as opposed to inf, nan or a huge one

    def __str__(self) -> str:
        return self.label


Number = float | Labelled


def number(raw: object) -> Number | None:
    """A float within the model's range, a `Labelled` value for what was recorded but is unusable, or
    None where nothing (or no number) was recorded."""
    if raw is None or isinstance(raw, bool):
        return None
    if type(raw) is str:  # the common case, a property's text: a finite number in range needs no more checks
        try:
            value = float(raw)
        except ValueError:
            return None
        if value == 0.0 or SMALLEST <= abs(value) <= LARGEST:  # false for nan and inf
            return value
    if isinstance(raw, (int, float)):
        text = None
    else:
        text = str(raw).strip()
        try:
            raw = float(text)
        except ValueError:
            return None
    try:
        value = float(raw)
    except OverflowError:  # an int beyond float
        return Labelled("inf" if raw > 0 else "-inf")
    if math.isnan(value):
        return Labelled("nan")
    if math.isinf(value):
        return Labelled("inf" if value > 0 else "-inf")
    if value != 0.0 and not SMALLEST <= abs(value) <= LARGEST:
        return Labelled(text or repr(value), tiny=abs(value) < SMALLEST)
    return value


def finite(value: Number | None) -> float | None:
    """The value where it can be computed with, else None."""
    return value if isinstance(value, float) else None


def whole_number(raw: str | None, smallest: int) -> int | None:
    """A recorded count (a world size, a host's GPUs or ranks): decimal digits from `smallest` to LARGEST_WORLD,
    else None. The text is untrusted: "2.0", "-1", "1e9" and a thousand digits all read as not recorded."""
    if raw is None:
        return None
    text = raw.strip()
    if not text or len(text) > len(str(LARGEST_WORLD)) or not (text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if smallest <= value <= LARGEST_WORLD else None


def capped(text: str, limit: int) -> str:
    """`text` cut to `limit` characters; a cut one ends in a hash of the whole, so two long ids that share
    their start stay apart (the digest and the comparison key cells and tests by these)."""
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{text[: limit - 14]}…~{digest}"


@overload
def clean_text(value: str, limit: int = ...) -> str: ...
@overload
def clean_text(value: str | None, limit: int = ...) -> str | None: ...
def clean_text(value: str | None, limit: int = TEXT_CHARS) -> str | None:
    """Capped, and valid UTF-8: a lone surrogate (from a JSON escape, or a name that is not UTF-8) becomes
    "?", as it would stop any rendering from being written."""
    if value is None:
        return None
    value = value if len(value) <= limit else value[: limit - 1] + "…"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "replace").decode("utf-8")
    return value


# The longest ISO 8601 time worth parsing ("2026-01-14T02:00:00.123456+00:00" is 32): anything longer is not one.
MOMENT_CHARS = 40


def utc_moment(raw: object) -> datetime.datetime | None:
    """An ISO 8601 time that names its offset ("Z" or "+00:00"), in UTC; None for anything else (not a string, too
    long, no offset, not a time): a time without an offset could be any zone, so it is not trusted."""
    if not isinstance(raw, str) or len(raw) > MOMENT_CHARS:
        return None
    try:
        moment = datetime.datetime.fromisoformat(raw.strip())
    except ValueError:
        return None
    if moment.tzinfo is None or moment.utcoffset() is None:
        return None
    try:
        return moment.astimezone(datetime.timezone.utc)
    except OverflowError:  # year 1 or 9999 shifted past the calendar's end
        return None


def seconds_between(start: datetime.datetime | None, end: datetime.datetime | None) -> float | None:
    """end - start in seconds (negative where end came first); None where either is unknown."""
    return None if start is None or end is None else (end - start).total_seconds()
