"""harness/'s packages keep their layers: import-linter (a real architecture linter) checks the contracts in
pyproject.toml, typing-only imports included; a copy of the package with one forbidden import fails them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(project: Path) -> subprocess.CompletedProcess:
    """lint-imports on `project`'s pyproject.toml, importing harness from `project` (not the installed one)."""
    env = {**os.environ, "PYTHONPATH": str(project)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(project / "pyproject.toml"), "--no-cache"],
        cwd=project, env=env, capture_output=True, text=True, timeout=300, check=False,
    )


def test_the_packages_keep_their_layers():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_forbidden_import_breaks_a_contract_even_when_it_only_serves_typing(tmp_path):
    shutil.copytree(ROOT / "harness", tmp_path / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    model = tmp_path / "harness" / "results" / "model.py"
    model.write_text(model.read_text() + "\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                     "    from harness.report.model import FailureGroup  # noqa: F401\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "harness.results.model -> harness.report.model" in result.stdout
