"""The cell (and its versions, SPEC) the environment tests build for (test_env, test_env_cache,
test_hostile_env). Its releases (torch 0.0.1, transformers 0.0.2) are on no index:
the tests stand in for the installer or the build."""

from __future__ import annotations

from harness.envs.build import EnvSpec
from harness.plan.cells import Cell

CELL = Cell(gpu="cpu", gpus=2, torch="0.0.1", transformers="0.0.2", matrix="test", labels=(),
            timeout_minutes=5, reruns=0, suite=("tests/gpu",))
SPEC = EnvSpec(torch=CELL.torch, transformers=CELL.transformers)  # what the environment builder takes of CELL
