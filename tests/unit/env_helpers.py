"""The cell the environment tests build for (test_env.py, test_env_cache.py, test_hostile_env.py). Its releases
(torch 0.0.1, transformers 0.0.2) are on no index: the tests stand in for the installer or the build."""

from __future__ import annotations

from harness.plan.matrix import Cell

CELL = Cell(gpu="cpu", gpus=2, torch="0.0.1", transformers="0.0.2", matrix="test", labels=(),
            timeout_minutes=5, reruns=0, suite=("tests/gpu",))
