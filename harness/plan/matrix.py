"""Matrices: schema, validation, expansion into cells, and selection by glob.

Expansion is pure: ``expand(spec, runners)`` is the product of the axes, minus
every cell that matches an ``exclude`` entry, plus the ``include`` cells. Every
problem is a `ConfigError` naming the file and the key or value.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import itertools
import json
import math
import os
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from harness.errors import ConfigError
from harness.plan.index import FLOATING
from harness.project import ProjectRoot, find_project_root, project_root, shipped_matrices_dir

AXES = ("gpu", "gpus", "torch", "transformers")
# Axes a matrix may leave out, and the value a cell then has: `hosts` makes a cell H hosts x `gpus` each.
OPTIONAL_AXES = {"hosts": 1}
ENGINES = ("local", "slurm", "jobset")
SUBMIT_KEYS = {"partition", "account", "time", "sbatch_args", "segment", "container_image", "image",
               "namespace", "gpu_resource", "results_claim"}
MATRIX_KEYS = {"description", "axes", "exclude", "include", "suite", "timeout_minutes", "reruns",
               "test_timeout_seconds", "install"}
RUNNER_KEYS = {"labels", "gpus", "nvml_name", "ranks", "ephemeral", "engine", "hosts", "submit"}
CPU = "cpu"
DEFAULT_MATRIX = "cpu"
# A job's timeout is the cell's pytest budget plus this much for checkout and building its environment.
JOB_SETUP_MINUTES = 20
# Matrices come from pull requests too: bounded before anything is expanded or written to GITHUB_OUTPUT.
MAX_CELLS = 256  # GitHub runs at most 256 jobs from one strategy.matrix
MAX_PRODUCT = 4096  # the axes' product before excludes trim it: 16 times what may be left
MAX_YAML_BYTES = 256 * 1024
# PEP 440 release versions as pip pins them: 2.11.0, 5.0.0rc1, 2.14.0.dev20261101, 2.11.0+cu130.
VERSION_PATTERN = re.compile(r"\d+(\.\d+){1,3}((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[a-z0-9.]+)?")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Runner:
    """A GPU type: where its jobs land and how many devices (or CPU ranks) one runner offers."""

    name: str
    labels: tuple[str, ...]
    gpus: int
    nvml_name: str | None = None
    ranks: int = 0
    # A fresh machine or container for every job, nothing kept: only then may a pull request's cell run there.
    ephemeral: bool = False
    engine: str = "local"  # what a cell's hosts are started by: local (this host), slurm, jobset
    hosts: int = 1  # the most hosts one cell may span
    submit: Submit | None = None  # what the engine needs (partition, account, image, ...)

    @property
    def is_cpu(self) -> bool:
        return self.gpus == 0

    @property
    def capacity(self) -> int:
        return self.ranks if self.is_cpu else self.gpus


@dataclasses.dataclass(frozen=True, kw_only=True)
class Submit:
    """How an engine submits a cell (runners.yaml `submit:`); Slurm: partition, account, time, sbatch_args,
    segment; pyxis: container_image; JobSet: image, namespace, gpu_resource, results_claim (a PVC mounted
    where the results folder is, so host 0 writes junit.xml there as on a shared file system)."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None
    sbatch_args: tuple[str, ...] = ()
    segment: int | None = None
    container_image: str | None = None
    image: str | None = None
    namespace: str | None = None
    gpu_resource: str = "nvidia.com/gpu"
    results_claim: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cell:
    """One job: a GPU type and count crossed with a torch and a transformers release."""

    gpu: str
    gpus: int
    torch: str
    transformers: str
    matrix: str
    labels: tuple[str, ...]
    timeout_minutes: float  # pytest's budget for the whole cell; the job adds JOB_SETUP_MINUTES
    reruns: int
    suite: tuple[str, ...]
    test_timeout_seconds: int = 600
    # What the cell's environment installs besides the suite's packages (pip arguments, from the project root).
    install: tuple[str, ...] = ()
    hosts: int = 1  # a cell spans `hosts` hosts of `gpus` each: world hosts x gpus
    engine: str = "local"
    submit: Submit | None = None
    cpu_ranks: bool = False  # its runner has no GPUs (a runner type other than `cpu` may be CPU-only too)

    @property
    def is_cpu(self) -> bool:
        return self.gpu == CPU or self.cpu_ranks

    @property
    def world_size(self) -> int:
        return self.hosts * self.gpus

    @property
    def id(self) -> str:
        unit = "rank" if self.is_cpu else "gpu"
        shape = f"{self.hosts}x{self.gpus}" if self.hosts > 1 else f"{self.gpus}"
        return f"{self.gpu}-{shape}{unit}-torch{self.torch}-tf{self.transformers}"

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, **{k: list(v) if isinstance(v, tuple) else v
                                  for k, v in dataclasses.asdict(self).items()}}

    def to_github(self) -> dict[str, Any]:
        """One entry of ``strategy.matrix.include``."""
        return {"id": self.id, "gpu": self.gpu, "gpus": self.gpus, "torch": self.torch,
                "transformers": self.transformers, "matrix": self.matrix, "runs_on": list(self.labels),
                "timeout_minutes": math.ceil(self.timeout_minutes) + JOB_SETUP_MINUTES, "reruns": self.reruns}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Matrix:
    name: str
    path: Path
    description: str
    cells: tuple[Cell, ...]
    project: ProjectRoot  # the cells' suite and install paths are relative to it
    reference: str  # what `--matrix` takes to find this matrix again from the project root

    @property
    def root(self) -> Path:
        return self.project.path


