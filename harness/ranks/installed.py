"""Where the session's installed code lives: the standard library and the installed distributions (stdlib,
platstdlib, purelib, platlib and site-packages of this interpreter, its venv and its base installation). The rank
pool's zygote imports a module for later tests' ranks only from there (harness.ranks.preload): code a test can
write (beside itself, in the working folder, in tmp, behind a sys.path entry or a .pth that points elsewhere)
never reaches the template that every later test's ranks are forked from.

A file's place is its resolved path (symlinks followed): a link in site-packages that points into a test's folder
is in that folder. The working folder and the temporary folder are places tests write: where one lies inside an
installed location it is cut out of it (one around it, as a checkout around its own .venv, is not).

harness gets no exception of its own: installed from a wheel it is in site-packages and preloaded like any
distribution; installed editable its files are the checkout, which a test can edit, so none is preloaded (the
zygote holds only the harness.ranks modules it runs, imported when it started, before the first test).
Needs only the standard library.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
import tempfile
from collections.abc import Iterable
from importlib.machinery import ModuleSpec

# Where sysconfig puts the standard library and installed distributions; not "data" or "scripts", which name
# the venv's root and its bin folder (a venv inside a checkout makes its root the checkout's own folder).
INSTALLED_PATHS = ("stdlib", "platstdlib", "purelib", "platlib")
# Modules without a file: compiled into the interpreter.
INTERPRETER_ORIGINS = ("built-in", "frozen")


def installed_roots() -> set[str]:
    """The standard library and installed-distribution folders of this interpreter, its venv and its base."""
    schemes = [sysconfig.get_paths(),
               sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})]
    roots = {scheme[key] for scheme in schemes for key in INSTALLED_PATHS if key in scheme}
    roots.update(site.getsitepackages() if hasattr(site, "getsitepackages") else ())
    if site.ENABLE_USER_SITE:
        roots.add(site.getusersitepackages())
    return roots


class InstalledLocations:
    """The installed locations, less the folders tests write in that lie inside them."""

    def __init__(self, roots: Iterable[str], written: Iterable[str]):
        self.roots = tuple(sorted({_resolved(root) for root in roots}))
        self.written = tuple(sorted(folder for folder in {_resolved(path) for path in written}
                                    if _inside(folder, self.roots)))

    @classmethod
    def of_this_interpreter(cls) -> InstalledLocations:
        return cls(installed_roots(), (os.getcwd(), tempfile.gettempdir()))

    def holds(self, path: str) -> bool:
        """`path`, resolved, is in an installed location and in no folder tests write."""
        resolved = _resolved(path)
        return _inside(resolved, self.roots) and not _inside(resolved, self.written)

    def holds_module(self, spec: ModuleSpec) -> bool:
        """The module `spec` names is installed code: compiled into the interpreter, or its file and every folder
        its submodules come from are held. A spec that names no place (a namespace of no folder, a custom loader
        without an origin) is not."""
        if spec.origin in INTERPRETER_ORIGINS:
            return True
        places = [spec.origin] if spec.has_location and spec.origin else []
        places += list(spec.submodule_search_locations or ())
        return bool(places) and all(self.holds(place) for place in places)

    def entries(self, sys_path: Iterable[str]) -> list[str]:
        """The sys.path entries that are held ('' is the working folder)."""
        return [entry for entry in sys_path if self.holds(entry or os.getcwd())]


def _resolved(path: str) -> str:
    return os.path.realpath(os.path.abspath(path))


def _inside(path: str, folders: Iterable[str]) -> bool:
    return any(path == folder or path.startswith(folder.rstrip(os.sep) + os.sep) for folder in folders)
