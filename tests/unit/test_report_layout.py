"""The HTML report as a browser lays it out: the golden report in headless Chromium at 800 and 1300 px,
measured by a script added to a copy of it. Nothing may run past the page's right edge (wide tables
scroll in their own box), numbers and cell ids stay on one line, and every plot label is whole and
tells its row apart from the others."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

GOLDEN_HTML = Path(__file__).parent / "golden" / "expected" / "report.html"
CHROMIUM = next(
    (path for name in ("chromium", "chromium-browser", "google-chrome") if (path := shutil.which(name))), None
)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs headless Chromium (Debian: apt-get install chromium)")

# Runs in the page; leaves its findings as JSON in <pre id="layout">.
MEASURE = """
<script>
addEventListener("load", () => {
  for (const details of document.querySelectorAll("details")) details.open = true;  // what a reader opens
  const problems = [], width = document.documentElement.clientWidth;
  const kind = (e) => (typeof e.className === "string" && e.className ? "." + e.className : "");
  const name = (e) => e.tagName.toLowerCase() + kind(e)
    + " " + JSON.stringify((e.textContent || "").trim().slice(0, 40));
  const pageWidth = document.documentElement.scrollWidth;
  if (pageWidth > width) problems.push(`page scrolls sideways: ${pageWidth} > ${width}`);
  for (const e of document.body.querySelectorAll("*")) {
    if (e.closest("div.scroll") || e.closest("svg") || e.closest("pre")) continue;  // these scroll in their box
    const box = e.getBoundingClientRect();
    if (box.width && box.right > width + 0.5) problems.push(`${name(e)} ends at ${box.right.toFixed(0)} px`);
  }
  for (const e of document.querySelectorAll("td.n, td:not(.case) > code")) {
    const lines = new Set([...e.getClientRects()].map((r) => Math.round(r.top)));
    if (lines.size > 1) problems.push(`${name(e)} wraps over ${lines.size} lines`);
  }
  for (const svg of document.querySelectorAll("svg")) {
    const frame = svg.getBoundingClientRect();
    if (frame.right > width + 0.5) problems.push(`plot ends at ${frame.right.toFixed(0)} px`);
    const rows = [...svg.querySelectorAll("text.row")].map((t) => t.textContent);
    if (new Set(rows).size !== rows.length) problems.push(`plot rows read alike: ${rows.join(" | ")}`);
    for (const text of svg.querySelectorAll("text")) {
      const box = text.getBoundingClientRect();
      const spans = `${box.left.toFixed(0)}..${box.right.toFixed(0)}`;
      const plot = `${frame.left.toFixed(0)}..${frame.right.toFixed(0)}`;
      if (box.left < frame.left - 0.5 || box.right > frame.right + 0.5)
        problems.push(`plot label cut: ${JSON.stringify(text.textContent)} spans ${spans}, plot ${plot}`);
    }
  }
  const plots = [...document.querySelectorAll("svg")].map((svg) => svg.getBoundingClientRect().width / width);
  const out = document.createElement("pre");
  out.id = "layout";
  out.textContent = JSON.stringify({problems, plots});
  document.body.append(out);
});
</script>
"""


def layout(tmp_path: Path, width: int) -> dict:
    page = tmp_path / f"report-{width}.html"
    page.write_text(GOLDEN_HTML.read_text().replace("</body>", MEASURE + "</body>"))
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--window-size={width},2000",
            "--virtual-time-budget=5000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = re.search(r'<pre id="layout">(.*?)</pre>', done.stdout, re.S)
    assert found, f"Chromium gave no measurement (exit {done.returncode}): {done.stderr[-2000:]}"
    return json.loads(found[1].replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))


@pytest.mark.parametrize("width", [800, 1300])
def test_the_golden_report_fits_the_window_and_no_label_is_cut(tmp_path, width):
    measured = layout(tmp_path, width)
    assert measured["problems"] == []
    assert measured["plots"], "the golden report has no plot to measure"
    if width == 1300:  # the plots use the page, not a narrow column of it
        assert min(measured["plots"]) > 0.75, measured["plots"]
