"""The jinja2 filters every rendering uses: one escaping for Markdown, HTML and terminals, and the
number formats. Nothing a test writes may add markup, break a table, close a fence or ping a user; a
labelled value (inf, nan, out of range) is shown as its label, never computed with."""

from __future__ import annotations

import re

import markupsafe

from harness.results import CellResult, Labelled, Number, finite

# ---------------------------------------------------------------------------------------------
# Escaping: nothing a test writes may add markup, break a table or ping a user

# C0/C1 controls (ANSI escapes start with one) and bidirectional overrides that reorder what is shown.
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>|~&!#])")
_ZERO_WIDTH_SPACE = "&#8203;"  # after '@', so `@team` in a message is text, not a mention
# GitHub turns bare `scheme://host`, `www.host` and `user@host` into links (GFM autolinks). A zero-width
# space after the scheme's ':' and inside `www.` leaves the text as it reads and matches no autolink rule.
_AUTOLINK_SCHEME = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*):(?=//)")
_AUTOLINK_WWW = re.compile(r"(?i)\b(www)(?=\.)")
# GitHub links `#1`, `owner/repo#1` and `GH-1` to issues after Markdown is rendered, so a backslash before the '#'
# stops nothing; a zero-width space after the '#' or the 'GH' does. It goes into the text before it is escaped
# (as the character: no entity of the escaping can be split), and leaves as the entity.
_ISSUE_REFERENCE = re.compile(r"(?i)(#|\bgh(?=-))(?=-?\d)")
# GitHub renders `$x$` and `$$x$$` as math, and a backslash does not stop it either: each '$' becomes an entity in
# a <span> of its own, GitHub's documented way to show a '$' as itself.
_DOLLAR = "<span>&#36;</span>"


def clean_block(text: str | None, max_lines: int | None = None) -> str:
    """Multi-line text without control characters, keeping at most the last `max_lines` lines."""
    lines = _CONTROL.sub("", (text or "").replace("\r\n", "\n").replace("\t", "    ")).split("\n")
    if max_lines is not None and len(lines) > max_lines:
        lines = lines[-max_lines:]
    return "\n".join(lines)


def one_line(text: object, max_chars: int = 300) -> str:
    flat = " ".join(_CONTROL.sub(" ", "" if text is None else str(text)).split())
    return flat if len(flat) <= max_chars else flat[: max_chars - 1] + "…"


def markdown_text(text: object, max_chars: int = 300) -> str:
    """Inline Markdown (table cells, list items): every character that could start markup is escaped."""
    escaped = _MARKDOWN_SPECIAL.sub(r"\\\1", _no_references(one_line(text, max_chars)))
    return _no_autolinks(escaped) or "—"


def _no_references(text: str) -> str:
    """Plain text with a zero-width space wherever GitHub would see an issue reference."""
    return _ISSUE_REFERENCE.sub("\\1\u200b", text)


def _no_autolinks(escaped: str) -> str:
    """Text already escaped for Markdown or HTML (and through `_no_references`), with nothing GitHub would link,
    mention or render as math."""
    escaped = _AUTOLINK_SCHEME.sub(r"\1:" + _ZERO_WIDTH_SPACE, escaped)
    escaped = _AUTOLINK_WWW.sub(r"\1" + _ZERO_WIDTH_SPACE, escaped)
    escaped = escaped.replace("\u200b", _ZERO_WIDTH_SPACE).replace("$", _DOLLAR)
    return escaped.replace("@", "@" + _ZERO_WIDTH_SPACE)


def code_span(text: object, max_chars: int = 300, *, table: bool = False) -> str:
    """An inline code span whose delimiter is longer than any backtick run inside it."""
    content = one_line(text, max_chars)
    if not content:
        return "—"
    if table:  # GitHub splits table cells on '|' even inside code spans, unless escaped
        content = content.replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", content)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if content.startswith("`") or content.endswith("`") else ""
    return f"{ticks}{pad}{content}{pad}{ticks}"


def html_text(text: object, max_chars: int = 300) -> str:
    """Text inside raw HTML in Markdown (a <summary>): escaped, one line, no mentions. GitHub does not
    read Markdown there; '[' is encoded all the same, so no renderer can see a link in it."""
    return _no_autolinks(str(markupsafe.escape(_no_references(one_line(text, max_chars)))).replace("[", "&#91;"))


def fence_for(text: str | None) -> str:
    """A code fence longer than any backtick run in `text`, so the text cannot close it."""
    longest = max((len(run) for run in re.findall(r"`+", text or "")), default=0)
    return "`" * max(3, longest + 1)


# ---------------------------------------------------------------------------------------------
# Numbers


# A labelled value (inf, nan, out of range) is shown as its label, never computed with.


def gib(mib: Number | None) -> str:
    if isinstance(mib, Labelled):
        return one_line(mib.label, 24)
    return "?" if mib is None else f"{mib / 1024:.1f}"


def mib_or_gib(mib: Number | None) -> str:
    if isinstance(mib, Labelled):
        return one_line(mib.label, 24) + " MiB"
    if mib is None:
        return "—"
    return f"{mib:.0f} MiB" if mib < 1024 else f"{mib / 1024:.1f} GiB"


def memory_per_gpu(cell: CellResult) -> str:
    """`12.3 / 12.1 GiB`: peak used per GPU, in index order."""
    if not cell.memory:
        return "—"
    return " / ".join(gib(gpu.peak_used_mib) for gpu in cell.memory) + " GiB"


def compact_memory(cell: CellResult) -> str:
    """`12.3/12.1 GiB` per GPU up to four GPUs; beyond, `40.0-41.0 GiB x8`: the range keeps a table narrow."""
    peaks = [peak for gpu in cell.memory if (peak := finite(gpu.peak_used_mib)) is not None]
    if len(cell.memory) <= 4 or not peaks:
        return memory_per_gpu(cell).replace(" / ", "/")
    return f"{gib(min(peaks))}-{gib(max(peaks))} GiB x{len(cell.memory)}"


def duration(seconds: Number | None) -> str:
    if isinstance(seconds, Labelled):
        return one_line(seconds.label, 24) + "s"
    if seconds is None:
        return "—"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{seconds:.1f}s" if seconds < 10 else f"{secs}s"


def span(seconds: float | None) -> str:
    """A wait or a wall time in prose, in the unit a person reads it in: `42 s`, `6 min`, `1.5 h`."""
    if seconds is None:
        return "unknown"
    if seconds < 59.5:
        return f"{round(seconds)} s"
    if seconds < 3570:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def gpu_hours(hours: float | None) -> str:
    """`1.3`; `0.04` below a tenth, `<0.01` below that (a short cell still cost something), `0` for none."""
    if hours is None:
        return "unknown"
    if hours == 0:
        return "0"
    if hours < 0.01:
        return "<0.01"
    return f"{hours:.2f}" if hours < 0.1 else f"{hours:.1f}"


def scientific(value: Number | None) -> str:
    if isinstance(value, Labelled):
        return one_line(value.label, 24)
    return "—" if value is None else f"{value:.2e}"


def significant(value: Number | None, digits: int = 3) -> str:
    if isinstance(value, Labelled):
        return one_line(value.label, 24)
    return "—" if value is None else f"{value:.{digits}g}"


_BREAK_AFTER = re.compile(r"(?<=::)|(?<=[/\[,_-])|(?<=\.)(?!py\b)")


def breakable(text: object, max_chars: int = 300) -> list[str]:
    """A long identifier (test id, parameter name) in pieces, for a template to join with `<wbr>`: a
    browser then wraps it after `::`, `/`, `[`, `.`, `,` or `-`, never inside a word."""
    return [piece for piece in _BREAK_AFTER.split(one_line(text, max_chars)) if piece]


def pad(text: str, width: int, right: bool = False) -> str:
    return text.rjust(width) if right else text.ljust(width)


def percent(fraction: float | None) -> str:
    return "—" if fraction is None else f"{fraction * 100:.0f}%"


def plural(count: int, word: str) -> str:
    return f"{count:,} {word if count == 1 else word + 's'}"


def short_sha(sha: str | None) -> str:
    return (sha or "")[:12]
