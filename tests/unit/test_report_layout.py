"""The HTML report as a browser lays it out, in headless Chromium at 800 and 1300 px, measured by a script
added to a copy of it: the golden report, and the report of a real cell's results (tests/unit/layout/:
the embedded default, `harness run` on 2 CPU ranks, with its 100-odd metrics rows and long test ids).
Nothing may run past the page's right edge and every table fits the page; numbers stay on one line, and
so do cell ids but in the metrics table (they wrap at their dashes there); a test id keeps a readable
width and a metrics row a few lines; every plot label is whole, at least 11 px as shown, and tells its row apart
from the others."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from progress_watch import run_while_progressing

GOLDEN_HTML = Path(__file__).parent / "golden" / "expected" / "report.html"
REAL_CELL = Path(__file__).parent / "layout"  # results/<cell-id>/ of `harness run` (embedded default), logs left out
MIN_CASE_CHARS = 20  # a test id column narrower than this is read a few characters a line
MAX_ROW_LINES = 4  # a metrics row taller than this many lines of its text is a column squeezed too narrow
MIN_LABEL_PX = 11  # a plot's axis, tick and row labels as the page shows them, from an 800 px window up
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
  for (const table of document.querySelectorAll("table")) {
    const box = table.getBoundingClientRect();
    if (box.right > width + 0.5) problems.push(`table ${name(table.rows[0])} ends at ${box.right.toFixed(0)} px`);
  }
  const probe = document.createElement("code");
  probe.textContent = "0".repeat(10);
  document.body.append(probe);
  const charWidth = probe.getBoundingClientRect().width / 10, lineHeight = probe.getBoundingClientRect().height;
  probe.remove();
  for (const td of document.querySelectorAll("td.case")) {
    const style = getComputedStyle(td);
    const chars = (td.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight)) / charWidth;
    if (chars < MIN_CASE_CHARS) problems.push(`${name(td)} is ${chars.toFixed(1)} characters wide`);
    const lines = td.parentElement.getBoundingClientRect().height / lineHeight;
    if (lines > MAX_ROW_LINES + 1) problems.push(`${name(td)}: its row is ${lines.toFixed(1)} lines tall`);
  }
  for (const e of document.querySelectorAll("td.n, td:not(.case):not(.wrap) > code")) {
    const lines = new Set([...e.getClientRects()].map((r) => Math.round(r.top)));
    if (lines.size > 1) problems.push(`${name(e)} wraps over ${lines.size} lines`);
  }
  // A plot laid out both ways shows one (display: none hides the other); what shows is measured.
  const shown = [...document.querySelectorAll("svg")].filter((svg) => svg.getClientRects().length);
  for (const svg of shown) {
    const frame = svg.getBoundingClientRect();
    const scale = frame.width / svg.viewBox.baseVal.width;  // an SVG shrunk to the page shrinks its text
    for (const text of svg.querySelectorAll("text")) {
      const px = parseFloat(getComputedStyle(text).fontSize) * scale;
      if (px < MIN_LABEL_PX - 0.05)
        problems.push(`plot label ${JSON.stringify(text.textContent)} is ${px.toFixed(1)} px`);
    }
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
  const plots = shown.map((svg) => svg.getBoundingClientRect().width / width);
  const out = document.createElement("pre");
  out.id = "layout";
  out.textContent = JSON.stringify({problems, plots});
  document.body.append(out);
});
</script>
"""


def real_cell_html() -> str:
    from harness.report.render import render
    from harness.results import load_results

    return render(load_results([str(REAL_CELL)]), "html")


PAGES = {"golden": lambda: GOLDEN_HTML.read_text(), "real-cell": real_cell_html}


def layout(tmp_path: Path, width: int, page_name: str = "golden") -> dict:
    page = tmp_path / f"report-{page_name}-{width}.html"
    measure = (MEASURE.replace("MIN_CASE_CHARS", str(MIN_CASE_CHARS)).replace("MAX_ROW_LINES", str(MAX_ROW_LINES))
               .replace("MIN_LABEL_PX", str(MIN_LABEL_PX)))
    page.write_text(PAGES[page_name]().replace("</body>", measure + "</body>"))
    # No clock: Chromium on a busy machine is slow, not stuck; it is killed only when it stalls.
    done = run_while_progressing(
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
        stall_seconds=120,
    )
    found = re.search(r'<pre id="layout">(.*?)</pre>', done.stdout, re.S)
    assert found, f"Chromium gave no measurement (exit {done.returncode}): {done.stdout[-2000:]}"
    return json.loads(found[1].replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))


@pytest.mark.parametrize("page_name", ["golden", "real-cell"])
@pytest.mark.parametrize("width", [800, 1300])
def test_the_report_fits_the_window_reads_like_a_table_and_no_label_is_cut(tmp_path, width, page_name):
    measured = layout(tmp_path, width, page_name)
    assert measured["problems"] == []
    assert measured["plots"], f"the {page_name} report has no plot to measure"
    if width == 1300:  # the plots use the page, not a narrow column of it
        assert min(measured["plots"]) > 0.75, measured["plots"]
