"""Test files renamed, so that the history follows them: a YAML mapping of old node-id prefix to new (e.g.
`tests/gpu/test_deliberate_bugs.py: tests/gpu/test_planted_bugs.py`), applied to the stored test names when a
night is appended. A stored name matches a prefix when it is the prefix or lies beneath it (`prefix::...`), so
`a.py` never takes `a.pyx`'s tests. A name whose new form is stored already (a night ran with the new name before
the rename was listed) is merged into it; one night that ran both cannot be merged, and is refused.

Applying is idempotent: once renamed, no stored name matches the old prefix, so the mapping can stay listed for
as long as the history might hold an older artifact. The file is untrusted input: bad content is one line, exit 2.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from harness.errors import ConfigError
from harness.history.packing import pack_counts, unpack_counts
from harness.plan.files import read_yaml

MAX_RENAMES = 1000
PREFIX_CHARS = 1000


@dataclass(frozen=True, slots=True)
class Rename:
    old: str
    new: str

    def matches(self, name: str) -> bool:
        return name == self.old or name.startswith(self.old + "::")

    def applied(self, name: str) -> str:
        return self.new + name[len(self.old):]


def read_renames(path: Path) -> tuple[Rename, ...]:
    document = read_yaml(path)
    if document is None:
        return ()
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: expected a mapping of old test-file path to new, got {type(document).__name__}")
    if len(document) > MAX_RENAMES:
        raise ConfigError(f"{path}: {len(document)} renames; at most {MAX_RENAMES}")
    renames = tuple(_rename(path, old, new) for old, new in document.items())
    olds = {rename.old for rename in renames}
    for rename in renames:
        if any(rename.new == old or rename.new.startswith(old + "::") for old in olds):
            raise ConfigError(f"{path}: {rename.old!r} is renamed to {rename.new!r}, which is itself renamed: "
                              "list the final name")
    return renames


def _rename(path: Path, old: object, new: object) -> Rename:
    for value in (old, new):
        if not isinstance(value, str) or not value or len(value) > PREFIX_CHARS or not value.isprintable() \
                or value != value.strip() or value.endswith("::"):
            raise ConfigError(f"{path}: {value!r} is not a test file or node id (1 to {PREFIX_CHARS} printable "
                              "characters, no surrounding spaces, not ending in '::')")
    assert isinstance(old, str) and isinstance(new, str)
    if old == new:
        raise ConfigError(f"{path}: {old!r} is renamed to itself")
    return Rename(old, new)


def apply_renames(connection: sqlite3.Connection, renames: tuple[Rename, ...]) -> int:
    """Rename the stored test names `renames` match, inside the caller's transaction; how many were renamed."""
    if not renames:
        return 0
    stored = {name: row for row, name in connection.execute("SELECT id, test FROM names")}
    merges: dict[int, int] = {}  # old name's id -> the id its new name has already
    renamed = 0
    for name, row in list(stored.items()):
        rename = next((rename for rename in renames if rename.matches(name)), None)
        if rename is None:
            continue
        target = rename.applied(name)
        renamed += 1
        if target in stored:
            merges[row] = stored[target]
        else:
            connection.execute("UPDATE names SET test = ? WHERE id = ?", (target, row))
            stored[target] = row
    if merges:
        _merge(connection, merges)
    return renamed


def _merge(connection: sqlite3.Connection, merges: dict[int, int]) -> None:
    """Point every name list at the surviving ids; a list that now equals another is folded into it."""
    lists = list(connection.execute(
        "SELECT name_lists.id, name_lists.names, min(packed.tests) FROM name_lists "
        "JOIN packed ON packed.name_list = name_lists.id GROUP BY name_lists.id"))
    for list_id, blob, count in lists:
        ids = unpack_counts(blob, count)
        if not any(row in merges for row in ids):
            continue
        mapped = [merges.get(row, row) for row in ids]
        if len(set(mapped)) != len(mapped):
            both = next(row for row in ids if row in merges and merges[row] in ids)
            old, new = (_name(connection, row) for row in (both, merges[both]))
            raise ConfigError(f"history: a night ran both {old!r} and {new!r}; a rename cannot merge them")
        packed = pack_counts(mapped)
        existing = connection.execute("SELECT id FROM name_lists WHERE names = ?", (packed,)).fetchone()
        if existing is None:
            connection.execute("UPDATE name_lists SET names = ? WHERE id = ?", (packed, list_id))
        else:
            connection.execute("UPDATE packed SET name_list = ? WHERE name_list = ?", (existing[0], list_id))
            connection.execute("DELETE FROM name_lists WHERE id = ?", (list_id,))
    connection.execute("DELETE FROM name_lists WHERE id NOT IN (SELECT name_list FROM packed)")
    connection.executemany("DELETE FROM names WHERE id = ?", [(row,) for row in merges])


def _name(connection: sqlite3.Connection, row: int) -> str:
    return connection.execute("SELECT test FROM names WHERE id = ?", (row,)).fetchone()[0]
