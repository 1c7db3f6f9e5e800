"""`harness known-bugs verify RESULTS...`: keep each known-bugs entry's newest release seen up to date from results.

The suite's table (tests/gpu/upstream/known_bugs.py) gives each entry a range that starts at the first bad release
and stays open while the bug is live; the newest releases it was seen on live beside it in a JSON file
(tests/gpu/upstream/known_bugs_verified.json), so no range is capped at the last release someone checked. A case that
failed the way its entry says carries the entry's key (contract.KNOWN_BUG) in junit.xml; this command reads those
keys with each cell's transformers and torch from env.json and moves the entry's verified releases forward, never
back. A covered case that passed (contract.KNOWN_BUG_FIXED) is listed: closing a range is a person's edit of the
table (`<FIRST_GOOD`), not this command's.

Results are untrusted: a key the table does not hold is reported and ignored, and a version that is not PEP 440 is
never written.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from harness.errors import ConfigError
from harness.project import find_project_root
from harness.results import CellResult, Outcome, load_results
from harness.results.files import write_json_whole

DEFAULT_TABLE = Path("tests") / "gpu" / "upstream" / "known_bugs_verified.json"
PACKAGES = ("transformers", "torch")
TABLE_SCHEMA = 1


@dataclass(frozen=True, slots=True)
class Sighting:
    """One case in one cell: which entry, and on which releases."""

    key: str
    cell_id: str
    test_id: str
    versions: Mapping[str, str]  # package -> release, local tag stripped (2.13.0, not 2.13.0+cpu)


@dataclass(frozen=True, slots=True)
class Change:
    key: str
    package: str
    before: str | None
    after: str


def release_of(version: str | None) -> str | None:
    """A PEP 440 release without its local tag, or None for what is not one."""
    if not version:
        return None
    try:
        return str(Version(version.split("+", 1)[0]))
    except InvalidVersion:
        return None


def cell_releases(cell: CellResult) -> dict[str, str]:
    versions = dict(cell.versions)
    releases = {package: release_of(versions.get(package)) for package in PACKAGES}
    return {package: release for package, release in releases.items() if release is not None}


def sightings(cells: Iterable[CellResult]) -> tuple[list[Sighting], list[Sighting]]:
    """The cases an entry explained (still present) and the covered cases that passed (fixed upstream)."""
    present: list[Sighting] = []
    fixed: list[Sighting] = []
    for cell in cells:
        releases = cell_releases(cell)
        for test in cell.tests:
            if test.outcome is Outcome.XFAILED:
                present += [Sighting(key, cell.id, test.test_id, releases) for key in test.known_bug]
            if test.known_bug_fixed:
                fixed += [Sighting(key, cell.id, test.test_id, releases) for key in test.known_bug_fixed]
    return present, fixed


def read_table(path: Path) -> dict[str, dict[str, str]]:
    """The verified-releases file: {"schema": 1, "entries": {key: {"transformers": V, "torch": V}}}; a new entry's
    record starts empty ({}), for this command to fill from the first results that show it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file (the known bugs' verified releases)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(f"{path}: not readable as JSON: {error}") from None
    if not isinstance(data, dict) or data.get("schema") != TABLE_SCHEMA or not isinstance(data.get("entries"), dict):
        raise ConfigError(f"{path}: expected {{\"schema\": {TABLE_SCHEMA}, \"entries\": {{KEY: {{...}}}}}}")
    entries: dict[str, dict[str, str]] = {}
    for key, seen in data["entries"].items():
        if not isinstance(seen, dict) or set(seen) - set(PACKAGES):
            raise ConfigError(f"{path}: entries.{key}: expected an object of {', '.join(PACKAGES)} releases")
        for package, version in seen.items():
            if not isinstance(version, str) or release_of(version) != version:
                raise ConfigError(f"{path}: entries.{key}.{package}: {version!r} is not a release like 5.24.0")
        entries[key] = dict(seen)
    return entries


def write_table(path: Path, entries: Mapping[str, Mapping[str, str]]) -> None:
    """Whole or not at all (results.files.write_json_whole): a reader never sees half a table."""
    write_json_whole(path, {"schema": TABLE_SCHEMA,
                            "entries": {key: dict(sorted(entries[key].items())) for key in sorted(entries)}})


def advance(entries: Mapping[str, Mapping[str, str]], present: Iterable[Sighting]) -> tuple[dict, list[Change]]:
    """Each entry's releases moved forward to the newest it was seen on; never back."""
    updated = {key: dict(seen) for key, seen in entries.items()}
    changes: dict[tuple[str, str], Change] = {}
    for sighting in present:
        if sighting.key not in updated:
            continue
        for package, release in sighting.versions.items():
            before = updated[sighting.key].get(package)
            if before is None or Version(release) > Version(before):
                updated[sighting.key][package] = release
                first = changes.get((sighting.key, package))
                changes[(sighting.key, package)] = Change(sighting.key, package,
                                                          first.before if first else before, release)
    return updated, sorted(changes.values(), key=lambda change: (change.key, change.package))


def command(args: argparse.Namespace) -> int:
    table = Path(args.table) if args.table else find_project_root().path / DEFAULT_TABLE
    entries = read_table(table)
    results = load_results(args.results)
    if not results.cells:
        raise ConfigError(f"no cell folders under {', '.join(args.results)}")
    present, fixed = sightings(results.cells)
    updated, changes = advance(entries, present)
    for key in sorted({sighting.key for sighting in present + fixed} - set(entries)):
        print(f"ignored: the results name {key!r}, which {table} does not hold")
    for change in changes:
        print(f"{change.key}: {change.package} {change.before or '(none)'} -> {change.after}")
    for key in sorted({sighting.key for sighting in fixed}):
        seen = next(sighting for sighting in fixed if sighting.key == key)
        releases = ", ".join(f"{package} {release}" for package, release in sorted(seen.versions.items()))
        print(f"fixed upstream: {key} passed on {releases} ({seen.test_id} in {seen.cell_id}): close its range "
              "in tests/gpu/upstream/known_bugs.py")
    matched = len({sighting.key for sighting in present} & set(entries))
    print(f"{len(present)} cases matched {matched} entries; {len(changes)} releases moved forward"
          + (" (dry run: nothing written)" if args.dry_run else f" in {table}" if changes else ""))
    if changes and not args.dry_run:
        write_table(table, updated)
    return 0
