"""harness/ type-checks clean: mypy, configured in pyproject.toml ([tool.mypy]: files, Python 3.10, the modules
without stubs), reports no error. Skipped where mypy is not installed (the dev extra installs it)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                    reason="mypy is not installed in this interpreter (pip install -e '.[dev]' installs it)")
def test_harness_type_checks_clean():
    result = subprocess.run(
        [sys.executable, "-m", "mypy"],  # files and settings from pyproject.toml; its cache in .mypy_cache/
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
