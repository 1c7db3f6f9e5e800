"""env.json and memory.json into the model: the cell's recorded fields, its rerun command, its GPUs' memory."""

from __future__ import annotations

import datetime
import re
import shlex
from collections.abc import Mapping
from typing import Any, TypeVar

from harness.contract import EMBEDDED_MATRIX, ENV_JSON, MEMORY_JSON
from harness.results.files import ID_CHARS
from harness.results.model import CellInfo, GpuMemory, Problem
from harness.results.values import Number, capped, clean_text, number, utc_moment

MAX_GPUS = 64  # per cell; a runner has at most 8, MIG slices included a few dozen

# The run's pytest arguments go into a command shown in a shell block: a few plain, short strings.
PYTEST_ARGS_MAX = 32
PYTEST_ARGS_CHARS = 400  # all of them together
# What each part of that command may be: letters, digits and a few marks no shell treats specially, shell-quoted
# as well. A cell id as Cell.id builds it (runner name, shape, PEP 440 versions); `--matrix` as a name or a path of
# plain names (none starting with a dot: no `..`); a pytest argument (a -k or -m expression, a test id, an option).
CELL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")
CELL_ID_WORDS = "a cell id of at most 200 letters, digits and . _ + -"
MATRIX_REFERENCE = re.compile(r"(?=.{1,300}\Z)/?[A-Za-z0-9_][A-Za-z0-9._-]*(?:/[A-Za-z0-9_][A-Za-z0-9._-]*)*")
MATRIX_WORDS = "a matrix name or path of at most 300 letters, digits and . _ - / (no part starting with a dot)"
PYTEST_WORD = re.compile(r"[A-Za-z0-9_.:/=,+()\[\] -]+")
PYTEST_WORD_WORDS = "letters, digits, spaces and . _ : / = , + ( ) [ ] -"


def cell_info(cell: Mapping[str, object], folder_name: str, problems: list[Problem]) -> CellInfo:
    """The cell's fields as `harness run` recorded them in env.json (`Cell.to_json()`); the id is never parsed
    for them. A folder without that record shows its folder's name as the id and nothing else."""
    fields = Fields("env.json: cell", cell, problems)
    return CellInfo(
        id=capped(fields.text("id") or clean_text(folder_name, ID_CHARS), ID_CHARS),
        gpu=fields.text("gpu"),
        gpus=fields.integer("gpus"),
        hosts=fields.integer("hosts"),
        torch=fields.text("torch"),
        transformers=fields.text("transformers"),
        matrix=fields.text("matrix"),
    )


def reproduce(recorded_matrix: str | None, info: CellInfo, problems: list[Problem]) -> str:
    """`harness run [--matrix M] --cell ID`, the line a report hands a maintainer to paste: rebuilt from typed
    fields, each matching a strict pattern and shell-quoted, never a command line read from the folder (the pull
    request's code writes it; an older folder's `reproduce` string is ignored). `recorded_matrix`: env.json's
    `matrix_reference`, else (an older folder) the cell's matrix name. "" where the cell's id is not one harness
    builds: nothing to paste, and a Problem says why."""
    cell_id = _plain(info.id, CELL_ID, "cell id", CELL_ID_WORDS, problems)
    if cell_id is None:
        return ""
    matrix = _plain(recorded_matrix, MATRIX_REFERENCE, "key 'matrix_reference'", MATRIX_WORDS, problems)
    matrix = matrix or _plain(info.matrix, MATRIX_REFERENCE, "cell: key 'matrix'", MATRIX_WORDS, problems)
    option = f" --matrix {shlex.quote(matrix)}" if matrix and matrix != EMBEDDED_MATRIX else ""
    return f"harness run{option} --cell {shlex.quote(cell_id)}"


def _plain(value: str | None, pattern: re.Pattern[str], what: str, expected: str,
           problems: list[Problem]) -> str | None:
    """`value` where the whole of it matches `pattern`; else None, and (where there was one) a Problem."""
    if value is None or pattern.fullmatch(value):
        return value
    problems.append(Problem(ENV_JSON, f"{what} {_short_repr(value)} is left out of the reproduce command: "
                                      f"expected {expected}"))
    return None


