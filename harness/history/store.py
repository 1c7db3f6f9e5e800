"""The history database: open it, refuse what is not one, and bring its schema up to the code's version.

The schema is the SQL files in `migrations/` (NNNN_name.sql), applied in order, each in the transaction that
also sets `PRAGMA user_version` to its number: a database is either at a version or at the one before it. A
migration that moves data (3: rows repacked per cell) has its step in `repack.DATA_STEPS`, run in that
transaction after its SQL; a database that held rows is vacuumed after it (the old tables' pages are freed).

Before any row is read or written, the schema's objects must be exactly those the migrations create at the file's
version (`schema`): a view or trigger planted in the artifact would run inside harness's own statements. SQLite's
`trusted_schema` is off, so nothing in a schema may call a function that is not innocuous. `read_history` opens
the file read-only (SQLite's `mode=ro`, and `query_only`) for a command that only reads it.
"""

from __future__ import annotations

import functools
import re
import sqlite3
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from harness.errors import ConfigError
from harness.history.repack import DATA_STEPS
from harness.history.schema import SchemaObject, check_objects, objects

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
    """The database at `path` at the code's schema version (migrated where older), to read and write. A file that
    is not an SQLite database, one of a newer version than this code knows, or one whose schema holds anything the
    migrations do not make, is a `ConfigError` naming it; so is a missing file unless `create`."""
    path = Path(path)
    _check_file(path, create=create)
    return _opened(path, read_only=False)


def read_history(path: str | Path) -> sqlite3.Connection:
    """The database at `path`, opened read-only: nothing of the file is ever written (an older version than the
    code's is refused, not migrated: `harness history append` migrates it). Refused as `open_history` refuses."""
    path = Path(path)
    _check_file(path, create=False)
    return _opened(path, read_only=True)


def _opened(path: Path, *, read_only: bool) -> sqlite3.Connection:
    try:  # transactions are explicit below
        if read_only:
            connection = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, isolation_level=None)
        else:
            connection = sqlite3.connect(path, isolation_level=None)
    except sqlite3.Error as error:
        raise ConfigError(f"history database {path}: cannot open it: {error}") from None
    try:
        connection.execute("PRAGMA trusted_schema = OFF")
        if read_only:
            connection.execute("PRAGMA query_only = ON")
            _check_current(connection, path)
        else:
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


def _checked_version(connection: sqlite3.Connection, path: Path) -> int:
    """The file's schema version, once its schema is checked to be exactly what the migrations make at it."""
    known = migrations()
    version = connection.execute("PRAGMA user_version").fetchone()[0]
    if version > len(known):
        raise ConfigError(f"history database {path} has schema version {version}; this harness knows up to "
                          f"{len(known)}: use a newer harness, or start a new database")
    if version < 0:
        raise ConfigError(f"history database {path} has schema version {version}, which no harness writes")
    if version == 0 and _has_tables(connection):
        raise ConfigError(f"history database {path} holds tables but no schema version: not a harness history")
    check_objects(connection, path, expected_objects(version))
    return version


@functools.cache
def expected_objects(version: int) -> frozenset[SchemaObject]:
    """The schema's objects the first `version` migrations make, as an empty database in memory holds them."""
    connection = sqlite3.connect(":memory:", isolation_level=None)
    try:
        for migration in migrations()[:version]:
            _apply(connection, migration)
        return objects(connection)
    finally:
        connection.close()


def _check_current(connection: sqlite3.Connection, path: Path) -> None:
    version = _checked_version(connection, path)
    if version < schema_version():
        raise ConfigError(f"history database {path} has schema version {version}; this command reads version "
                          f"{schema_version()} and never writes the file: `harness history append` migrates it")


def _migrate(connection: sqlite3.Connection, path: Path) -> None:
    known = migrations()
    version = _checked_version(connection, path)
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
