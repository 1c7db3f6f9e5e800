"""Which releases a package has on the configured index: their order, ranges between two of them,
and the floating versions a matrix may name (`latest`, `latest-N`).

The index is asked through pip (`pip index versions`), so the same configuration that builds
environments decides what exists: HARNESS_INDEX_URL, HARNESS_EXTRA_INDEX_URL, HARNESS_FIND_LINKS
and pip's own PIP_* variables. Pre-releases count only when asked for.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence

from packaging.version import InvalidVersion, Version

from harness.errors import ConfigError
from harness.plan.index import FLOATING, INDEX_VARIABLES, index_arguments

# pip prints the releases it found newest first on this line.
AVAILABLE = re.compile(r"^Available versions:\s*(.*)$", re.M)
# pip's warning each time it retries a request that got no answer: the one sign that the index was not reached
# (pip then says only "No matching distribution found", as for a package the index lacks).
RETRIED = re.compile(r"after connection broken by '(\w+)\((.*)\)': ")


class VersionLookupError(ConfigError):
    """The index could not say which releases a package has (unknown package, index unreachable)."""


def is_floating(value: str) -> bool:
    return FLOATING.fullmatch(value) is not None


def sort_key(version: str) -> Version:
    try:
        return Version(version)
    except InvalidVersion:
        raise ConfigError(f"{version!r}: not a PEP 440 version") from None


def ordered(versions: Sequence[str]) -> list[str]:
    """Oldest first, by PEP 440 (5.10.0 after 5.9.0; 5.0.0rc1 before 5.0.0)."""
    return sorted(dict.fromkeys(versions), key=sort_key)


def ask_pip(package: str, pre: bool) -> str:
    """pip's answer for the package, on the index that environments are built from."""
    command = [sys.executable, "-m", "pip", "index", "versions", package, "--disable-pip-version-check"]
    command += ["--pre"] if pre else []
    command += index_arguments("pip", installer_args=False)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise VersionLookupError(f"{package}: cannot ask the package index: {error}") from None
    if done.returncode != 0:
        unreachable = _unreachable_reason(done.stderr)
        if unreachable:
            raise VersionLookupError(f"{package}: cannot reach the package index ({unreachable})")
        said = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or done.stderr.splitlines()
        raise VersionLookupError(
            f"{package}: the package index has no releases for it "
            f"({(said[-1] if said else 'pip exited ' + str(done.returncode)).strip()})"
        )
    return done.stdout


def _unreachable_reason(stderr: str) -> str | None:
    """From pip's last retry warning: the error's type and its errno words or message, e.g.
    `NewConnectionError: [Errno -2] Name or service not known`; None when pip retried nothing."""
    retries = RETRIED.findall(stderr)
    if not retries:
        return None
    kind, detail = retries[-1]
    words = re.findall(r"\[Errno -?\d+\][^'\")]*", detail) or re.findall(r"'([^'<]+)'", detail)
    return f"{kind}: {words[-1].strip()}" if words else kind


def available_versions(package: str, *, pre: bool = False, ask: Callable[[str, bool], str] | None = None) -> list[str]:
    """Every release of `package` on the index, oldest first (pre-releases only with pre=True)."""
    if ask is not None:
        return _parse(package, ask(package, pre), pre)
    return list(_cached(package, pre, tuple(os.environ.get(name, "") for name in INDEX_VARIABLES)))


@functools.lru_cache(maxsize=64)
def _cached(package: str, pre: bool, _index: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(_parse(package, ask_pip(package, pre), pre))


def _parse(package: str, answer: str, pre: bool) -> list[str]:
    found = AVAILABLE.search(answer)
    listed = [v.strip() for v in found.group(1).split(",") if v.strip()] if found else []
    valid = []
    for value in listed:
        try:
            version = Version(value)
        except InvalidVersion:
            continue  # ancient releases with non-PEP 440 names cannot be pinned anyway
        if pre or not (version.is_prerelease or version.is_devrelease):
            valid.append(version.public)  # 2.13.0+cpu is the release 2.13.0, as a pin names it
    if not valid:
        raise VersionLookupError(f"{package}: the package index lists no {'' if pre else 'final '}releases")
    return ordered(valid)


def resolve_floating(
    package: str, value: str, *, pre: bool = False, ask: Callable[[str, bool], str] | None = None
) -> str:
    """`latest` is the newest release, `latest-N` the one N releases before it; anything else as given."""
    match = FLOATING.fullmatch(value)
    if not match:
        return value
    back = int(match.group(1) or 0)
    releases = available_versions(package, pre=pre, ask=ask)
    if back >= len(releases):
        raise ConfigError(f"{package} {value}: the index lists only {len(releases)} releases")
    return releases[-1 - back]


def releases_between(
    package: str, first: str, second: str, *, pre: bool = False, ask: Callable[[str, bool], str] | None = None
) -> list[str]:
    """The releases from the older of two versions to the newer, both included, oldest first.
    Either version missing from the index is bad input."""
    releases = available_versions(package, pre=pre or _is_pre(first) or _is_pre(second), ask=ask)
    for value in (first, second):
        if value not in releases:
            near = [v for v in releases if v.startswith(value.rsplit(".", 1)[0] + ".")][-5:]
            hint = f"; nearby: {', '.join(near)}" if near else ""
            raise ConfigError(f"{package} {value}: no such release on the package index{hint}")
    low, high = sorted((first, second), key=sort_key)
    kept = [v for v in releases if sort_key(low) <= sort_key(v) <= sort_key(high)]
    if not pre:  # an endpoint may itself be a pre-release; the releases between them are finals only
        kept = [v for v in kept if v in (low, high) or not _is_pre(v)]
    return kept


def _is_pre(value: str) -> bool:
    try:
        version = Version(value)
    except InvalidVersion:
        return False
    return version.is_prerelease or version.is_devrelease
