"""`harness init`: what a repository needs to run its own tests through harness.

Writes a starter ``matrices/`` (the shipped runners, to edit; ``gpu``, the matrix its GPU runs use; ``cpu``,
overriding the shipped default so a plain ``harness run`` runs its tests on CPU ranks) and the two
workflow callers (``/ok to test`` and nightly) that call harness's reusable ``gpu-tests.yml`` from
harness's repository. Nothing that exists is overwritten without ``--force``.
"""

from __future__ import annotations

import importlib.resources
import re
import sys
from pathlib import Path

import yaml

from harness.errors import ConfigError
from harness.project import git_toplevel, project_root, shipped_matrices_dir

# OWNER/NAME@REF: where gpu-tests.yml lives, at which commit. Only a full sha: a tag or branch can be moved
# to other code after the callers were written (zizmor: unpinned-uses).
USES_PATTERN = re.compile(r"(?P<repository>[\w.-]+/[\w.-]+)@(?P<ref>[\w./-]+)")
FULL_SHA = re.compile(r"[0-9a-f]{40}")
RUNNERS_HEADER = (
    "# Written by `harness init`: a copy of the GPU types harness ships. Entries here add to or override\n"
    "# them (same name wins); list only what this repository's runners differ in, if you like.\n"
)


def starter_files(uses: str, harness_requirement: str | None) -> dict[str, str]:
    """Relative path -> text of every file `harness init` writes."""
    match = USES_PATTERN.fullmatch(uses)
    if not match:
        raise ConfigError(f"--uses {uses!r}: expected OWNER/NAME@SHA, the harness repository and a full commit sha")
    if not FULL_SHA.fullmatch(match["ref"]):
        raise ConfigError(
            f"--uses {uses}: {match['ref']!r} is not a full commit sha, and a tag or branch can be moved to other "
            f"code; give the 40-character sha it names (git ls-remote https://github.com/{match['repository']} "
            f"{match['ref']})")
    requirement = harness_requirement or f"git+https://github.com/{match['repository']}@{match['ref']}"
    default_cell = yaml.safe_load((shipped_matrices_dir() / "cpu.yaml").read_text())["axes"]
    values = {
        "@HARNESS_REPOSITORY@": match["repository"],
        "@HARNESS_REF@": match["ref"],
        "@HARNESS_REQUIREMENT@": requirement,
        "@TORCH@": default_cell["torch"][0],
        "@TRANSFORMERS@": default_cell["transformers"][0],
    }
    starter = importlib.resources.files("harness") / "starter"
    files = {
        "matrices/runners.yaml": RUNNERS_HEADER + (shipped_matrices_dir() / "runners.yaml").read_text(),
        "matrices/cpu.yaml": (starter / "cpu.yaml").read_text(),
        "matrices/gpu.yaml": (starter / "gpu.yaml").read_text(),
        ".github/workflows/harness-ok-to-test.yml": (starter / "ok-to-test.yml").read_text(),
        ".github/workflows/harness-nightly.yml": (starter / "nightly.yml").read_text(),
    }
    for path, text in files.items():
        for token, value in values.items():
            text = text.replace(token, value)
        files[path] = text
    return files


def write_starter(root: Path, files: dict[str, str], force: bool) -> list[Path]:
    existing = [path for path in files if (root / path).exists()]
    if existing and not force:
        raise ConfigError(f"{root / existing[0]}: exists; harness init overwrites nothing without --force")
    written = []
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


def command(args) -> int:
    root = project_root()
    if git_toplevel(root) is None:
        print(f"harness: warning: {root} is not a git repository: the files go here, and harness run takes "
              "this folder as the project root only when run from it (git init first to make it one)",
              file=sys.stderr)
    written = write_starter(root, starter_files(args.uses, args.harness), args.force)
    for path in written:
        print(f"wrote {path}")
    print(
        "next: write tests that use the `ranks` fixture under tests/, then\n"
        "  harness matrix --matrix gpu      # the cells\n"
        "  harness run                      # your tests on 2 CPU ranks, here (matrices/cpu.yaml)\n"
        "  commit, and comment '/ok to test <sha>' on a pull request"
    )
    return 0