@dataclasses.dataclass(frozen=True, kw_only=True)
class MatrixSource:
    """A named matrix, where it comes from, and the one it hides (a repository's own overrides the shipped)."""

    name: str
    path: Path
    origin: str  # "repository", "shipped" or "$HARNESS_MATRICES_DIR"
    hides: Path | None


def matrix_dirs(root: Path) -> list[tuple[str, Path]]:
    """Folders of named matrices, the one that wins first: $HARNESS_MATRICES_DIR, the repository's
    matrices/, the matrices harness ships."""
    shipped = shipped_matrices_dir()
    folders = []
    if os.environ.get("HARNESS_MATRICES_DIR"):
        folders.append(("$HARNESS_MATRICES_DIR", Path(os.environ["HARNESS_MATRICES_DIR"])))
    own = root / "matrices"
    if own.is_dir() and not _same_folder(own, shipped):
        folders.append(("repository", own))
    folders.append(("shipped", shipped))
    return folders


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


def load_runners(root: Path | None = None, beside: Path | None = None) -> dict[str, Runner]:
    """The shipped runners, updated by each runners.yaml that wins over them: the repository's matrices/,
    $HARNESS_MATRICES_DIR, and the one beside a matrix file (`beside`, its folder)."""
    folders = [folder for _origin, folder in reversed(matrix_dirs(root or project_root()))]
    if beside is not None and not any(_same_folder(beside, folder) for folder in folders):
        folders.append(beside)
    runners: dict[str, Runner] = {}
    for folder in folders:
        if os.path.lexists(folder / "runners.yaml"):
            runners.update(read_runners(folder / "runners.yaml"))
    return runners


def read_runners(path: Path) -> dict[str, Runner]:
    data = read_yaml(path)
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{path}: expected a mapping of GPU type to runner")
    runners = {}
    for name, entry in data.items():
        where = f"{path}: {name}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: expected a mapping with labels and gpus")
        unknown = set(entry) - RUNNER_KEYS
        if unknown:
            raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r} (known: {', '.join(sorted(RUNNER_KEYS))})")
        labels = entry.get("labels")
        if not isinstance(labels, list) or not labels or not all(isinstance(x, str) for x in labels):
            raise ConfigError(f"{where}.labels: expected a non-empty list of strings")
        gpus = _non_negative_int(entry.get("gpus"), f"{where}.gpus")
        ranks = _non_negative_int(entry.get("ranks", 0), f"{where}.ranks")
        if gpus == 0 and ranks == 0:
            raise ConfigError(f"{where}: a runner with gpus: 0 needs ranks (CPU ranks it can run)")
        ephemeral = entry.get("ephemeral", False)
        if not isinstance(ephemeral, bool):
            raise ConfigError(f"{where}.ephemeral: expected true or false, got {ephemeral!r}")
        engine = entry.get("engine", "local")
        if engine not in ENGINES:
            raise ConfigError(f"{where}.engine: {engine!r}: expected one of {', '.join(ENGINES)}")
        hosts = _positive_int(entry.get("hosts", 1), f"{where}.hosts")
        runners[name] = Runner(name=name, labels=tuple(labels), gpus=gpus, nvml_name=entry.get("nvml_name"),
                               ranks=ranks, ephemeral=ephemeral, engine=engine, hosts=hosts,
                               submit=_submit(entry.get("submit"), f"{where}.submit"))
    return runners


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
    unknown = set(spec) - MATRIX_KEYS
    if unknown:
        raise ConfigError(f"{source}: unknown key {sorted(unknown)[0]!r} (known: {', '.join(sorted(MATRIX_KEYS))})")
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
        values[axis] = list(dict.fromkeys(_positive_int(v, f"{source}: axes.{axis}: {v!r}") for v in listed))

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
    settings = {
        "install": tuple(s.strip() for s in install),
        "timeout_minutes": _positive_number(spec.get("timeout_minutes", 30), f"{source}: timeout_minutes"),
        "reruns": _non_negative_int(spec.get("reruns", 0), f"{source}: reruns"),
        "test_timeout_seconds": _positive_int(spec.get("test_timeout_seconds", 600),
                                              f"{source}: test_timeout_seconds"),
    }
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
                          submit=runner.submit, cpu_ranks=runner.is_cpu, **combo, **settings))
    return cells


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


