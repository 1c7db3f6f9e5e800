"""What a history database may hold: exactly the tables and indexes harness's migrations create, nothing else.

The file is an artifact of an earlier run, read as if anyone had written it, and SQLite runs what its schema
says whenever a statement touches it: a view named `nights` is a query (a recursive one never ends), a trigger
writes on every insert (it could rewrite the nights being appended). So before any statement reads or writes a
row, every object in sqlite_master is compared with those the migrations create in an empty database at the same
version: its type, name, table and CREATE statement (comments and spacing aside). One that differs, or is
missing, is refused in one line naming the file and the object.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from harness.errors import ConfigError

_COMMENT = re.compile(r"--[^\n]*")  # the migrations' comments; a file made from them by hand keeps them
_KINDS = ("table", "index", "view", "trigger")


@dataclass(frozen=True, slots=True)
class SchemaObject:
    type: str  # table, index, view or trigger
    name: str
    table: str
    sql: str | None  # the CREATE statement, comments and spacing aside; None for SQLite's own indexes

    def __str__(self) -> str:
        kind = self.type if self.type in _KINDS else f"{self.type!r:.40}"
        return f"{kind} {self.name!r:.80}"


def objects(connection: sqlite3.Connection) -> frozenset[SchemaObject]:
    """Every object of the database's schema (sqlite_master: written by whoever wrote the file)."""
    return frozenset(
        SchemaObject(type=str(kind), name=str(name), table=str(table),
                     sql=" ".join(_COMMENT.sub("", sql).split()) if isinstance(sql, str) else None)
        for kind, name, table, sql in connection.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"))


def check_objects(connection: sqlite3.Connection, path: Path, expected: frozenset[SchemaObject]) -> None:
    """ConfigError naming the first object that is not one of `expected` (or is not as they make it), else the
    first of `expected` that is missing."""
    found = objects(connection)
    unexpected = sorted(found - expected, key=_order)
    if unexpected:
        named = {(each.type, each.name) for each in expected}
        how = "is not as harness's migrations create it" if (unexpected[0].type, unexpected[0].name) in named else \
            "is not one harness's migrations create"
        raise ConfigError(f"history database {path}: {unexpected[0]} {how}: refused, nothing read or written")
    missing = sorted(expected - found, key=_order)
    if missing:
        raise ConfigError(f"history database {path}: {missing[0]} is missing: not a harness history")


def _order(each: SchemaObject) -> tuple[str, str, str, str]:
    return each.type, each.name, each.table, each.sql or ""
