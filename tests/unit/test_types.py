"""harness/ and the suite's own code (tests/gpu: its packages, conftest and test files) type-check clean: mypy,
configured in pyproject.toml ([tool.mypy]: files, Python 3.10, the modules without stubs), reports no error. The
hand-run reproducers (tests/gpu/upstream/repros/) are left out: each is a script of its own, torch and
transformers only, written to be read. Skipped where mypy is not installed (the dev extra installs it)."""

from __future__ import annotations

import importlib.util
import os
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


SUITE = ROOT / "tests" / "gpu"
# The suite's code as its ranks import it: tests/gpu on sys.path, its packages by name (conftest.py).
SUITE_CODE = ["models", "loading", "checks", "training", "upstream/table", *sorted(
    str(path.relative_to(SUITE)) for pattern in ("*.py", "upstream/*.py") for path in SUITE.glob(pattern))]


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                    reason="mypy is not installed in this interpreter (pip install -e '.[dev]' installs it)")
def test_the_suites_code_type_checks_clean():
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--explicit-package-bases",
         "--cache-dir", str(ROOT / ".mypy_cache" / "suite"), *SUITE_CODE],
        cwd=SUITE, env={**os.environ, "MYPYPATH": os.pathsep.join([str(SUITE), str(ROOT)])},
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
