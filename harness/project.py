"""Where things are: the repository harness runs in (the project root) and the data harness ships.

Relative paths a user gives (a matrix file, ``--results`` and ``harness report``'s RESULTS, a matrix's
``suite:`` and ``install:``) resolve against the project root, the git top level of the working directory or
of the matrix file's repository, so harness does the same thing from any subfolder. The shipped matrices and
report templates are package data read through importlib.resources, so an installed harness needs no checkout.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import subprocess
from pathlib import Path


def shipped_matrices_dir() -> Path:
    return _shipped("harness._matrices", "matrices")


def shipped_reports_dir() -> Path:
    return _shipped("harness._reports", "reports")


def _shipped(package: str, checkout_folder: str) -> Path:
    """The package data of an installed harness; run from a checkout on PYTHONPATH (not installed, so the
    package-dir mapping does not exist), the same folder at the checkout's top."""
    try:
        return Path(str(importlib.resources.files(package)))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / checkout_folder


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProjectRoot:
    """The project root and how it was found, so a message about a path resolved against it can say why there."""

    path: Path
    found_as: str  # e.g. "the git top level of the working directory"
    in_git: bool


def find_project_root(matrix_file: Path | None = None) -> ProjectRoot:
    """The matrix file's repository when it is in one, else the working directory's, else the working
    directory itself."""
    if matrix_file is not None:
        top = git_toplevel(matrix_file.resolve().parent)
        if top is not None:
            return ProjectRoot(path=top, found_as=f"the git top level of {matrix_file}", in_git=True)
    top = git_toplevel(Path.cwd())
    if top is not None:
        return ProjectRoot(path=top, found_as="the git top level of the working directory", in_git=True)
    return ProjectRoot(path=Path.cwd().resolve(), found_as="the working directory: no git repository holds it",
                       in_git=False)


def project_root(matrix_file: Path | None = None) -> Path:
    return find_project_root(matrix_file).path


def git_toplevel(folder: Path) -> Path | None:
    done = git(folder, "rev-parse", "--show-toplevel")
    return Path(done.strip()).resolve() if done and done.strip() else None


def git(folder: Path, *arguments: str) -> str | None:
    """git's output in a folder, or None where git is missing, fails, or the folder is no repository."""
    try:
        done = subprocess.run(["git", "-C", str(folder), *arguments], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def resolve(path: str | Path, root: Path) -> Path:
    """An absolute path stays; a relative one is taken from the project root."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else root / path


DEFAULT_RESULTS = "results"


def results_path(value: str | Path | None, root: Path | None = None) -> Path:
    """A results folder as `harness run --results` writes it and `harness report` reads it: `results` when none
    is given, a relative path taken from the project root (`root`, else the working directory's), so both
    commands mean the same folder from any subfolder."""
    return resolve(DEFAULT_RESULTS if value is None else value, root or project_root())
