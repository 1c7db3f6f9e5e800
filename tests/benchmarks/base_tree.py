"""Another commit's tree beside the checkout, for the benchmarks that time a base commit against it."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def export(revision: str, into: Path) -> Path:
    """The tree of `revision`, as `git archive` writes it (the checkout untouched)."""
    archive = into / "base.tar"
    subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", "-o", str(archive), revision], check=True)
    tree = into / "base"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree
