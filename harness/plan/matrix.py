"""Matrices: finding one by name or path, expanding it into cells, and selecting cells by glob.

Expansion is pure: ``expand(spec, runners)`` is the product of the axes, minus
every cell that matches an ``exclude`` entry, plus the ``include`` cells. Every
problem is a `ConfigError` naming the file and the key or value.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import itertools
import math
import os
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from harness.plan.cells import AXES, OPTIONAL_AXES, Cell, Matrix, Runner
from harness.plan.files import (
    matrix_dirs,
    non_negative_int,
    positive_int,
    positive_number,
    read_yaml,
    reject_unknown_keys,
)
from harness.plan.index import FLOATING
from harness.plan.runners import load_runners
from harness.project import find_project_root, project_root

# The keys a matrix may have, and what each means (docs/reference/matrices.md is rendered from this table).
MATRIX_KEYS = {
    "description": "A line for the matrix's readers.",
    "axes": "Required: the axes crossed into cells, each a non-empty list (the axes are listed below the table).",
    "exclude": "Partial cells: a cell of the product that matches every key given is dropped.",
    "include": "Whole cells (every required axis) added after the product.",
    "suite": "What pytest runs: a non-empty list of test paths. Default `[tests/gpu]`.",
    "markers": "A pytest `-m` expression, one line, in place of the project's default selection.",
    "timeout_minutes": "The cell's pytest budget in minutes; past it the cell is killed and marked errored. "
                       "Default 30.",
    "reruns": "pytest-rerunfailures reruns; a test that passes on a rerun shows as flaky. Default 0.",
    "test_timeout_seconds": "The per-test timeout (pytest-timeout), with every rank's stack. Default 600.",
    "install": "What else the cell's environment installs: pip arguments, local paths from the project root. "
               "Part of the environment's cache key.",
}
MAX_MARKERS_LENGTH = 200  # a marker expression, from a pull request's matrix too
DEFAULT_MATRIX = "cpu"
# Matrices come from pull requests too: bounded before anything is expanded or written to GITHUB_OUTPUT.
MAX_CELLS = 256  # GitHub runs at most 256 jobs from one strategy.matrix
MAX_PRODUCT = 4096  # the axes' product before excludes trim it: 16 times what may be left
# PEP 440 release versions as pip pins them: 2.11.0, 5.0.0rc1, 2.14.0.dev20261101, 2.11.0+cu130.
VERSION_PATTERN = re.compile(r"\d+(\.\d+){1,3}((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[a-z0-9.]+)?")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MatrixSource:
    """A named matrix, where it comes from, and the one it hides (a repository's own overrides the shipped)."""

    name: str
    path: Path
    origin: str  # "repository", "shipped" or "$HARNESS_MATRICES_DIR"
    hides: Path | None


def named_matrices(root: Path) -> list[MatrixSource]:
    found: dict[str, MatrixSource] = {}
    for origin, folder in matrix_dirs(root):
        for path in sorted(folder.glob("*.yaml")):
            if path.stem == "runners":
                continue
            if path.stem in found:
                if found[path.stem].hides is None:
                    found[path.stem] = dataclasses.replace(found[path.stem], hides=path)
                continue
            found[path.stem] = MatrixSource(name=path.stem, path=path, origin=origin, hides=None)
    return sorted(found.values(), key=lambda source: source.name)


def is_path(name_or_path: str) -> bool:
    """A bare name means ``matrices/<name>.yaml``; anything with a YAML suffix or a slash is a path."""
    return Path(name_or_path).suffix in (".yaml", ".yml") or "/" in name_or_path or os.sep in name_or_path


def resolve_matrix_path(name_or_path: str, root: Path | None = None) -> Path:
    """A path is taken from the working directory where it exists there, else from the project root;
    a name is looked up in `matrix_dirs`, the first that has it winning."""
    if is_path(name_or_path):
        candidate = Path(name_or_path).expanduser()
        if not candidate.is_absolute() and not candidate.exists():
            candidate = (root or project_root()) / candidate
        if candidate.is_dir():
            raise ConfigError(f"{name_or_path}: is a folder; --matrix takes a matrix name or a YAML file")
        if not candidate.is_file():
            raise ConfigError(f"{name_or_path}: no such matrix file")
        return candidate
    root = root or project_root()
    for _origin, folder in matrix_dirs(root):
        if (folder / f"{name_or_path}.yaml").is_file():
            return folder / f"{name_or_path}.yaml"
    known = [source.name for source in named_matrices(root)]
    raise ConfigError(f"unknown matrix {name_or_path!r}: not in {root / 'matrices'} nor shipped with harness; "
                      f"known: {', '.join(known) or 'none'}")


def load_matrix(name_or_path: str, runners: Mapping[str, Runner] | None = None,
                resolve: Callable[[str, str], str] | None = None) -> Matrix:
    """`resolve(package, "latest-N")` names the release a floating version stands for (default: ask the index)."""
    path = resolve_matrix_path(name_or_path).resolve()
    project = find_project_root(path) if is_path(name_or_path) else find_project_root()
    root = project.path
    spec = read_yaml(path)
    runners = runners if runners is not None else load_runners(root, beside=path.parent)
    name = path.stem
    if resolve is None:
        from harness.plan.versions import resolve_floating as resolve
    cells = [dataclasses.replace(cell, install=tuple(resolve_install(entry, root) for entry in cell.install))
             for cell in expand(spec, runners, name=name, source=str(path), resolve=resolve)]
    reference = name_or_path
    if is_path(name_or_path):
        reference = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
    return Matrix(name=name, path=path, description=str(spec.get("description", "")), cells=tuple(cells),
                  project=project, reference=reference)


def expand(spec: Any, runners: Mapping[str, Runner], *, name: str, source: str,
           resolve: Callable[[str, str], str] | None = None) -> list[Cell]:
    """The product of the axes, minus excludes, plus includes; validated; deterministic order.
    Floating versions (`latest`, `latest-N`) become releases through `resolve(package, value)` first,
    so the cell id, env.json and reports name the release that ran."""
    floating = _Floating(resolve, source)
    if not isinstance(spec, dict):
        raise ConfigError(f"{source}: expected a mapping with axes, include, exclude, suite")
    reject_unknown_keys(spec, MATRIX_KEYS, source)
    axes = spec.get("axes")
    if not isinstance(axes, dict):
        raise ConfigError(f"{source}: axes: expected a mapping of {', '.join(AXES)} to lists")
    for key in axes:
        if key not in AXES and key not in OPTIONAL_AXES:
            raise ConfigError(f"{source}: axes.{key}: unknown axis (known: {', '.join((*AXES, *OPTIONAL_AXES))})")
    values = {}
    for axis in AXES:
        listed = axes.get(axis)
        if not isinstance(listed, list) or not listed:
            raise ConfigError(f"{source}: axes.{axis}: expected a non-empty list")
        resolved = [floating(axis, _axis_value(axis, v, f"{source}: axes.{axis}"), f"axes.{axis}") for v in listed]
        values[axis] = list(dict.fromkeys(resolved))  # `latest` may name a release the list already has
    for axis, default in OPTIONAL_AXES.items():
        listed = axes.get(axis, [default])
        if not isinstance(listed, list) or not listed:
            raise ConfigError(f"{source}: axes.{axis}: expected a non-empty list")
        values[axis] = list(dict.fromkeys(positive_int(v, f"{source}: axes.{axis}: {v!r}") for v in listed))

    excludes = [floating.partial(_partial_cell(e, f"{source}: exclude[{i}]"), f"exclude[{i}]")
                for i, e in enumerate(_list(spec, "exclude", source))]
    includes = [floating.partial(_partial_cell(e, f"{source}: include[{i}]"), f"include[{i}]")
                for i, e in enumerate(_list(spec, "include", source))]
    for i, entry in enumerate(includes):
        missing = [axis for axis in AXES if axis not in entry]
        if missing:
            raise ConfigError(f"{source}: include[{i}]: missing {', '.join(missing)}")

    every_axis = (*AXES, *OPTIONAL_AXES)
    size = math.prod(len(values[axis]) for axis in every_axis)
    if size > MAX_PRODUCT:
        raise ConfigError(f"{source}: axes: their product has {size:,} cells; at most {MAX_PRODUCT:,} "
                          f"(and at most {MAX_CELLS} after exclude and include)")
    if len(includes) > MAX_CELLS:
        raise ConfigError(f"{source}: include: {len(includes):,} entries; a matrix has at most {MAX_CELLS} cells")
    product = [dict(zip(every_axis, combo, strict=True))
               for combo in itertools.product(*(values[a] for a in every_axis))]
    kept = [c for c in product if not any(_matches(c, e) for e in excludes)]
    combos = kept + [{**OPTIONAL_AXES, **c} for c in includes if {**OPTIONAL_AXES, **c} not in kept]
    if not combos:
        raise ConfigError(f"{source}: the matrix is empty: every cell of axes is excluded")
    if len(combos) > MAX_CELLS:
        raise ConfigError(f"{source}: {len(combos):,} cells; GitHub runs at most {MAX_CELLS} jobs per matrix: "
                          "exclude cells or split the matrix")

    suite = spec.get("suite", ["tests/gpu"])
    if not isinstance(suite, list) or not suite or not all(isinstance(s, str) for s in suite):
        raise ConfigError(f"{source}: suite: expected a non-empty list of test paths")
    install = spec.get("install", [])
    if not isinstance(install, list) or not all(isinstance(s, str) and s.strip() for s in install):
        raise ConfigError(f"{source}: install: expected a list of pip arguments, e.g. [\"-e .\", \"pkg==1.2\"]")
    # The matrix's settings, every cell's: read (and refused) before any cell is.
    install_args = tuple(s.strip() for s in install)
    markers = marker_expression(spec.get("markers"), f"{source}: markers")
    timeout_minutes = positive_number(spec.get("timeout_minutes", 30), f"{source}: timeout_minutes")
    reruns = non_negative_int(spec.get("reruns", 0), f"{source}: reruns")
    test_timeout_seconds = positive_int(spec.get("test_timeout_seconds", 600), f"{source}: test_timeout_seconds")
    cells = []
    for combo in combos:
        runner = runners.get(combo["gpu"])
        if runner is None:
            raise ConfigError(f"{source}: gpu {combo['gpu']!r}: unknown GPU type "
                              f"(known: {', '.join(sorted(runners))})")
        if combo["gpus"] > runner.capacity:
            what = "CPU ranks" if runner.is_cpu else "GPUs"
            raise ConfigError(f"{source}: gpus {combo['gpus']} for gpu {combo['gpu']!r}: its runner has "
                              f"{runner.capacity} {what}; exclude the cell or lower gpus")
        if combo["hosts"] > runner.hosts:
            raise ConfigError(f"{source}: hosts {combo['hosts']} for gpu {combo['gpu']!r}: its runner spans at most "
                              f"{runner.hosts} hosts (runners.yaml hosts)")
        cells.append(Cell(matrix=name, labels=runner.labels, suite=tuple(suite), engine=runner.engine,
                          submit=runner.submit, cpu_ranks=runner.is_cpu, **combo, install=install_args,
                          markers=markers, timeout_minutes=timeout_minutes, reruns=reruns,
                          test_timeout_seconds=test_timeout_seconds))
    return cells


def marker_expression(value: Any, where: str) -> str | None:
    """A pytest `-m` expression (None: the project's default selection), one printable line of bounded length; pytest
    parses it (an argument, never a shell's), and names what it cannot."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_MARKERS_LENGTH \
            or not value.isprintable():
        raise ConfigError(f"{where}: expected a pytest marker expression (one line, at most {MAX_MARKERS_LENGTH} "
                          f"characters), e.g. \"deep and not exhaustive\"")
    return value.strip()


def select(cells: Iterable[Cell], patterns: list[str] | None) -> list[Cell]:
    """Cells whose id matches any pattern (fnmatch with brace expansion); all cells without patterns."""
    if not patterns:
        return list(cells)
    expanded = [p for pattern in patterns for p in expand_braces(pattern)]
    return [cell for cell in cells if any(fnmatch.fnmatchcase(cell.id, p) for p in expanded)]


def expand_braces(pattern: str) -> list[str]:
    """``'ada-*-tf{5.9,5.24}*'`` -> two patterns; nested braces expand from the innermost."""
    match = re.search(r"\{([^{}]*)\}", pattern)
    if not match:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end():]
    expanded = [p for option in match.group(1).split(",") for p in expand_braces(head + option + tail)]
    return list(dict.fromkeys(expanded))  # innermost-first expansion repeats outer options


def resolve_install(entry: str, root: Path) -> str:
    """An `install:` entry with its local paths made absolute from the project root (``-e .`` is the
    repository itself), so the environment's cache key tells two repositories apart."""
    tokens = shlex.split(entry)
    for i, token in enumerate(tokens):
        if not token.startswith("-") and (token.startswith((".", "/", "~")) or (root / token).exists()):
            tokens[i] = str((root / Path(token).expanduser()).resolve())
    return shlex.join(tokens)


def _axis_value(axis: str, value: Any, where: str) -> Any:
    if axis == "gpus":
        return positive_int(value, f"{where}: {value!r}")
    if axis == "gpu":
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{where}: {value!r}: expected a GPU type name")
        return value
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {value!r}: versions must be quoted strings (YAML reads 2.10 as a number)")
    if not VERSION_PATTERN.fullmatch(value) and not FLOATING.fullmatch(value):
        raise ConfigError(f"{where}: {value!r}: malformed version (expected e.g. 2.11.0, latest or latest-1)")
    return value


class _Floating:
    """Resolves `latest` / `latest-N` once per (package, value) while one matrix expands."""

    def __init__(self, resolve: Callable[[str, str], str] | None, source: str) -> None:
        self.resolve, self.source = resolve, source
        self.seen: dict[tuple[str, str], str] = {}

    def __call__(self, axis: str, value: Any, where: str) -> Any:
        if axis not in ("torch", "transformers") or not FLOATING.fullmatch(value):
            return value
        if (axis, value) not in self.seen:
            if self.resolve is None:
                raise ConfigError(f"{self.source}: {where}: {value!r}: floating versions need a package index")
            try:
                resolved = self.resolve(axis, value)
            except ConfigError as error:
                raise ConfigError(f"{self.source}: {where}: {value!r}: cannot resolve: {error}") from None
            if not isinstance(resolved, str) or not VERSION_PATTERN.fullmatch(resolved):
                raise ConfigError(f"{self.source}: {where}: {value!r} resolved to {resolved!r}, not a version")
            self.seen[axis, value] = resolved
        return self.seen[axis, value]

    def partial(self, entry: dict[str, Any], where: str) -> dict[str, Any]:
        return {key: self(key, value, f"{where}.{key}") for key, value in entry.items()}


def _partial_cell(entry: Any, where: str) -> dict[str, Any]:
    if not isinstance(entry, dict) or not entry:
        raise ConfigError(f"{where}: expected a mapping of axis to value")
    for key in entry:
        if key in OPTIONAL_AXES:
            continue
        if key not in AXES:
            raise ConfigError(f"{where}.{key}: unknown axis (known: {', '.join(AXES)})")
    return {key: positive_int(value, f"{where}.{key}") if key in OPTIONAL_AXES
            else _axis_value(key, value, f"{where}.{key}") for key, value in entry.items()}


def _matches(cell: Mapping[str, Any], partial: Mapping[str, Any]) -> bool:
    return all(cell[key] == value for key, value in partial.items())


def _list(spec: Mapping[str, Any], key: str, source: str) -> list[Any]:
    value = spec.get(key) or []
    if not isinstance(value, list):
        raise ConfigError(f"{source}: {key}: expected a list of partial cells")
    return value