def read_memory(document: Mapping[str, object], problems: list[Problem]) -> tuple[tuple[GpuMemory, ...], str | None]:
    if not document:
        return (), "memory.json missing or unreadable"
    fields = Fields(MEMORY_JSON, document, problems)
    if fields.boolean("available") is False:
        return (), fields.text("reason") or "memory.json says not available"
    gpus = []
    entries = fields.items("gpus")
    if len(entries) > MAX_GPUS:
        problems.append(Problem(MEMORY_JSON, f"lists {len(entries)} GPUs; the first {MAX_GPUS} are read"))
    for position, entry in enumerate(entries[:MAX_GPUS]):
        gpu = Fields(f"memory.json: gpus[{position}]", entry, problems)
        index = gpu.integer("index")
        gpus.append(
            GpuMemory(
                index=index if index is not None and 0 <= index < 1024 else position,
                name=gpu.text("name"),
                uuid=gpu.text("uuid"),
                total_mib=gpu.number("total_mib"),
                used_before_mib=gpu.number("used_before_mib"),
                peak_used_mib=gpu.number("peak_used_mib"),
            )
        )
    return tuple(sorted(gpus, key=lambda gpu: gpu.index)), None if gpus else "memory.json lists no GPUs"

_Value = TypeVar("_Value")  # what Fields._get accepts


class Fields:
    """Typed reads from one JSON object; a value of the wrong type is a Problem and reads as None."""

    def __init__(self, source: str, document: object, problems: list[Problem]):
        self.source = source
        self.document: Mapping[Any, object] = document if isinstance(document, Mapping) else {}
        self.problems = problems
        if not isinstance(document, Mapping):
            self._wrong("", document, "an object")

    def _wrong(self, key: str, value: object, expected: str) -> None:
        where = f"key {key!r:.80}" if key else "value"
        self.problems.append(Problem(self.source, f"{where} is {_short_repr(value)}, expected {expected}"))

    def _get(self, key: str, types: tuple[type[_Value], ...], expected: str) -> _Value | None:
        value = self.document.get(key)
        if value is None:
            return None
        # bool is an int in Python, never a count or a duration here.
        if isinstance(value, types) and not (isinstance(value, bool) and bool not in types):
            return value
        self._wrong(key, value, expected)
        return None

    def text(self, key: str) -> str | None:
        return clean_text(self._get(key, (str,), "a string"))

    def integer(self, key: str) -> int | None:
        value = self._get(key, (int,), "an integer")
        if value is not None and abs(value) > 2**63:
            self._wrong(key, value, "an integer of at most 64 bits")
            return None
        return value

    def number(self, key: str) -> Number | None:
        return number(self._get(key, (int, float), "a number"))

    def moment(self, key: str) -> datetime.datetime | None:
        """An ISO 8601 time with its offset, in UTC (values.utc_moment); anything else is a Problem and reads as
        None."""
        value = self._get(key, (str,), "a string")
        moment = utc_moment(value)
        if value is not None and moment is None:
            self._wrong(key, value, "an ISO 8601 time with its UTC offset")
        return moment

    def boolean(self, key: str) -> bool | None:
        return self._get(key, (bool,), "true or false")

    def mapping(self, key: str) -> Mapping[str, object]:
        return self._get(key, (dict,), "an object") or {}

    def items(self, key: str) -> list[object]:
        return self._get(key, (list,), "a list") or []

    def choice(self, key: str, allowed: tuple[str, ...]) -> str | None:
        value = self.text(key)
        if value is not None and value not in allowed:
            self._wrong(key, value, " or ".join(allowed))
            return None
        return value

    def command_words(self, key: str, max_words: int, max_chars: int) -> tuple[str, ...] | None:
        """A list of words for a command shown in a shell block: each all PYTEST_WORD's characters (no quote, no
        `;`, `|`, `$`, `#`, backtick...), at most `max_words` of `max_chars` in all. None where absent, or (a
        Problem) where it is anything else."""
        words = self._get(key, (list,), "a list")
        if words is None:
            return None
        if (
            len(words) <= max_words
            and all(isinstance(word, str) and PYTEST_WORD.fullmatch(word) for word in words)
            and sum(len(word) for word in words) <= max_chars
        ):
            return tuple(words)
        self._wrong(key, words, f"at most {max_words} words of {PYTEST_WORD_WORDS}, {max_chars} characters in all")
        return None

    def string_map(self, key: str) -> dict[str, str | None]:
        entries = self.mapping(key)
        inner = Fields(f"{self.source}: {key}", entries, self.problems)
        return {clean_text(str(name), 100): inner.text(name) for name in list(entries)[:50]}


def _short_repr(value: object) -> str:
    if isinstance(value, (dict, list)):
        return f"a {type(value).__name__} of {len(value)}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**20:
        return "a very large integer"
    return f"{value!r:.80}"
