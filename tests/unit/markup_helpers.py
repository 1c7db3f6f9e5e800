"""What GitHub and a browser make of a rendered report, for the report tests (test_report.py, test_hostile.py):
Markdown without its code, where text is literal, and the tags and URLs of an HTML page."""

from __future__ import annotations

import html.parser
import re


def without_fences(markdown: str) -> str:
    return re.sub(r"^(`{3,})[a-z]*\n.*?^\1$", "", markdown, flags=re.MULTILINE | re.DOTALL)


def without_code_spans(markdown: str) -> str:
    # A span opens on a backtick run that is not escaped, and closes on a run of the same length.
    return re.sub(r"(?<![\\`])(`+)(?!`).*?(?<!`)\1(?!`)", "", markdown)


class TagCollector(html.parser.HTMLParser):
    """The tags an HTML page opens and the URLs its src and href attributes name."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.urls += [value for key, value in attrs if key in ("src", "href") and value]
