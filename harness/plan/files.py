"""The plan's YAML files: the folders that hold matrices and runners.yaml, reading one without trusting it,
and the checks of the numbers they hold. Every problem is a `ConfigError` naming the file and the key."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from harness.environment import MATRICES_DIR_ENV
from harness.errors import ConfigError
from harness.project import shipped_matrices_dir

# Matrices and runners.yaml come from pull requests too: a file is bounded before it is parsed.
MAX_YAML_BYTES = 256 * 1024


def matrix_dirs(root: Path) -> list[tuple[str, Path]]:
    """Folders of named matrices, the one that wins first: $HARNESS_MATRICES_DIR, the repository's
    matrices/, the matrices harness ships."""
    shipped = shipped_matrices_dir()
    folders = []
    if os.environ.get(MATRICES_DIR_ENV):
        folders.append((f"${MATRICES_DIR_ENV}", Path(os.environ[MATRICES_DIR_ENV])))
    own = root / "matrices"
    if own.is_dir() and not same_folder(own, shipped):
        folders.append(("repository", own))
    folders.append(("shipped", shipped))
    return folders


def same_folder(one: Path, other: Path) -> bool:
    try:
        return one.resolve() == other.resolve()
    except OSError:
        return False


class _NoAliasLoader(yaml.SafeLoader):
    """safe_load without aliases: an anchor referenced a few times per level expands exponentially
    (a kilobyte of YAML becomes gigabytes), and no matrix needs one."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, f"alias *{event.anchor} refused: matrices take no "
                                              "YAML aliases; write the value out", event.start_mark)
        return super().compose_node(parent, index)


def read_yaml(path: Path) -> Any:
    try:
        if not path.is_file():
            raise ConfigError(f"{path}: not a regular file")
        size = path.stat().st_size
        if size > MAX_YAML_BYTES:
            raise ConfigError(f"{path}: {size:,} bytes; a matrix or runners file may have at most {MAX_YAML_BYTES:,}")
        return yaml.load(path.read_bytes().decode("utf-8"), Loader=_NoAliasLoader)
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 (byte {error.start})") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(f"{path}{where}: YAML does not parse: {problem}") from None
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror}") from None


def non_negative_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where}: expected a whole number >= 0, got {value!r}")
    return value


def positive_number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{where}: expected a number > 0, got {value!r}")
    return value


def positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: expected a whole number >= 1, got {value!r}")
    return value


def reject_unknown_keys(entry: Mapping[str, Any], known: Iterable[str], where: str) -> None:
    """One line naming the first key `entry` has that `known` lacks, and the keys it may have."""
    unknown = sorted(set(entry) - set(known), key=str)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
