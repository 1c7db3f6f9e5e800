"""A cell's own cgroup (cgroup v2, Linux): every process the cell starts is born in it, and no fork, new session
or clean environment takes a process out (only a write to another cgroup's cgroup.procs does), so killing the
group ends everything the cell started that stayed in it.

Made below the cgroup harness runs in (`/proc/self/cgroup` on the cgroup2 mount in `/proc/self/mountinfo`:
/sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid host), where harness's user may make one: root, or a
user whose cgroup was delegated to it (systemd `Delegate=yes`). Harness moves itself in while it starts the
cell's first process and back out at once, so that process and all it starts are born inside, and harness
never is. Where harness runs as root, that process starts where the cell's cgroup is the root of every cgroup2
mount it sees (harness.containment.confine), so none of the cell moves itself out by writing to the root's cgroup.procs
by the mount's path; a process that still leaves (root going around that) is ended as a descendant of harness.
Ending it: first the whole cgroup is frozen (`cgroup.freeze`, Linux 5.2+), so that no member forks or moves itself
out meanwhile, then `cgroup.kill` (Linux 5.14+) kills every member at once; before that kernel, each member is
killed in rounds (harness.containment.pidkill). Then the cgroup is removed.

`HARNESS_CELL_CGROUP=off` leaves cgroups alone (the child subreaper then ends the cell: harness.containment.reaper).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from harness.containment import pidkill
from harness.environment import CELL_CGROUP_ENV as CGROUP_ENV
from harness.errors import ConfigError

CGROUP_CHOICES = ("auto", "off")
_FREEZE_POLL_S = 0.01


class CgroupUnavailable(Exception):
    """This host gives harness no cgroup of its own; the message says why."""


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether to try a cgroup per cell: HARNESS_CELL_CGROUP is auto (the default) or off."""
    value = environ.get(CGROUP_ENV, "auto") or "auto"
    if value not in CGROUP_CHOICES:
        raise ConfigError(f"${CGROUP_ENV}: expected {' or '.join(CGROUP_CHOICES)}, got {value[:40]!r}")
    return value == "auto"


@dataclasses.dataclass(frozen=True)
class CellCgroup:
    path: Path  # the cell's cgroup
    parent: Path  # the one harness runs in, which it goes back to

    @classmethod
    def create(cls, prefix: str = "harness-cell") -> CellCgroup:
        """A fresh cgroup below harness's own; CgroupUnavailable where there is none to make."""
        parent = own_cgroup()
        path = parent / f"{prefix}-{uuid.uuid4().hex[:12]}"
        try:
            path.mkdir()
        except OSError as error:
            raise CgroupUnavailable(f"cannot make a cgroup in {parent}: {error.strerror or error}") from None
        cgroup = cls(path, parent)
        if not all(os.access(folder / "cgroup.procs", os.W_OK) for folder in (parent, path)):
            cgroup.remove()
            raise CgroupUnavailable(f"cannot move processes between {parent} and its child cgroups")
        return cgroup

    def enter(self) -> None:
        """Move this process in: what it starts from now on is born in the cell's cgroup."""
        _write(self.path / "cgroup.procs", str(os.getpid()))

    def leave(self) -> None:
        _write(self.parent / "cgroup.procs", str(os.getpid()))

    def pids(self) -> list[int]:
        """The live members (a zombie is no member), this process never among them."""
        try:
            text = (self.path / "cgroup.procs").read_text()
        except OSError:  # removed
            return []
        return [int(pid) for pid in text.split() if int(pid) != os.getpid()]

    def freeze(self) -> bool:
        """Freeze every member (cgroup.freeze): a frozen process neither forks nor moves itself to another cgroup,
        and one born meanwhile is born frozen. True once cgroup.events says it is frozen; False where the kernel has
        no freezer or a member did not freeze within ROUND_EXIT_WAIT_S (one in an uninterruptible wait freezes when
        the wait ends): the kill goes ahead either way, and kills frozen processes as well."""
        try:
            _write(self.path / "cgroup.freeze", "1")
        except OSError:  # before Linux 5.2, or removed
            return False
        end = time.monotonic() + pidkill.ROUND_EXIT_WAIT_S
        while not self._frozen():
            if time.monotonic() > end:
                return False
            time.sleep(_FREEZE_POLL_S)
        return True

    def _frozen(self) -> bool:
        try:
            return "frozen 1" in (self.path / "cgroup.events").read_text().splitlines()
        except OSError:
            return False

    @property
    def can_kill_whole(self) -> bool:
        return (self.path / "cgroup.kill").exists()

    def kill_whole(self) -> None:
        """SIGKILL every member and every member's descendant at once (cgroup.kill)."""
        with contextlib.suppress(FileNotFoundError):
            _write(self.path / "cgroup.kill", "1")

    def remove(self) -> None:
        """Remove the (empty) cgroup; one that still holds a process stays, and says so by existing."""
        with contextlib.suppress(OSError):
            self.path.rmdir()


def own_cgroup() -> Path:
    """The folder of the cgroup (v2) this process is in; CgroupUnavailable where there is none."""
    if not sys.platform.startswith("linux"):
        raise CgroupUnavailable("cgroups are Linux's")
    try:
        membership = Path("/proc/self/cgroup").read_text()
        mounts = Path("/proc/self/mountinfo").read_text()
    except OSError as error:
        raise CgroupUnavailable(f"cannot read /proc/self: {error.strerror or error}") from None
    folder = cgroup_folder(membership, mounts)
    if not (folder / "cgroup.procs").is_file():
        raise CgroupUnavailable(f"{folder} is no cgroup folder")
    return folder


def cgroup_folder(membership: str, mountinfo: str) -> Path:
    """Where a process's cgroup v2 shows, from its /proc/PID/cgroup and /proc/PID/mountinfo texts: the cgroup2
    mount (pure v2, or a hybrid host's /sys/fs/cgroup/unified) whose root holds the process's path."""
    relative = next((line[3:] for line in membership.splitlines() if line.startswith("0::")), None)
    if relative is None:
        raise CgroupUnavailable("this process is in no cgroup v2 hierarchy")
    for line in mountinfo.splitlines():
        # ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS
        before, _, after = line.partition(" - ")
        fields = before.split()
        if after.split()[:1] != ["cgroup2"] or len(fields) < 5:
            continue
        root, mount_point = _unescape(fields[3]), Path(_unescape(fields[4]))
        inside = os.path.relpath(relative, root)
        if inside == os.pardir or inside.startswith(os.pardir + os.sep):  # the mount shows another subtree
            continue
        return mount_point if inside == os.curdir else mount_point / inside
    raise CgroupUnavailable(f"no cgroup2 mount shows this process's cgroup {relative}")


def _unescape(field: str) -> str:
    """mountinfo writes a space, tab, newline and backslash in a path as octal escapes."""
    for escaped, plain in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(escaped, plain)
    return field


def _write(path: Path, text: str) -> None:
    """One write(2) of `text`: a cgroup file takes a value per write."""
    descriptor = os.open(path, os.O_WRONLY)
    try:
        os.write(descriptor, text.encode())
    finally:
        os.close(descriptor)
