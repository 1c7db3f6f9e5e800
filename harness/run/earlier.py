"""The results folder holds one run: what an earlier run left there is kept aside, never deleted.

Before the first cell writes, `keep_aside` moves the earlier run into `<results>/.earlier/<start>/`: every entry
a report of the results folder would read as cells (a cell folder, or a folder of them such as downloaded
artifacts) and anything named as a cell of this run. <start> is when that run began (UTC, `20260105T101500Z`,
from its env.json; the folder's time where none says). A report reads two levels down, so a kept run is never
mixed into the current one; `harness report <results>/.earlier/<start>` renders it. harness removes no kept run:
`rm -r <results>/.earlier` does.

When the run stops before any of its cells has a folder (a harness failure, an interruption), `putting_back`
returns the earlier run to where it was. Every move is a rename between folders opened without following a
symbolic link: a link is moved as the link, and nothing outside the results folder is touched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from harness.cell.preflight import earlier_was_full_run
from harness.contract import EARLIER_FOLDER, ENV_JSON
from harness.errors import ConfigError
from harness.results import find_cell_folders
from harness.results.files import read_json
from harness.results.values import utc_moment

KEPT_FOLDER = EARLIER_FOLDER  # in the results folder: one folder per kept run
STAMP_FORMAT = "%Y%m%dT%H%M%SZ"  # sorts by time, and no colon (artifact names and some file systems refuse one)
NAMES_SHOWN = 5

_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclasses.dataclass(frozen=True, kw_only=True)
class KeptRun:
    """What `keep_aside` moved: `names` from `results_root` into `folder` (None: the folder held no earlier run)."""

    results_root: Path
    folder: Path | None = None
    names: tuple[str, ...] = ()
    made_kept_root: bool = False  # this run made <results>/.earlier: it goes again when the run is put back


def earlier_run(results_root: Path, cell_ids: Iterable[str]) -> list[str]:
    """The names in the results folder that an earlier run left: what a report of the folder reads as cells, and
    whatever stands where a cell of this run writes its folder."""
    if not results_root.is_dir():
        return []
    read = {folder.relative_to(results_root).parts[0] for folder in find_cell_folders(results_root)
            if folder != results_root}
    taken = {cell_id for cell_id in cell_ids if os.path.lexists(results_root / cell_id)}
    return sorted((read | taken) - {KEPT_FOLDER})


def run_started(results_root: Path, names: Iterable[str]) -> str:
    """When the earlier run began, as a folder name: its cells' earliest env.json `start`, else the newest time
    one of its entries was changed."""
    names = list(names)
    starts = [moment for name in names for folder in _cells_under(results_root / name)
              if (moment := utc_moment(read_json(folder / ENV_JSON, []).get("start"))) is not None]
    if starts:
        return min(starts).strftime(STAMP_FORMAT)
    changed = max((results_root / name).lstat().st_mtime for name in names)
    return datetime.datetime.fromtimestamp(changed, datetime.timezone.utc).strftime(STAMP_FORMAT)


def describe_plan(results_root: Path, cell_ids: Iterable[str]) -> str | None:
    """For a dry run: what this run would keep aside, in one line; None when nothing."""
    names = earlier_run(results_root, cell_ids)
    if not names:
        return None
    where = results_root / KEPT_FOLDER / run_started(results_root, names)
    return f"earlier run: {_count(names)} would be kept aside in {where}/: {_shown(names)}"


def keep_aside(results_root: Path, cell_ids: Iterable[str], pytest_args: list[str], results_option: str,
               say: Callable[[str], None] = print) -> KeptRun:
    """Move the earlier run out of the way of this one, saying where; say when a selection (`-- -k ...`) takes the
    place of a full run's results."""
    cell_ids = list(cell_ids)
    names = earlier_run(results_root, cell_ids)
    if not names:
        return KeptRun(results_root=results_root)
    full_runs = [cell_id for cell_id in cell_ids if pytest_args and earlier_was_full_run(results_root / cell_id)]
    kept_root = results_root / KEPT_FOLDER
    with _opened(results_root) as root_fd:
        made_kept_root = _make_folder(root_fd, KEPT_FOLDER, kept_root, results_option)
        with _opened(KEPT_FOLDER, root_fd, kept_root, results_option) as kept_fd:
            stamp = _new_stamp_folder(kept_fd, run_started(results_root, names), kept_root, results_option)
            kept_folder = kept_root / stamp
            kept = KeptRun(results_root=results_root, folder=kept_folder, names=tuple(names),
                           made_kept_root=made_kept_root)
            try:
                with _opened(stamp, kept_fd, kept_folder, results_option) as stamp_fd:
                    _move_all(names, root_fd, stamp_fd, kept, results_option)
            except ConfigError:  # nothing moved: the folders made for it go again (rmdir: only when empty)
                with contextlib.suppress(OSError):
                    os.rmdir(stamp, dir_fd=kept_fd)
                if made_kept_root:
                    with contextlib.suppress(OSError):
                        os.rmdir(KEPT_FOLDER, dir_fd=root_fd)
                raise
    say(f"kept {_count(names)} of an earlier run aside in {kept_folder}/: {_shown(names)} (a results folder holds "
        f"one run; rm -r {kept_root} removes every kept run)")
    for cell_id in full_runs:
        say(f"{cell_id}: this run of pytest {' '.join(pytest_args)} takes the place of its full results, kept in "
            f"{kept_folder / cell_id}")
    return kept


