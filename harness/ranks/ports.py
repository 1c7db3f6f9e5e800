"""Ports a single-host or multi-host launch binds: below the kernel's ephemeral range, and within this cell's share
when `harness run` packs several cells on one host ($HARNESS_PORT_SLOT). Every launch needs it; no launch on one
host needs the multi-host module it came from. Needs only the standard library and harness.environment.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

from harness.environment import PORT_SLOT_ENV


def port_share(candidates: range, slot: str | None) -> range:
    """The part of `candidates` a cell packed beside others on this host may take ($HARNESS_PORT_SLOT "i/n",
    set by `harness run` for the i-th of n cells at once): no two of them can pick one port. Unset: all."""
    if not slot:
        return candidates
    try:
        index, count = (int(part) for part in slot.split("/"))
    except ValueError:
        raise ValueError(f"${PORT_SLOT_ENV}={slot!r}: expected INDEX/COUNT") from None
    if not 0 <= index < count <= len(candidates):
        raise ValueError(f"${PORT_SLOT_ENV}={slot!r}: expected 0 <= INDEX < COUNT <= {len(candidates)}")
    size = len(candidates) // count
    return candidates[index * size:(index + 1) * size]


def port_outside_ephemeral_range(address: str = "0.0.0.0", attempts: int = 200) -> int:
    """A free TCP port below the kernel's ephemeral range. Across hosts the ranks' own connections to the
    launcher are TCP and take ephemeral ports, which could land on a port chosen for rank 0's store in the
    moment between choosing it and binding it (seen: `failed to listen ... port: 40301`)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    candidates = port_share(range(max(1024, low // 2), low), os.environ.get(PORT_SLOT_ENV))
    for _ in range(attempts):
        port = random.choice(candidates)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((address, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port below {low} on {address} after {attempts} tries")
