"""Process helpers shared by the launcher and rank-pool tests (ranks import this module by name)."""

from __future__ import annotations

import time
from pathlib import Path


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
