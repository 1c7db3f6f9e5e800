"""What the zygote imports for later tests' ranks: of the modules the launcher names (those the ranks imported, the
modules of the functions called), only installed code (harness.ranks.installed), so the template every later
test's ranks are forked from holds what the session's environment held before its first test and nothing a test
wrote. A module a test wrote beside itself, imported in a rank, stays that rank's: later tests' ranks import it
themselves, as spawned ranks would.

Each name is resolved as a rank resolves it (the launcher's sys.path), and imported only when that file is
installed code; while it imports, sys.path holds only installed entries, so what it imports in turn comes from
installed code too. What still arrives from elsewhere (a meta-path finder that maps a name to a checkout) makes
the template unfit: the zygote then refuses to fork and the launcher starts one that imports less.
Needs only the standard library.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import sys
import types
from importlib.machinery import ModuleSpec

from harness.ranks.installed import INTERPRETER_ORIGINS, InstalledLocations

SHOWN = 3  # names a line shows before "and N more"


@dataclasses.dataclass(frozen=True)
class NotPreloaded:
    """The zygote to the launcher: modules the ranks imported that it left out, as no installed code."""

    modules: list[str]


@dataclasses.dataclass(frozen=True)
class PreloadOutcome:
    left_out: list[str]  # named, resolved, and not installed code
    unfit: str | None  # why the template may fork no more, or None


class Preloader:
    def __init__(self, locations: InstalledLocations):
        self.locations = locations

    def run(self, modules: list[str], sys_path: list[str]) -> PreloadOutcome:
        """Import the installed ones of `modules` (a failing import is the rank's to report: it imports it again);
        sys.path is `sys_path` after."""
        importlib.invalidate_caches()  # a file written since the last preload is found
        before = set(sys.modules)
        installed_path = self.locations.entries(sys_path)
        left_out = []
        try:
            for name in modules:
                if name in sys.modules:
                    continue
                sys.path[:] = sys_path
                spec = _spec(name)
                if spec is None:
                    continue  # its package stayed out, or it cannot be found: the rank imports it itself
                if not self.locations.holds_module(spec):
                    left_out.append(name)
                    continue
                sys.path[:] = installed_path
                with contextlib.suppress(BaseException):
                    importlib.import_module(name)
        finally:
            sys.path[:] = sys_path
        strays = [name for name in sys.modules if name not in before and not self._installed(sys.modules[name])]
        unfit = None
        if strays:
            unfit = (f"the zygote's preloads imported {words(strays)} from outside the installed packages and the "
                     "standard library")
        return PreloadOutcome(left_out, unfit)

    def _installed(self, module: object) -> bool:
        """A loaded module came from installed code, or from no file at all (compiled in, or made by code)."""
        spec = getattr(module, "__spec__", None)
        origin = getattr(spec, "origin", None) if spec is not None else getattr(module, "__file__", None)
        if not isinstance(module, types.ModuleType) or not isinstance(origin, str) or origin in INTERPRETER_ORIGINS:
            return True
        if spec is not None and not spec.has_location:
            return True
        return self.locations.holds(origin)


def _spec(name: str) -> ModuleSpec | None:
    """The spec a rank would import `name` from; None where its package is not loaded (it stayed out) or it cannot
    be found. Finding a submodule imports nothing: its package is loaded already."""
    package = name.rpartition(".")[0]
    if package and package not in sys.modules:
        return None
    try:
        return importlib.util.find_spec(name)
    except Exception:  # a finder's error: the rank meets it itself
        return None


def words(names: list[str]) -> str:
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more
