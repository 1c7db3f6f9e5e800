"""A module written into this interpreter's site-packages, as a distribution installs one: the only place the rank
pool's zygote imports modules from (harness.ranks.installed), so the tests of what an installed module can do to
the zygote write theirs there. Each gets a name of its own (tests of several sessions may run at once in one
environment), and is removed with its bytecode when the test ends."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import sysconfig
import uuid
from pathlib import Path
from types import ModuleType

import pytest


def write_installed_module(request: pytest.FixtureRequest, stem: str, source: str) -> str:
    """`source` as a module in site-packages; its name (not imported here)."""
    folder = Path(sysconfig.get_paths()["purelib"])
    if not os.access(folder, os.W_OK):
        pytest.skip(f"needs a writable site-packages ({folder}) to install a module in")
    name = f"{stem}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    path = folder / f"{name}.py"
    path.write_text(source)
    request.addfinalizer(lambda: _remove(name, path))
    importlib.invalidate_caches()
    return name


def import_installed_module(request: pytest.FixtureRequest, stem: str, source: str) -> ModuleType:
    """`source` as a module in site-packages, imported here: the ranks import it by its name."""
    return importlib.import_module(write_installed_module(request, stem, source))


def _remove(name: str, path: Path) -> None:
    path.unlink(missing_ok=True)
    Path(importlib.util.cache_from_source(str(path))).unlink(missing_ok=True)
    sys.modules.pop(name, None)
