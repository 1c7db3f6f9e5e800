"""Which transformers release first declared an expert-parallel plan for each model type, read offline from the
releases' source.

    python tests/gpu/models/ep_plan_history.py --regenerate

writes `ep_plan_history.json` beside this file, the table the suite reads (ep_floors.py); run by hand, never by the
suite. For each release it downloads the wheel (`pip download --no-deps`, cached under ~/.cache/harness/tf-wheels)
and reads `transformers/models/*/configuration_*.py` from the zip with `ast`, never importing it: a model type
declares an EP plan when its configuration class (its `model_type = "..."`) has a non-empty class-level
`base_model_ep_plan = {...}`, its own or inherited from a configuration class it derives from (in the same file, or
one imported from another configuration module of the release). A class that sets `base_model_ep_plan = None`
or `{}` declares none, even if its base does.

Which releases are read:
- the first minor with any EP plan is found by bisecting the minors (each minor read at its last patch); the
  releases bisected below it are checked empty, and the newest of them is kept in `generated_from`;
- from that minor on, every minor's first and last patch (not every patch: a family's plan appears in a minor's
  first patch with the minor's new models, or in a later patch as a fix, and both ends bound it);
- and every patch between those two ends of a minor whose ends declare different families, so that a family's
  first release is exact to the patch, not only to the minor.

Output: {"generated_from": [releases read, oldest first], "first_release": {model_type: "X.Y.Z", ...}}, where
first_release is the oldest release read that declares an EP plan for the model type. A model type whose plan
was later removed keeps its first release (the suite asks the installed release which families it declares).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

HISTORY_PATH = Path(__file__).with_name("ep_plan_history.json")
WHEEL_CACHE = Path.home() / ".cache" / "harness" / "tf-wheels"
PACKAGE = "transformers"
_CONFIG_FILE = re.compile(r"^transformers/models/[^/]+/configuration_[^/]+\.py$")


# ---------------------------------------------------------------- versions and wheels (the edges: pip)


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def released_versions() -> list[str]:
    """Every final release of transformers the package index offers, oldest first (`pip index versions`)."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", PACKAGE],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    line = next(line for line in out.splitlines() if line.startswith("Available versions:"))
    versions = [v.strip() for v in line.split(":", 1)[1].split(",")]
    return sorted((v for v in versions if re.fullmatch(r"\d+(\.\d+)*", v)), key=_key)


def wheel(version: str) -> Path:
    """The release's wheel, downloaded once into the cache."""
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    found = sorted(WHEEL_CACHE.glob(f"{PACKAGE}-{version}-*.whl"))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
             f"{PACKAGE}=={version}", "-d", str(WHEEL_CACHE)],
            check=True,
        )
        found = sorted(WHEEL_CACHE.glob(f"{PACKAGE}-{version}-*.whl"))
    return found[0]


# ---------------------------------------------------------------- the source, read (pure)


class _Class:
    def __init__(self, module: str, node: ast.ClassDef):
        self.module = module
        self.name = node.name
        self.bases = [base.id for base in node.bases if isinstance(base, ast.Name)]
        self.attrs: dict[str, ast.expr] = {}
        for statement in node.body:
            if isinstance(statement, ast.Assign):
                for target in statement.targets:
                    if isinstance(target, ast.Name):
                        self.attrs[target.id] = statement.value
            elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) and statement.value:
                self.attrs[statement.target.id] = statement.value


class _Module:
    def __init__(self, name: str, source: str):
        self.name = name  # dotted, e.g. transformers.models.mixtral.configuration_mixtral
        tree = ast.parse(source)
        self.classes: dict[str, _Class] = {}
        self.constants: dict[str, ast.expr] = {}
        self.imports: dict[str, tuple[str, str]] = {}  # local name -> (module, name)
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                self.classes[node.name] = _Class(name, node)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        self.constants[target.id] = node.value
            elif isinstance(node, ast.ImportFrom) and node.module:
                package = name.split(".")[: -node.level] if node.level else []
                source_module = ".".join([*package, node.module])
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = (source_module, alias.name)


