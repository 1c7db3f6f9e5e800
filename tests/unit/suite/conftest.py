"""The suite's self-tests: its tables (the family registry, the known-bugs table) and its instruments (tiny
models and their routers, the checks' messages, fake quantization), checked without ranks. They run with the unit
tests, not in the cells; the suite itself is tests/gpu.

They import the suite's modules (families, known_bugs, tiny_models, ...) by name, as the suite's own code does:
its conftest puts tests/gpu on sys.path only where pytest collects tests/gpu, so this one does it here, whether or
not the run collects the suite too.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SUITE_DIR = Path(__file__).resolve().parents[2] / "gpu"
if str(SUITE_DIR) not in sys.path:
    sys.path.insert(0, str(SUITE_DIR))
# The tiny models are built locally, as in the suite (tests/gpu/conftest.py): never reach for the Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The suite's own checkpoint fixtures (each family's tiny checkpoint), not a copy of them.
from models.checkpoint_fixtures import checkpoint, checkpoints  # noqa: E402, F401