@contextlib.contextmanager
def putting_back(kept: KeptRun, cell_ids: Iterable[str], say: Callable[[str], None] = print) -> Iterator[None]:
    """Put the earlier run back where it was when the run stops, raising, before any of its cells has a folder."""
    try:
        yield
    except BaseException:
        if kept.names and not any(os.path.lexists(kept.results_root / cell_id) for cell_id in cell_ids):
            put_back(kept, say)
        raise


def put_back(kept: KeptRun, say: Callable[[str], None] = print) -> None:
    """Return the kept entries to the results folder; one whose name is taken again meanwhile stays kept. Only the
    folders keep_aside made are removed, and only when empty."""
    assert kept.folder is not None
    returned = []
    try:
        with _opened(kept.results_root) as root_fd, \
                _opened(KEPT_FOLDER, root_fd, kept.folder.parent, "--results") as kept_fd, \
                _opened(kept.folder.name, kept_fd, kept.folder, "--results") as stamp_fd:
            for name in kept.names:
                if os.path.lexists(kept.results_root / name):
                    continue
                os.rename(name, name, src_dir_fd=stamp_fd, dst_dir_fd=root_fd)
                returned.append(name)
            with contextlib.suppress(OSError):  # not empty: something stayed kept
                os.rmdir(kept.folder.name, dir_fd=kept_fd)
            if kept.made_kept_root:
                with contextlib.suppress(OSError):
                    os.rmdir(KEPT_FOLDER, dir_fd=root_fd)
    except (OSError, ConfigError) as error:
        say(f"harness: warning: cannot put the earlier run back from {kept.folder}: "
            f"{getattr(error, 'strerror', None) or error}; it is kept there")
        return
    if returned:
        left = f"; {len(kept.names) - len(returned)} stay in {kept.folder}" if len(returned) < len(kept.names) else ""
        say(f"put {_count(returned)} of the earlier run back in {kept.results_root}: this run wrote no cell folder"
            f"{left}")


def _move_all(names: list[str], root_fd: int, stamp_fd: int, kept: KeptRun, results_option: str) -> None:
    """All or none: a move that fails returns the ones before it."""
    moved: list[str] = []
    for name in names:
        try:
            os.rename(name, name, src_dir_fd=root_fd, dst_dir_fd=stamp_fd)
        except OSError as error:
            for back in reversed(moved):
                os.rename(back, back, src_dir_fd=stamp_fd, dst_dir_fd=root_fd)
            raise ConfigError(f"{results_option}: cannot keep {kept.results_root / name} of an earlier run aside "
                              f"in {kept.folder}: {error.strerror or error}") from None
        moved.append(name)


@contextlib.contextmanager
def _opened(name: str | Path, dir_fd: int | None = None, shown: Path | None = None,
            results_option: str = "--results") -> Iterator[int]:
    """A folder's descriptor; `name` inside `dir_fd` is never a symbolic link followed."""
    try:
        flags = _FOLDER_FLAGS if dir_fd is not None else os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
        descriptor = os.open(name, flags, dir_fd=dir_fd)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ConfigError(f"{results_option}: {shown or name} is not a folder (a symbolic link or a file); "
                              f"harness keeps earlier runs in a folder of that name: move it away") from None
        raise ConfigError(f"{results_option}: cannot open {shown or name}: {error.strerror or error}") from None
    try:
        yield descriptor
    finally:
        os.close(descriptor)


def _make_folder(dir_fd: int, name: str, shown: Path, results_option: str) -> bool:
    """Whether this made it (False: it was there)."""
    try:
        os.mkdir(name, dir_fd=dir_fd)
    except FileExistsError:
        return False
    except OSError as error:
        raise ConfigError(f"{results_option}: cannot make {shown}: {error.strerror or error}") from None
    return True


def _new_stamp_folder(kept_fd: int, stamp: str, kept_root: Path, results_option: str) -> str:
    """A folder of its own for the kept run: `<stamp>`, else `<stamp>-2`, `-3`, ..."""
    for attempt in range(1, 1000):
        name = stamp if attempt == 1 else f"{stamp}-{attempt}"
        if _make_folder(kept_fd, name, kept_root / name, results_option):
            return name
    raise ConfigError(f"{results_option}: {kept_root} holds 999 runs named {stamp}; remove some")


def _cells_under(path: Path) -> list[Path]:
    try:
        return [] if path.is_symlink() else find_cell_folders(path)
    except OSError:
        return []


def _count(names: list[str]) -> str:
    return f"{len(names)} folder{'s' if len(names) != 1 else ''}"


def _shown(names: list[str]) -> str:
    return ", ".join(names[:NAMES_SHOWN]) + (f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN
                                              else "")