class Release:
    """The configuration modules of one release, with class attributes resolved through inheritance."""

    def __init__(self, sources: dict[str, str]):
        self.modules = {name: _Module(name, source) for name, source in sources.items()}

    @classmethod
    def from_wheel(cls, path: Path) -> Release:
        with zipfile.ZipFile(path) as archive:
            sources = {
                name[: -len(".py")].replace("/", "."): archive.read(name).decode("utf-8")
                for name in archive.namelist()
                if _CONFIG_FILE.match(name)
            }
        return cls(sources)

    def _find_class(self, module: _Module, name: str, seen: int = 0) -> _Class | None:
        if name in module.classes:
            return module.classes[name]
        if name in module.imports and seen < 8:
            other, other_name = module.imports[name]
            if other in self.modules:
                return self._find_class(self.modules[other], other_name, seen + 1)
        return None

    def _attribute(self, cls: _Class, attr: str, depth: int = 0) -> ast.expr | None:
        """The class-level value of `attr` on `cls` or the nearest base that sets it (None: nobody in the
        release's configuration modules does)."""
        if attr in cls.attrs:
            return cls.attrs[attr]
        if depth > 16:
            return None
        module = self.modules[cls.module]
        for base in cls.bases:
            base_cls = self._find_class(module, base)
            if base_cls is not None:
                value = self._attribute(base_cls, attr, depth + 1)
                if value is not None:
                    return value
        return None

    def _declares(self, cls: _Class, value: ast.expr | None) -> bool:
        """Whether an attribute value is a non-empty mapping (a dict literal, `dict(...)` or a module constant)."""
        if isinstance(value, ast.Name) and value.id in self.modules[cls.module].constants:
            value = self.modules[cls.module].constants[value.id]
        if isinstance(value, ast.Dict):
            return bool(value.keys)
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "dict":
            return bool(value.args or value.keywords)
        return False

    def ep_families(self) -> set[str]:
        """Every model_type whose configuration class declares a non-empty `base_model_ep_plan`."""
        declared = set()
        for module in self.modules.values():
            for cls in module.classes.values():
                model_type = self._attribute(cls, "model_type")
                if not (isinstance(model_type, ast.Constant) and isinstance(model_type.value, str)):
                    continue
                if self._declares(cls, self._attribute(cls, "base_model_ep_plan")):
                    declared.add(model_type.value)
        return declared


def ep_families(version: str) -> set[str]:
    return Release.from_wheel(wheel(version)).ep_families()


# ---------------------------------------------------------------- which releases to read


def minors(versions: list[str]) -> list[list[str]]:
    """The releases grouped by minor (X.Y), each group oldest first, the groups oldest first."""
    groups: dict[tuple[int, ...], list[str]] = {}
    for version in versions:
        groups.setdefault(_key(version)[:2], []).append(version)
    return [groups[minor] for minor in sorted(groups)]


def first_minor_with_plans(groups: list[list[str]], read) -> int:
    """Index of the first minor whose last patch declares any EP plan (bisection: once a release has EP plans,
    every later one has some)."""
    low, high = 0, len(groups) - 1
    if not read(groups[high][-1]):
        raise SystemExit(f"no release up to {groups[high][-1]} declares any base_model_ep_plan")
    while low < high:
        middle = (low + high) // 2
        if read(groups[middle][-1]):
            high = middle
        else:
            low = middle + 1
    return low


def history(versions: list[str], read) -> dict:
    """The history over `versions` (oldest first), `read(version) -> set of model types` being the one edge."""
    results: dict[str, set[str]] = {}

    def cached(version: str) -> set[str]:
        if version not in results:
            results[version] = read(version)
            print(f"{version}: {len(results[version])} model types with an EP plan", file=sys.stderr)
        return results[version]

    groups = minors(versions)
    start = first_minor_with_plans(groups, cached)
    scanned = []
    if start > 0:
        cached(groups[start - 1][-1])  # the newest release without plans, kept as the proof of the start
        scanned.append(groups[start - 1][-1])
    for group in groups[start:]:
        ends = [group[0], group[-1]] if len(group) > 1 else group
        if len(group) > 2 and cached(group[0]) != cached(group[-1]):
            ends = group  # the ends differ: read every patch between them, so the first release is exact
        scanned += ends
    first_release: dict[str, str] = {}
    for version in scanned:
        for model_type in sorted(cached(version)):
            first_release.setdefault(model_type, version)
    return {"generated_from": scanned, "first_release": dict(sorted(first_release.items()))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--regenerate", action="store_true", help=f"rewrite {HISTORY_PATH.name} from the releases")
    parser.add_argument("--output", type=Path, default=HISTORY_PATH)
    args = parser.parse_args(argv)
    if not args.regenerate:
        parser.print_help()
        return 2
    table = history(released_versions(), ep_families)
    args.output.write_text(json.dumps(table, indent=1) + "\n")
    types, releases = len(table["first_release"]), len(table["generated_from"])
    print(f"wrote {args.output}: {types} model types over {releases} releases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
