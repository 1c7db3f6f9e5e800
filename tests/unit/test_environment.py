"""The environment variables: every `HARNESS_*` name that harness/ or the suite (tests/gpu/) mentions is an entry of
harness.environment, every entry is named somewhere outside it, and each module an entry says reads or sets it does.

A module names a variable by its literal name (code, a comment, a help text) or through the registry's constant
(`from harness.environment import CPU_RANKS_ENV`, `environment.CPU_RANKS_ENV`)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from harness import environment

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = ROOT / "harness" / "environment.py"
SCANNED = ("harness", "tests/gpu")
# Reproducers written to stand alone and run by hand, outside harness and the suite.
NOT_SCANNED = ("tests/gpu/upstream/repros/",)
CACHES = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
# `@HARNESS_REF@` is a placeholder of the starter templates (harness.github.adopt fills it in), not a variable.
NAME = re.compile(r"(?<![@\w])HARNESS_[A-Z0-9_]+")
CONSTANTS = {attribute: value for attribute, value in vars(environment).items() if attribute.endswith("_ENV")}


def named(text: str, python: bool = True) -> set[str]:
    """The variables `text` names: literally, or through harness.environment's constants."""
    names = set(NAME.findall(text))
    if not python:
        return names
    tree = ast.parse(text)
    modules = set()  # what harness.environment is called in this file
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "harness.environment":
            names |= {CONSTANTS[alias.name] for alias in node.names if alias.name in CONSTANTS}
        if isinstance(node, ast.ImportFrom) and node.module == "harness":
            modules |= {alias.asname or alias.name for alias in node.names if alias.name == "environment"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules \
                and node.attr in CONSTANTS:
            names.add(CONSTANTS[node.attr])
    return names


def scanned_files() -> Iterator[tuple[str, str]]:
    """(path from the repository root, text) of every text file under harness/ and tests/gpu/ but the registry."""
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            relative = path.relative_to(ROOT).as_posix()
            if not path.is_file() or path == REGISTRY or CACHES & set(path.parts) or relative.startswith(NOT_SCANNED):
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue  # not text
            yield relative, text


def mentions() -> dict[str, set[str]]:
    """Each scanned file's named variables, by path."""
    return {relative: named(text, relative.endswith(".py")) for relative, text in scanned_files()}


def module_path(module: str) -> Path:
    """A registry entry's reader or writer: harness's dotted module, or the suite's path from the repository root."""
    if "/" in module:
        return ROOT / module
    base = ROOT.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def test_every_variable_named_under_harness_and_the_suite_is_registered():
    registered = {variable.name for variable in environment.VARIABLES}
    unknown = sorted(f"{name} in {relative}" for relative, names in mentions().items() for name in names - registered)
    assert not unknown, "not in harness/environment.py:\n" + "\n".join(unknown)


def test_every_registered_variable_is_named_outside_the_registry():
    named_anywhere = set().union(*mentions().values())
    unused = [variable.name for variable in environment.VARIABLES if variable.name not in named_anywhere]
    assert not unused, f"nothing under {' or '.join(SCANNED)} reads or sets: {', '.join(unused)}"


def test_each_reader_and_writer_an_entry_lists_names_its_variable():
    wrong = []
    for variable in environment.VARIABLES:
        for module in (*variable.read_by, *variable.written_by):
            path = module_path(module)
            if not path.is_file():
                wrong.append(f"{variable.name}: {module}: no such module")
            elif variable.name not in named(path.read_text(encoding="utf-8"), path.suffix == ".py"):
                wrong.append(f"{variable.name}: {module} does not name it")
    assert not wrong, "\n".join(wrong)


def test_the_registry_has_one_entry_per_constant_and_says_who_sets_and_reads_each():
    names = [variable.name for variable in environment.VARIABLES]
    assert len(names) == len(set(names))
    assert sorted(CONSTANTS.values()) == sorted(names)
    for attribute, value in CONSTANTS.items():
        assert value == "HARNESS_" + attribute.removesuffix("_ENV"), attribute
    for variable in environment.VARIABLES:
        assert variable.set_by in (environment.USER, environment.HARNESS), variable.name
        assert variable.what.endswith(".") and variable.default, variable.name
        if variable.set_by == environment.USER:
            assert variable.read_by, f"{variable.name}: a variable you set needs a reader"
        else:
            assert variable.written_by, f"{variable.name}: a variable harness sets names where"


def test_the_scan_sees_a_literal_name_and_a_constant_and_skips_template_placeholders():
    source = ('from harness.environment import CPU_RANKS_ENV as COUNT\nfrom harness import environment\n'
              'X = environment.HUB_ENV\n# HARNESS_NOT_A_VARIABLE=1\nTEMPLATE = "@HARNESS_REF@"\n')
    assert named(source) == {"HARNESS_CPU_RANKS", "HARNESS_HUB", "HARNESS_NOT_A_VARIABLE"}
    assert named("uses: @HARNESS_REPOSITORY@/x.yml@@HARNESS_REF@ with $HARNESS_ENV_DIR", python=False) == {
        "HARNESS_ENV_DIR"}
