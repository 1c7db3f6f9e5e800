"""What a terminal shows: its width, whether it takes colour, and the colours of the report's words.

Colour only on a TTY, never with NO_COLOR set (https://no-color.org) or TERM=dumb; text written to a
file or a pipe stays plain. Colour is added after padding, so escape codes never count as width.
"""

from __future__ import annotations

import os
import textwrap
from typing import TextIO

COLUMNS = 80  # what every line of the terminal rendering fits, whatever the window is

# SGR codes: red, green, yellow, magenta (neither green nor red: nothing distributed ran), bold.
_STYLES = {"failed": "31", "passed": "32", "errored": "33", "flaky": "33", "not_run": "35", "bold": "1"}


def wants_color(stream: TextIO) -> bool:
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def paint(text: str, style: str, enabled: bool) -> str:
    """`text` in the style's colour when enabled and the style has one; else unchanged."""
    code = _STYLES.get(style)
    return f"\x1b[{code}m{text}\x1b[0m" if enabled and code and text else text


def wrap(text: str, indent: int = 0, hang: int = 2, width: int = COLUMNS) -> str:
    """One flat line (already through `one_line`) wrapped to `width`, indented by `indent`, continuation
    lines by `hang` more; words longer than a line (test ids) are broken where they must be."""
    lead = " " * indent
    return "\n".join(textwrap.wrap(text, width=width, initial_indent=lead, subsequent_indent=lead + " " * hang,
                                   break_on_hyphens=False)) or lead.rstrip()
