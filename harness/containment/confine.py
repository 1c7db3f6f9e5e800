"""The cell's first process, started where its cgroup is the root of every cgroup it can see: so that no process of
the cell moves itself out of the cell's cgroup by writing its pid to the root's cgroup.procs.

    subprocess.Popen(confined(command))    # inside the cell's cgroup (harness.containment.containment.born_inside)

runs `python -I harness/containment/confine.py -- COMMAND...`, which enters two namespaces of its own and then execs the
command: a cgroup namespace, rooted at the cgroup it was born in, and a mount namespace in which every cgroup2
mount point shows that cgroup as its root. Both are needed. A cgroup namespace alone changes what
/proc/PID/cgroup says, not what the host's cgroup2 mount shows, and unless that mount was made with `nsdelegate`
(systemd's on a pure cgroup v2 host; not the /sys/fs/cgroup/unified of a hybrid one) the kernel lets a process
move itself into any cgroup whose cgroup.procs it may write, the root's included. In the mount namespace that
path leads to the cell's own cgroup, where the process already is.

What it does not stop: a process running as root can still reach the host's mount, through /proc/PID/root of
a process outside or by entering harness's namespaces (setns); the kernel cannot keep root in a cgroup. Such a
process is still a descendant of harness, which ends it as one (harness.containment.containment). Making namespaces
needs CAP_SYS_ADMIN: elsewhere `confined` leaves the command as it is.

Standard library only; run as a file in isolated mode, like tether.py (harness need not be importable there).
"""

from __future__ import annotations

import ctypes
import os
import sys

_CLONE_NEWNS = 0x00020000
_CLONE_NEWCGROUP = 0x02000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REC, _MS_SLAVE = 0x4000, 0x80000
_MNT_DETACH = 2
_CAP_SYS_ADMIN = 21
# The per-mount options of mountinfo that a fresh cgroup2 mount keeps.
_MOUNT_FLAGS = {"ro": _MS_RDONLY, "nosuid": _MS_NOSUID, "nodev": _MS_NODEV, "noexec": _MS_NOEXEC}


def can_confine() -> bool:
    """Whether this process may make namespaces (CAP_SYS_ADMIN, which its children inherit: root)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> _CAP_SYS_ADMIN & 1)
    except (OSError, ValueError):
        pass
    return False


def confined(command: list[str]) -> list[str]:
    """`command`, started in namespaces that show its cgroup as the root (where this process may make them)."""
    if not can_confine():
        return list(command)
    return [sys.executable, "-I", os.path.abspath(__file__), "--", *command]


def enter() -> bool:
    """Put this process in a cgroup namespace rooted at its cgroup and a mount namespace whose cgroup2 mounts show
    that cgroup as their root. False where it could not (then it is in neither, or its mounts are the host's)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWCGROUP | _CLONE_NEWNS) != 0:
        return False
    # Mounts made here must not reach the host's mount namespace (/ is shared under systemd); the host's new mounts
    # still reach this one.
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_SLAVE, None) != 0:
        return False
    mounted = True
    for mount_point, flags in cgroup2_mounts(_read("/proc/self/mountinfo")):
        # In place of the host's (the kernel refuses cgroup2 twice on one mount point): mounted in this cgroup
        # namespace, cgroup2 shows the namespace's root, the cell's cgroup, as its root.
        path = os.fsencode(mount_point)
        mounted &= libc.umount2(path, _MNT_DETACH) == 0 and libc.mount(b"cgroup2", path, b"cgroup2", flags, None) == 0
    return mounted


def cgroup2_mounts(mountinfo: str) -> list[tuple[str, int]]:
    """(mount point, mount flags) of each cgroup2 mount in a /proc/PID/mountinfo text."""
    found = []
    for line in mountinfo.splitlines():
        # ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS
        before, _, after = line.partition(" - ")
        fields = before.split()
        if after.split()[:1] != ["cgroup2"] or len(fields) < 6:
            continue
        flags = 0
        for option in fields[5].split(","):
            flags |= _MOUNT_FLAGS.get(option, 0)
        found.append((_unescape(fields[4]), flags))
    return found


def _unescape(field: str) -> str:
    """mountinfo writes a space, tab, newline and backslash in a path as octal escapes."""
    for escaped, plain in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(escaped, plain)
    return field


def _read(path: str) -> str:
    with open(path) as text:
        return text.read()


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] != "--":
        sys.exit("usage: python -I confine.py -- COMMAND...")
    enter()  # where it cannot, the command runs as it is: the cell's end still finds it (as a descendant)
    os.execvp(argv[1], argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
