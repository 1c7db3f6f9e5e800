"""The documentation: generated reference pages match their sources, relative links land on files, the site builds.

docs/gen_reference.py renders docs/reference/{cli,exit-codes,results-folder,environment}.md and the lower part of
matrices.md from harness's parser, errors, contract, environment variables and plan's key tables (every page of its
PAGES); `python docs/gen_reference.py` rewrites them after a change there.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# [text](target) and [text](target "title"), not images' sources alone; a target up to its first space or ")"
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *sorted(DOCS.rglob("*.md"))]


def _relative_links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of each relative link outside code fences and inline code."""
    links, fenced = [], False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if fenced:
            continue
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target) and not target.startswith("#"):
                links.append((number, target))
    return links


def test_the_generated_reference_pages_are_current():
    stale = _generator().stale()
    assert not stale, f"stale: {', '.join(stale)}: run python docs/gen_reference.py"


def test_the_check_names_a_stale_page_and_fails(tmp_path):
    """--check must be able to fail: a page edited below its marker is named and the status is 1."""
    generator = _generator()
    for relative in generator.PAGES:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(generator.expected(relative))
    assert generator.stale(tmp_path) == []
    page = tmp_path / "reference" / "exit-codes.md"
    page.write_text(page.read_text().replace("| 2 | `ConfigError`", "| 7 | `ConfigError`"))
    assert generator.stale(tmp_path) == ["reference/exit-codes.md"]
    generator.write(tmp_path)
    assert generator.stale(tmp_path) == []


def test_the_link_finder_sees_relative_links_and_skips_code(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[a](x.md) [b](https://e.org) `[c](y.md)` [d](#top) ![i](img.png)\n```\n[e](z.md)\n```\n")
    assert [target for _, target in _relative_links(page)] == ["x.md"]


def test_every_relative_link_points_to_a_file_that_exists():
    broken = []
    for page in _pages():
        if not page.exists():
            continue
        for number, target in _relative_links(page):
            path = target.split("#", 1)[0]
            if path and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}:{number}: {target}")
    assert not broken, "\n".join(broken)


def test_the_site_builds_strict(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs-material is not installed here (the dev extra has it)")
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()
