"""env.json and memory.json into the model: the cell's recorded fields, its rerun command, its GPUs' memory."""

from __future__ import annotations

import datetime
import shlex
from collections.abc import Mapping

from harness.contract import MEMORY_JSON
from harness.results.files import ID_CHARS
from harness.results.model import CellInfo, GpuMemory, Problem
from harness.results.values import Number, capped, clean_text, number, utc_moment

MAX_GPUS = 64  # per cell; a runner has at most 8, MIG slices included a few dozen

# The run's pytest arguments go into a command shown in a shell block: a few plain, short strings.
PYTEST_ARGS_MAX = 32
PYTEST_ARGS_CHARS = 400  # all of them together; `reproduce` bounds the recorded command likewise


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


def reproduce(recorded: str | None, info: CellInfo) -> str:
    # Shown in a shell block: trust env.json's command only when it is one plain, short line.
    if (
        recorded
        and recorded.startswith("harness run ")
        and recorded.isprintable()
        and "`" not in recorded
        and len(recorded) < 500
    ):
        return recorded
    matrix = f" --matrix {shlex.quote(info.matrix)}" if info.matrix else ""
    return f"harness run{matrix} --cell {shlex.quote(info.id)}"


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


class Fields:
    """Typed reads from one JSON object; a value of the wrong type is a Problem and reads as None."""

    def __init__(self, source: str, document: object, problems: list[Problem]):
        self.source = source
        self.document = document if isinstance(document, Mapping) else {}
        self.problems = problems
        if not isinstance(document, Mapping):
            self._wrong("", document, "an object")

    def _wrong(self, key: str, value: object, expected: str) -> None:
        where = f"key {key!r:.80}" if key else "value"
        self.problems.append(Problem(self.source, f"{where} is {_short_repr(value)}, expected {expected}"))

    def _get(self, key: str, types: tuple[type, ...], expected: str) -> object:
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
        """A list of words for a command shown in a shell block: printable strings without a backtick, at most
        `max_words` of `max_chars` in all. None where absent, or (a Problem) where it is anything else."""
        words = self._get(key, (list,), "a list")
        if words is None:
            return None
        if (
            len(words) <= max_words
            and all(isinstance(word, str) and word.isprintable() and "`" not in word for word in words)
            and sum(len(word) for word in words) <= max_chars
        ):
            return tuple(words)
        self._wrong(key, words, f"at most {max_words} printable strings without a backtick, {max_chars} characters")
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
