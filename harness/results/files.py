"""A cell folder's files read safely: regular files only, each up to its cap; what cannot be read is a `Problem`.
And its JSON files written whole, so that a reader never meets half of one."""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

from harness.contract import SCHEMA
from harness.results.model import Problem
from harness.results.values import capped, clean_text

LINE_CHARS = 500  # per line of an excerpt or log tail
ID_CHARS = 1_000  # cell and test ids
LOG_TAIL_LINES = 30
LOG_TAIL_BYTES = 64 * 1024
JSON_BYTES = 4 * 1024 * 1024  # an env.json or memory.json beyond this is not one harness wrote
RUNNING_TEST_BYTES = 4 * ID_CHARS
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class NotRegular(OSError):
    """A contract file that is a FIFO, socket, device, folder or symbolic link: never opened for reading."""


def read_regular(path: Path, limit: int) -> bytes:
    """At most `limit + 1` bytes of a regular file (one more than the cap, so the caller sees it was larger)."""
    with open_regular(path) as stream:
        return stream.read(limit + 1)


def open_regular(path: Path) -> BinaryIO:
    """A regular file opened for reading, checked on the open descriptor (no window to swap it). O_NONBLOCK:
    opening a FIFO returns at once instead of waiting for a writer; O_NOFOLLOW: no symbolic link."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise NotRegular("a symbolic link; not followed") from None
        raise
    stream = os.fdopen(descriptor, "rb")
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        stream.close()
        raise NotRegular(f"not a regular file ({_file_kind(mode)}); not read")
    return stream


def _file_kind(mode: int) -> str:
    kinds = {stat.S_ISFIFO: "a FIFO", stat.S_ISSOCK: "a socket", stat.S_ISDIR: "a folder",
             stat.S_ISCHR: "a device", stat.S_ISBLK: "a device"}
    return next((name for test, name in kinds.items() if test(mode)), "not a file")


def write_json_whole(path: Path, document: object) -> None:
    """`document` as JSON at `path`, whole or not at all (by rename): a report, or a run waiting on a cell, may read
    it while the cell runs."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    os.replace(partial, path)


def read_json(path: Path, problems: list[Problem]) -> Mapping[str, object]:
    try:
        data = read_regular(path, JSON_BYTES)
    except FileNotFoundError:
        problems.append(Problem(path.name, "missing"))
        return {}
    except NotRegular as error:
        problems.append(Problem(path.name, str(error)))
        return {}
    except OSError as error:
        problems.append(Problem(path.name, f"unreadable: {error.strerror or error}"))
        return {}
    if len(data) > JSON_BYTES:
        problems.append(Problem(path.name, f"larger than {JSON_BYTES // (1024 * 1024)} MiB; not read"))
        return {}
    text = data.decode("utf-8", errors="replace")
    if not text.strip():
        problems.append(Problem(path.name, "empty"))
        return {}
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as error:
        problems.append(Problem(path.name, f"malformed JSON: {clean_text(str(error), 200)}"))
        return {}
    if not isinstance(document, dict):
        problems.append(Problem(path.name, f"expected an object, found {type(document).__name__}"))
        return {}
    schema = document.get("schema")
    if schema != SCHEMA:
        problems.append(Problem(path.name, f"schema {schema!r:.40}, this reader knows {SCHEMA}"))
    return document


def read_log_tail(path: Path, problems: list[Problem]) -> str | None:
    try:
        with open_regular(path) as log:
            log.seek(max(0, log.seek(0, 2) - LOG_TAIL_BYTES))
            data = log.read()
    except FileNotFoundError:
        problems.append(Problem(path.name, "missing"))
        return None
    except NotRegular as error:
        problems.append(Problem(path.name, str(error)))
        return None
    except OSError as error:
        problems.append(Problem(path.name, f"unreadable: {error.strerror or error}"))
        return None
    lines = _ANSI.sub("", data.decode("utf-8", errors="replace")).rstrip().splitlines()
    return "\n".join(clean_text(line, LINE_CHARS) for line in lines[-LOG_TAIL_LINES:]) or None


def read_running_test(path: Path) -> str | None:
    """The id of the test that was running when pytest stopped (the ranks plugin removes the file when a test
    ends), or None. A regular file only, read bounded: it came from the tested code's run."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return None
        data = os.read(descriptor, RUNNING_TEST_BYTES)
    except OSError:
        return None
    finally:
        os.close(descriptor)
    lines = data.decode("utf-8", errors="replace").splitlines()
    return capped(clean_text(lines[0].strip(), ID_CHARS), ID_CHARS) if lines and lines[0].strip() else None
