"""What a failure's words look like: "looks like an OOM", "looks like a collective timeout". Triage shows the label
beside a red's class, as a field of its record; it never decides the class (harness.results.triage decides that
from typed events). Read from what a failure says (`failure_text`), never from a test's source."""

from __future__ import annotations

import dataclasses
import re

from harness import contract
from harness.results.model import TestResult


@dataclasses.dataclass(frozen=True)
class Label:
    """What a failure's words look like: shown beside its class, never deciding it."""

    text: str
    regex: re.Pattern


def _label(text: str, *alternatives: str) -> Label:
    return Label(text, re.compile("|".join(f"(?:{a})" for a in alternatives), re.M))


# First match wins; each has a case in test_triage.py. What torch, NCCL, gloo, pip, uv, the rank launcher and the
# Actions runner print.
LABELS = (
    # The suite's known-bugs words without its property: a test's own message may say anything.
    _label("says it is a known upstream bug, but no known-bugs entry matched",
           re.escape(contract.KNOWN_BUG_PREFIX), re.escape(contract.FIXED_UPSTREAM)),
    _label(
        "looks like a crash or a device assert",
        r"\b(?:killed|exited) by signal SIG[A-Z]+",  # the rank launchers
        r"exited with (?:exit)?code -\d+\b",
        r"Signal \d+ \(SIG[A-Z]+\) received",
        r"device-side assert triggered",
        r"an illegal memory access was encountered",
    ),
    _label(
        "looks like a collective timeout",
        r"Watchdog caught collective operation timeout",
        r"\b(?:NCCL|[Gg]loo)\b[^\n]*\b(?:[Tt]imed out|[Tt]imeout)\b",
        r"DistStoreError: [^\n]*[Tt]imed out",
    ),
    _label(
        "looks like a communicator error",
        r"\bNCCL error\b",
        r"\bnccl(?:Internal|UnhandledCuda|System|Remote|Invalid\w*)Error\b",
        r"NCCL communicator was aborted",
        r"\bgloo\b[^\n]*(?:Connection (?:reset|closed) by peer|Read error)",
        r"\[enforce fail at [^\]]*gloo",
    ),
    _label("looks like an OOM", r"CUDA out of memory", r"\bOutOfMemoryError\b", r"\bout of memory\b"),
    _label(
        "looks like a CUDA error",
        r"\bCUDA error\b",
        r"\bcudaError\w+",
        r"\bCUBLAS_STATUS_\w+",
        r"\bCUDNN_STATUS_\w+",
    ),
    _label(
        "looks like an install failure",
        r"No matching distribution found",
        r"ResolutionImpossible",
        r"Failed to (?:download|build|prepare distributions)",
    ),
    _label(
        "looks like a lost runner",
        r"runner has received a shutdown signal",
        r"lost communication with the server",
        r"The self-hosted runner: .* lost",
    ),
)


def label_text(text: str) -> str | None:
    """What a failure's words look like (`text`: failure_text's, never source), or None: a label, not a class."""
    for label in LABELS:
        if label.regex.search(text):
            return label.text
    return None


_E_LINE = re.compile(r"^E(?:\s+|$)")
_FRAME = re.compile(r'^\s*File "[^"]*", line \d+')
_MARKERS = re.compile(r"^[\s^~]+$")  # the carets under a traceback's source line


def failure_text(test: TestResult) -> str:
    """What a failure says: its message (the exception) and the E lines of its excerpt, leaving out the test's
    source (every line pytest does not mark E) and, inside a traceback among the E lines (a rank's), each
    frame's line and the source line under it."""
    lines = [test.message or ""]
    after_frame = False
    for line in (test.excerpt or "").splitlines():
        if not _E_LINE.match(line):
            continue
        said = _E_LINE.sub("", line, count=1)
        if _FRAME.match(said):
            after_frame = True
            continue
        if after_frame or _MARKERS.match(said or " "):
            after_frame = False
            continue
        lines.append(said)
    return "\n".join(lines)
