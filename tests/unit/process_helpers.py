"""Process helpers shared by the launcher, rank-pool and cell tests (ranks import this module by name)."""

from __future__ import annotations

import functools
import ipaddress
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def sleep_forever():
    while True:
        time.sleep(1)


def is_alive(pid: int) -> bool:
    """Running or sleeping; a zombie (exited, not yet reaped) counts as gone."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def listening_sockets(pid: int | str = "self") -> list[tuple[str, int]]:
    """(address, port) of every TCP socket process `pid` listens on, from /proc (its fds' socket inodes matched
    against its network namespace's tcp and tcp6 tables): "::" or "0.0.0.0" is every interface."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: TCP_LISTEN
                address, port = local.split(":")
                # The kernel prints each 32-bit word of the address in host (little-endian) order.
                raw = b"".join(bytes.fromhex(address[i:i + 8])[::-1] for i in range(0, len(address), 8))
                found.append((str(ipaddress.ip_address(raw)), int(port, 16)))
    return found


def start_agent(index: int, hub_port: int, credentials: Path, log: Path, **environ: str) -> subprocess.Popen:
    """`harness host --index=INDEX`: the agent of one more host of a cell across hosts, on this machine, dialling
    host 0's hub on 127.0.0.1:HUB_PORT with the cell's `credentials` (harness.engines.credentials.write); its output
    to `log` (a file: a pipe could be held open by what it left)."""
    environ = {**os.environ, **environ,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    with log.open("w") as output:
        return subprocess.Popen([sys.executable, "-m", "harness", "host", f"--index={index}", f"--count={index + 1}",
                                 "--host0=127.0.0.1", f"--hub-port={hub_port}", "--ranks-per-host=1",
                                 f"--credentials={credentials}"],
                                env=environ, stdout=output, stderr=subprocess.STDOUT)


def host_0_environ(hub_port: int, credentials: Path, hosts: int = 2) -> dict[str, str]:
    """What `harness host` gives host 0's pytest (harness.ranks.hosts), one rank per host, all on this machine."""
    return {"HARNESS_HOSTS": str(hosts), "HARNESS_HOST_RANKS": "1", "HARNESS_HUB": f"127.0.0.1:{hub_port}",
            "HARNESS_HOSTS_CREDENTIALS": str(credentials)}


@functools.cache
def cgroup_unavailable() -> str | None:
    """Why this host gives harness no cgroup (None: it does), found as harness finds it: by making one (once per
    session: the skip markers ask at collection)."""
    from harness.containment.cgroup import CellCgroup, CgroupUnavailable

    try:
        CellCgroup.create(prefix="harness-test").remove()
    except CgroupUnavailable as why:
        return str(why)
    return None