def format_cells(cells: list[Cell], fmt: str) -> str:
    if fmt == "ids":
        return "\n".join(cell.id for cell in cells)
    if fmt == "json":
        return json.dumps([cell.to_json() for cell in cells], indent=2)
    if fmt == "github":
        return json.dumps({"include": [cell.to_github() for cell in cells]}, separators=(",", ":"))
    raise ConfigError(f"unknown format {fmt!r}")


def command(args) -> int:
    if args.list:
        print(format_sources(named_matrices(project_root())))
        return 0
    if not args.matrix:
        raise ConfigError("harness matrix: give --matrix NAME_OR_PATH, or --list to see the names")
    matrix = load_matrix(args.matrix)
    cells = select(matrix.cells, args.cell)
    if not cells:
        raise ConfigError(f"{matrix.path}: no cell matches --cell {' '.join(args.cell)}")
    if args.pull_request:
        from harness.plan.isolation import refuse_persistent_runners

        refuse_persistent_runners(cells, load_runners(matrix.root, beside=matrix.path.parent), str(matrix.path))
    if args.check:
        from harness.plan.pins import check_pins  # asks the package index: only when told to

        check_pins(cells, str(matrix.path))
    print(format_cells(cells, args.format))
    return 0


def resolve_install(entry: str, root: Path) -> str:
    """An `install:` entry with its local paths made absolute from the project root (``-e .`` is the
    repository itself), so the environment's cache key tells two repositories apart."""
    tokens = shlex.split(entry)
    for i, token in enumerate(tokens):
        if not token.startswith("-") and (token.startswith((".", "/", "~")) or (root / token).exists()):
            tokens[i] = str((root / Path(token).expanduser()).resolve())
    return shlex.join(tokens)


def format_sources(sources: list[MatrixSource]) -> str:
    """One line per named matrix: name, where it comes from, and what it overrides."""
    width = max((len(source.name) for source in sources), default=4)
    lines = []
    for source in sources:
        hides = f" (overrides {source.hides})" if source.hides else ""
        lines.append(f"{source.name:<{width}}  {source.origin:<10}  {source.path}{hides}")
    return "\n".join(lines)


def _same_folder(one: Path, other: Path) -> bool:
    try:
        return one.resolve() == other.resolve()
    except OSError:
        return False


def _axis_value(axis: str, value: Any, where: str) -> Any:
    if axis == "gpus":
        return _positive_int(value, f"{where}: {value!r}")
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
        self.resolve, self.source, self.seen = resolve, source, {}

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


def _submit(entry: Any, where: str) -> Submit | None:
    if entry is None:
        return None
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected a mapping (partition, account, time, sbatch_args, ...)")
    unknown = set(entry) - SUBMIT_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r} (known: {', '.join(sorted(SUBMIT_KEYS))})")
    for key, value in entry.items():
        if key == "sbatch_args":
            if not isinstance(value, list) or not all(isinstance(v, str) and v.startswith("--") for v in value):
                raise ConfigError(f"{where}.sbatch_args: expected a list of --options, got {value!r}")
        elif key == "segment":
            _positive_int(value, f"{where}.segment")
        elif not isinstance(value, str) or not value or any(ch.isspace() for ch in value):
            raise ConfigError(f"{where}.{key}: expected a word without spaces, got {value!r}")
    return Submit(**{**entry, "sbatch_args": tuple(entry.get("sbatch_args", ()))})


def _partial_cell(entry: Any, where: str) -> dict[str, Any]:
    if not isinstance(entry, dict) or not entry:
        raise ConfigError(f"{where}: expected a mapping of axis to value")
    for key in entry:
        if key in OPTIONAL_AXES:
            continue
        if key not in AXES:
            raise ConfigError(f"{where}.{key}: unknown axis (known: {', '.join(AXES)})")
    return {key: _positive_int(value, f"{where}.{key}") if key in OPTIONAL_AXES
            else _axis_value(key, value, f"{where}.{key}") for key, value in entry.items()}


def _matches(cell: Mapping[str, Any], partial: Mapping[str, Any]) -> bool:
    return all(cell[key] == value for key, value in partial.items())


def _list(spec: Mapping[str, Any], key: str, source: str) -> list[Any]:
    value = spec.get(key) or []
    if not isinstance(value, list):
        raise ConfigError(f"{source}: {key}: expected a list of partial cells")
    return value


def _non_negative_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where}: expected a whole number >= 0, got {value!r}")
    return value


def _positive_number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{where}: expected a number > 0, got {value!r}")
    return value


def _positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: expected a whole number >= 1, got {value!r}")
    return value
