"""The family registry is the one place that names a family: suite code reads families, roles and quirks from
it, so adding a family (or a release declaring one) never means editing the checks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from models import families

SUITE_DIR = Path(families.__file__).resolve().parents[1]  # tests/gpu: the suite's code, its tests included
# Data tables that name families on purpose: the registry itself and the known upstream bugs (with their
# standalone reproductions, which must not import the suite).
REGISTRIES = {"models/families.py"}
TABLES = (Path("upstream/table"), Path("upstream/repros"))  # the known-bugs table's groups and the reproducers


def _family_names() -> set[str]:
    return (
        set(families.MECHANICS)
        | set(families.OVERRIDES)
        | set(families.NOT_COVERED)
        | set(families.declared_ep_families())
        | {name for names in families.ROLES.values() for name in names}
    )


def family_names_in_code(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every string literal in `source` that is a family name or contains one as a word."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            words = set(node.value.replace("[", " ").replace("]", " ").replace("-", " ").replace(",", " ").split())
            found += [(node.lineno, name) for name in sorted(names & words)]
    return found


def _scanned(path: Path) -> bool:
    return path.as_posix() not in REGISTRIES and not any(folder in path.parents for folder in TABLES)


def test_no_family_name_is_written_in_suite_code_outside_the_registry():
    names = _family_names()
    offenders = [
        f"{path.relative_to(SUITE_DIR)}:{line}: {name}"
        for path in sorted(SUITE_DIR.rglob("*.py"))
        if _scanned(path.relative_to(SUITE_DIR))
        for line, name in family_names_in_code(path.read_text(), names)
    ]
    assert not offenders, "family names outside tests/gpu/models/families.py: " + "; ".join(offenders)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('CASES = ["alpha_moe", "beta"]', [(1, "alpha_moe"), (1, "beta")]),
        ('run("ep", "gamma_oss-eager-2")', [(1, "gamma_oss")]),
        ('# alpha_moe in a comment\nx = "an alpha_moex name"', []),
    ],
)
def test_the_scan_finds_names_in_string_literals_only(source, expected):
    assert sorted(family_names_in_code(source, {"alpha_moe", "beta", "gamma_oss"})) == expected


def test_every_role_names_a_mechanics_family():
    for role, names in families.ROLES.items():
        assert names, role
        assert set(names) <= set(families.MECHANICS), f"{role}: {names}"


def test_every_override_and_uncovered_family_is_declared_by_the_installed_release():
    """A stale entry (a family the release no longer declares) is named, not carried silently; one for a family a
    newer release declares first (models/ep_plan_history.json) waits for it."""
    from loading import tf_adapter
    from models import ep_floors
    from packaging.version import Version

    declared = set(families.declared_ep_families())
    later = {name for name in set(families.OVERRIDES) | set(families.NOT_COVERED)
             if (first := ep_floors.first_ep_release(name)) and Version(first) > tf_adapter.transformers_version()}
    stale = (set(families.OVERRIDES) | set(families.NOT_COVERED)) - declared - later
    assert not stale, f"entries for families transformers no longer declares: {sorted(stale)}"
