"""Read `results/<cell-id>/` folders into one frozen `ResultSet`.

Every file in a cell folder may be missing, empty, malformed, huge or hostile: what cannot be read becomes
a `Problem` value on its cell (and, for junit.xml or an unreadable folder, an *errored* cell), never an
exception. Only regular files are opened, each read up to its size cap (`files`), and no link below the paths
given is followed (a cell or artifact folder that is a symbolic link is an errored row naming it); numbers are
normalized and texts capped and made valid UTF-8 (`values`); junit.xml is parsed by `junit`, env.json and
memory.json by `records`. Only bad input from the user (a path that does not exist, a folder that holds no
cells) raises `ConfigError`.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from harness.contract import (
    CONTRACT_FILES,
    ENV_JSON,
    ERROR_ENVIRONMENT,
    ERROR_KINDS,
    ERRORS_BEFORE_PYTEST,
    INSTALL_LOG,
    JUNIT_XML,
    MEMORY_JSON,
    PYTEST_LOG,
    RUNNING_TEST,
    STATUS_ERRORED,
    STATUS_FAILED,
    STATUS_NOT_RUN,
    STATUSES,
)
from harness.errors import ConfigError
from harness.results.files import read_json, read_log_tail, read_running_test
from harness.results.junit import read_junit, with_stopped_test
from harness.results.model import (
    CellResult,
    CellStatus,
    Counts,
    Problem,
    ResultSet,
    SuiteInfo,
    natural_key,
    nothing_distributed_ran,
)
from harness.results.records import PYTEST_ARGS_CHARS, PYTEST_ARGS_MAX, Fields, cell_info, read_memory, reproduce
from harness.results.values import clean_text, seconds_between


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while a large result set is built or rendered: it makes no
    garbage cycles, and each full collection would walk all of its (up to millions of) objects again."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# ---------------------------------------------------------------------------------------------
# Finding cell folders


def load_results(paths: Iterable[str | Path]) -> ResultSet:
    """Read every cell folder under `paths`: a cell folder itself, a folder of cell folders, or a
    folder of downloaded artifacts holding cell folders one level down."""
    with paused_gc():
        return _load_results(paths)


def _load_results(paths: Iterable[str | Path]) -> ResultSet:
    cells = sorted((read_cell(folder) for folder in cell_folders(paths)), key=lambda cell: natural_key(cell.id))
    return ResultSet(tuple(_flag_duplicate_ids(cells)))


def cell_folders(paths: Iterable[str | Path]) -> list[Path]:
    """The cell folders under `paths`, each once; a path that is no folder, or holds no cell, is a ConfigError."""
    folders: dict[Path, None] = {}
    for path in map(Path, paths):
        if not path.is_dir():
            raise ConfigError(f"results path {path} is not a folder")
        try:
            found = find_cell_folders(path)
        except OSError as error:
            raise ConfigError(f"results path {path}: cannot list it: {error.strerror or error}") from None
        if not found:
            raise ConfigError(f"no cell folders under {path} (none holds {', '.join(CONTRACT_FILES)})")
        folders.update(dict.fromkeys(folder.absolute() for folder in found))
    return list(folders)


def _flag_duplicate_ids(cells: list[CellResult]) -> list[CellResult]:
    # Two folders for one cell (an artifact downloaded twice): keep both rows, say so on the second.
    first_folder: dict[str, str] = {}
    flagged = []
    for cell in cells:
        if cell.id in first_folder:
            problem = Problem(ENV_JSON, f"cell {cell.id} also read from {first_folder[cell.id]}")
            cell = replace(cell, problems=(*cell.problems, problem))
        first_folder.setdefault(cell.id, cell.folder)
        flagged.append(cell)
    return flagged


def find_cell_folders(path: Path) -> list[Path]:
    """`path` where it is a cell folder; else the cell folders in it and in its artifact folders. A symbolic link
    at either level is listed as it is, never followed: read_cell makes it an errored row naming it."""
    if _is_cell_folder(path):
        return [path]
    found = []
    for child in _subfolders(path):
        if child.is_symlink() or _is_cell_folder(child):
            found.append(child)
        else:  # an artifact folder holding cell folders
            found.extend(grandchild for grandchild in _subfolders(child)
                         if grandchild.is_symlink() or _is_cell_folder(grandchild))
    return found


def _subfolders(path: Path) -> list[Path]:
    """The folders and the symbolic links in `path`, by lstat: a link to a folder is not taken for one."""
    try:
        with os.scandir(path) as entries:
            return sorted(Path(entry.path) for entry in entries
                          if entry.is_symlink() or entry.is_dir(follow_symlinks=False))
    except OSError:
        return []  # an artifact folder nobody may list: _is_cell_folder made it a row already


def _is_cell_folder(path: Path) -> bool:
    try:
        return any((path / name).is_file() for name in CONTRACT_FILES)
    except OSError:
        return True  # unreadable: one errored row that says why, not a crash and not a silent gap


# ---------------------------------------------------------------------------------------------
# One cell


def read_cell(folder: Path) -> CellResult:
    try:
        if folder.is_symlink():  # checked again here, by lstat: whatever listed the folder
            # The folder is the tested code's: a link would lend its row files from anywhere on the machine.
            return _unread_cell(folder, "the cell folder is a symbolic link; not followed")
        return _read_cell(folder)
    except (OSError, RecursionError, MemoryError, ValueError) as error:
        # What the per-file reads below do not foresee still costs one row, never the report.
        why = f"unreadable folder: {type(error).__name__}: {getattr(error, 'strerror', None) or error}"
        return _unread_cell(folder, why)


def _unread_cell(folder: Path, why: str) -> CellResult:
    """The errored row of a folder none of whose files were read: named by the folder, saying why."""
    info = cell_info({}, folder.name, [])
    return CellResult(
        info=info,
        status=CellStatus.ERRORED,
        reason=clean_text(why),
        folder=clean_text(str(folder), len(str(folder))),
        reproduce=reproduce(None, info, []),
    )


def _read_cell(folder: Path) -> CellResult:
    problems: list[Problem] = []
    env = read_json(folder / ENV_JSON, problems)
    memory_doc = read_json(folder / MEMORY_JSON, problems)
    junit = read_junit(folder / JUNIT_XML)
    env_fields = Fields(ENV_JSON, env, problems)
    info = cell_info(env_fields.mapping("cell"), folder.name, problems)
    env_status = env_fields.choice("status", STATUSES)
    exit_code = env_fields.integer("exit_code")
    tests = with_stopped_test(junit, read_running_test(folder / RUNNING_TEST))
    status, reason = _cell_status(
        env_status, env_fields.text("error"), exit_code, junit.problem, Counts.of(tests), nothing_distributed_ran(tests)
    )
    error_kind = env_fields.choice("error_kind", ERROR_KINDS) if status is CellStatus.ERRORED else None
    # A cell errored before pytest started (its packages, its GPUs) has no pytest files to miss: its reason says why.
    if junit.problem and not (error_kind in ERRORS_BEFORE_PYTEST and junit.missing):
        problems.append(junit.problem)
    problems.extend(junit.notes)
    errored_log = _errored_log(error_kind) if status is CellStatus.ERRORED else None
    memory, memory_note = read_memory(memory_doc, problems)
    duration_s = env_fields.number("duration_s")
    return CellResult(
        info=info,
        status=status,
        reason=reason,
        error_kind=error_kind,
        tests=tests,
        suite=SuiteInfo.of(junit.suite_properties),
        memory=memory,
        memory_note=memory_note,
        duration_s=duration_s if duration_s is not None else junit.time_s,
        wall_s=seconds_between(env_fields.moment("start"), env_fields.moment("end")),
        recorded_gpus=sum(isinstance(gpu, dict) for gpu in env_fields.items("gpus")),
        versions=tuple(sorted(env_fields.string_map("versions").items())),
        exit_code=exit_code,
        git_sha=env_fields.text("git_sha"),
        git_dirty=env_fields.boolean("git_dirty"),
        trigger_sha=env_fields.text("trigger_sha"),
        host=env_fields.text("host"),
        runner=env_fields.text("runner"),
        driver=env_fields.text("driver"),
        reproduce=reproduce(env_fields.text("matrix_reference"), info, problems),
        pytest_args=env_fields.command_words("pytest_args", PYTEST_ARGS_MAX, PYTEST_ARGS_CHARS),
        log_tail=read_log_tail(folder / errored_log, problems) if errored_log else None,
        problems=tuple(problems),
        folder=clean_text(str(folder), len(str(folder))),
    )


def _errored_log(error_kind: str | None) -> str | None:
    """The log whose tail an errored cell shows: the install's where its packages failed, none where pytest never
    started for another reason (its GPUs were busy), else pytest's."""
    if error_kind == ERROR_ENVIRONMENT:
        return INSTALL_LOG
    return None if error_kind in ERRORS_BEFORE_PYTEST else PYTEST_LOG


def _cell_status(
    env_status: str | None,
    env_error: str | None,
    exit_code: int | None,
    junit_problem: Problem | None,
    counts: Counts,
    nothing_distributed: bool,
) -> tuple[CellStatus, str | None]:
    if env_status == STATUS_ERRORED:
        return CellStatus.ERRORED, env_error or "env.json says errored and gives no reason"
    if junit_problem:
        return CellStatus.ERRORED, str(junit_problem)
    if env_status is None:  # harness writes a status on every way out: without one the run never finished
        return CellStatus.ERRORED, "env.json gives no status: the run did not finish (interrupted or killed)"
    if counts.failed or counts.errored:
        return CellStatus.FAILED, None
    if env_status == STATUS_FAILED:
        return CellStatus.FAILED, f"pytest exited with code {exit_code} but junit.xml records no failure"
    # Either one saying so is enough: a cell that ran nothing distributed is never read as green.
    if env_status == STATUS_NOT_RUN or nothing_distributed:
        return CellStatus.NOT_RUN, None
    return CellStatus.PASSED, None
