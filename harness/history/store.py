"""The history database: open it, refuse what is not one, and bring its schema up to the code's version.

The schema is the SQL files in `migrations/` (NNNN_name.sql), applied in order, each in the transaction that
also sets `PRAGMA user_version` to its number: a database is either at a version or at the one before it. A
migration that moves data (3: rows repacked per cell) has its step in `repack.DATA_STEPS`, run in that
transaction after its SQL; a database that held rows is vacuumed after it (the old tables' pages are freed).
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from harness.errors import ConfigError
from harness.history.repack import DATA_STEPS

_MIGRATION_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")
# Every SQLite file starts with these 16 bytes; an empty file is a database not yet written.
_SQLITE_HEADER = b"SQLite format 3\x00"


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations() -> tuple[Migration, ...]:
    """The package's migrations in version order, numbered 1, 2, ... without a gap."""
    found = []
    for entry in resources.files("harness.history").joinpath("migrations").iterdir():
        match = _MIGRATION_NAME.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    found.sort(key=lambda migration: migration.version)
    if [migration.version for migration in found] != list(range(1, len(found) + 1)):
        raise AssertionError(f"migrations are not numbered 1..N: {[m.name for m in found]}")
    return tuple(found)


def schema_version() -> int:
    """The version this code writes and reads."""
    return len(migrations())


def open_history(path: str | Path, *, create: bool) -> sqlite3.Connection:
    """The database at `path` at the code's schema version (migrated where older). A file that is not an SQLite
    database, or one of a newer version than this code knows, is a `ConfigError` naming it; so is a missing file
    unless `create`."""
    path = Path(path)
    _check_file(path, create=create)
    try:
        connection = sqlite3.connect(path, isolation_level=None)  # transactions are explicit below
    except sqlite3.Error as error:
        raise ConfigError(f"history database {path}: cannot open it: {error}") from None
    try:
        _migrate(connection, path)
    except sqlite3.DatabaseError as error:
        connection.close()
        raise ConfigError(f"history database {path}: not a usable SQLite database: {error}") from None
    except BaseException:
        connection.close()
        raise
    return connection


def _check_file(path: Path, *, create: bool) -> None:
    if not path.exists():
        if create:
            return
        raise ConfigError(f"history database {path} does not exist")
    if not path.is_file():
        raise ConfigError(f"history database {path} is not a file")
    try:
        with path.open("rb") as file:
            header = file.read(len(_SQLITE_HEADER))
    except OSError as error:
        raise ConfigError(f"history database {path}: cannot read it: {error.strerror or error}") from None
    if header and header != _SQLITE_HEADER:
        raise ConfigError(f"history database {path} is not an SQLite database (its first bytes are {header[:8]!r})")


def _migrate(connection: sqlite3.Connection, path: Path) -> None:
    known = migrations()
    version = connection.execute("PRAGMA user_version").fetchone()[0]
    if version > len(known):
        raise ConfigError(f"history database {path} has schema version {version}; this harness knows up to "
                          f"{len(known)}: use a newer harness, or start a new database")
    if version < 0:
        raise ConfigError(f"history database {path} has schema version {version}, which no harness writes")
    if version == 0 and _has_tables(connection):
        raise ConfigError(f"history database {path} holds tables but no schema version: not a harness history")
    moved = False
    for migration in known[version:]:
        _apply(connection, migration)
        moved = moved or (version > 0 and migration.version in DATA_STEPS)
    if moved:
        connection.execute("VACUUM")


def _apply(connection: sqlite3.Connection, migration: Migration) -> None:
    # executescript() would commit first; run the statements one by one inside one transaction instead.
    connection.execute("BEGIN IMMEDIATE")
    try:
        for statement in _statements(migration.sql):
            connection.execute(statement)
        if migration.version in DATA_STEPS:
            DATA_STEPS[migration.version](connection)
        connection.execute(f"PRAGMA user_version = {migration.version:d}")
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")


def _statements(sql: str) -> list[str]:
    """The migration's statements: comments dropped, split where `sqlite3.complete_statement` says one ends."""
    statements, current = [], ""
    for line in sql.splitlines():
        line = line.split("--", 1)[0]
        if not line.strip():
            continue
        current += line + "\n"
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    if current.strip():
        raise AssertionError(f"a migration ends inside a statement: {current!r}")
    return statements


def _has_tables(connection: sqlite3.Connection) -> bool:
    return connection.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0] > 0
