"""The one jinja2 environment every rendering uses: the package's reports/ templates, StrictUndefined, autoescape
for HTML and SVG, and the filters that escape what came from results (harness/report/filters.py)."""

from __future__ import annotations

from functools import cache

import jinja2

from harness.project import shipped_reports_dir
from harness.report.filters import (
    breakable,
    clean_block,
    code_span,
    compact_memory,
    duration,
    fence_for,
    gib,
    gpu_hours,
    html_text,
    markdown_text,
    memory_per_gpu,
    mib_or_gib,
    one_line,
    pad,
    percent,
    plural,
    scientific,
    short_sha,
    significant,
    span,
)
from harness.report.terminal import paint, wrap


def render_template(template: str, **values: object) -> str:
    """Any template under reports/ with the same filters and escaping as the reports (e.g. triage.md.j2)."""
    return environment().get_template(template).render(**values)


@cache
def environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(shipped_reports_dir()),
        undefined=jinja2.StrictUndefined,
        # Per template file: the SVG macros need it as much as the page that imports them.
        autoescape=jinja2.select_autoescape(("html.j2", "svg.j2"), default_for_string=False),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    environment.filters.update(
        md=markdown_text, code=code_span, html_text=html_text, fence=fence_for, block=clean_block,
        one_line=one_line, terminal=one_line, memory=memory_per_gpu, compact_memory=compact_memory, gib=gib,
        duration=duration, span=span, gpu_hours=gpu_hours,
        sci=scientific, sig=significant, percent=percent, mib=mib_or_gib, plural=plural, short_sha=short_sha,
        pad=pad, paint=paint, wrap=wrap, breakable=breakable,
    )
    return environment
