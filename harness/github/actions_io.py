"""What a `harness gh` step reads and writes on an Actions runner: the event file, text files, and the
step's outputs (checked so no value can add lines of its own)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from harness.errors import ConfigError, GitHubError

OUTPUT_VALUE = re.compile(r"[A-Za-z0-9._/-]*")


def read_json(path: str | Path, what: str) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise ConfigError(f"{what} {path}: cannot read: {error.strerror or error}") from error
    except ValueError as error:
        raise ConfigError(f"{what} {path}: not JSON: {error}") from error


def dig(document: dict, dotted: str, kind: type, source: str) -> Any:
    """document['a']['b'] for 'a.b', checked to be of `kind`; a clear error otherwise."""
    value: Any = document
    for key in dotted.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise ConfigError(f"{source}: {dotted} is missing or not of type {kind.__name__}")
    return value


def write_outputs(values: dict[str, str]) -> None:
    """Step outputs for later steps, or stdout when not under Actions."""
    for key, value in values.items():
        if not OUTPUT_VALUE.fullmatch(value):  # never let a value add lines of its own
            raise GitHubError(f"refusing to write output {key}={value!r}: unexpected characters")
    lines = "".join(f"{key}={value}\n" for key, value in values.items())
    target = os.environ.get("GITHUB_OUTPUT")
    if target:
        with open(target, "a", encoding="utf-8") as stream:
            stream.write(lines)
    else:
        print(lines, end="")


def read_text(path: str | Path, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{what} {path}: cannot read: {error}") from error
