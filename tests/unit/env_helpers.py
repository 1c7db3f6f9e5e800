"""The cell (and its versions, SPEC) the environment tests build for (test_env, test_env_cache,
test_hostile_env), and cache folders as builds leave them. Its releases (torch 0.0.1, transformers 0.0.2)
are on no index: the tests stand in for the installer or the build."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from harness.envs.build import EnvSpec
from harness.plan.cells import Cell

CELL = Cell(gpu="cpu", gpus=2, torch="0.0.1", transformers="0.0.2", matrix="test", labels=(),
            timeout_minutes=5, reruns=0, suite=("tests/gpu",))
SPEC = EnvSpec(torch=CELL.torch, transformers=CELL.transformers)  # what the environment builder takes of CELL

# The cache's on-disk names, spelled out: a test fails when a build's layout drifts from what clean reads.
CELL_MARKER, COMMIT_MARKER, BUILDING_MARKER = "harness-env.json", "harness-commit-env.json", "harness-building.json"
VERSIONS = {"python": "3.11.7", "torch": "2.13.0+cpu", "transformers": "5.24.0"}


def cached_environment(root: Path, name: str, *, kind: str = "cell", complete: bool = True, days_unused: float = 0,
                       size: int = 100_000) -> Path:
    """A folder as a build leaves it, in small: a complete one (its kind's marker, last used `days_unused`
    ago) or an interrupted one (only the building marker)."""
    path = root / name
    (path / "lib").mkdir(parents=True)
    (path / "lib" / "blob").write_bytes(b"x" * size)
    if not complete:
        marker = path / BUILDING_MARKER
        marker.write_text(json.dumps({"kind": kind, "building": name, "harness": "0.1.0", "pid": 1,
                                      "started": "2026-01-01T00:00:00+00:00"}))
    elif kind == "cell":
        marker = path / CELL_MARKER
        marker.write_text(json.dumps({"requirements": ["torch==2.13.0"], "versions": VERSIONS, "kind": kind}))
    else:
        marker = path / COMMIT_MARKER
        marker.write_text(json.dumps({"base": "/usr/bin/python3", "package": "tinypkg", "commit": "a" * 40,
                                      "kind": kind}))
    used = time.time() - days_unused * 86_400
    os.utime(marker, (used, used))
    return path


def tree(root: Path) -> list[tuple[str, str]]:
    """Every entry under `root` (links as their targets, not followed), to compare before and after."""
    found = []
    for folder, folders, files in os.walk(root):
        for name in sorted(folders + files):
            full = Path(folder) / name
            found.append((str(full.relative_to(root)), os.readlink(full) if full.is_symlink() else ""))
    return sorted(found)
