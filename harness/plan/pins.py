"""Pinned torch and transformers versions checked against the package index before anything is built:
a version that does not exist is one line naming the matrix, found in seconds (`harness matrix`, and
`harness run` for each cell it would build), not after half a minute of a failing install."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from packaging.version import InvalidVersion, Version

from harness.errors import ConfigError
from harness.plan.cells import Cell
from harness.plan.versions import VersionLookupError, available_versions

PACKAGES = ("torch", "transformers")


def missing_pins(cells: Iterable[Cell], *, ask: Callable[[str, bool], str] | None = None) -> list[str]:
    """One line per pinned version the index does not list, e.g. `torch 2.99.0 (newest: 2.13.0)`."""
    wanted = sorted({(package, getattr(cell, package)) for cell in cells for package in PACKAGES})
    problems = []
    for package, version in wanted:
        releases = available_versions(package, pre=True, ask=ask)  # a pinned pre-release is a pin too
        if not any(_same(version, release) for release in releases):
            newest = [r for r in releases if not Version(r).is_prerelease] or releases
            problems.append(f"{package} {version} is not on the package index (newest: {newest[-1]})")
    return problems


def _same(pinned: str, release: str) -> bool:
    try:
        return Version(pinned) == Version(release)
    except InvalidVersion:
        return False


def check_pins(cells: Iterable[Cell], source: str, *, ask: Callable[[str, bool], str] | None = None,
               warn: Callable[[str], None] | None = None) -> None:
    """A pin the index lacks is bad input. So is an index that cannot be asked, unless `warn` is given: then that is
    only said, since some runners and CI machines have no network and a plan must still print there."""
    try:
        problems = missing_pins(cells, ask=ask)
    except VersionLookupError as error:
        unchecked = f"{source}: the pins were not checked: {error}"
        if warn is None:
            raise VersionLookupError(unchecked) from None
        warn(unchecked)
        return
    if problems:
        raise ConfigError(f"{source}: {'; '.join(problems)}")
