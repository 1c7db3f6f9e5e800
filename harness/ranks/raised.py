"""What a rank says of an exception it raised: its first line, the frame that raised it, and `PeerFailure`."""

from __future__ import annotations

import dataclasses
import os
import sys
import traceback


class PeerFailure(Exception):
    """Raised on a rank whose own check passed while a peer's failed (agree.together): never the reported
    failure while a rank has one of its own."""


@dataclasses.dataclass(frozen=True)
class RaisingFrame:
    """The innermost Python frame of an exception's traceback: where it was raised (or, for an error raised in
    C++, the Python line that called into it). `file` is relative to the sys.path entry that holds it
    (`torch/distributed/tensor/placement_types.py`), so it reads the same in every environment and on every host;
    `function` is the code's name (not its qualname: Python 3.10 has none)."""

    file: str
    function: str
    line: int

    @property
    def location(self) -> str:
        """`file:function`: what a known bug's `raised_at` names. The line is left out: it moves between patch
        releases of the package that raises."""
        return f"{self.file}:{self.function}"

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


NO_MESSAGE = "(no message)"  # the first line of an exception raised without one (a bare `assert`)


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else NO_MESSAGE


def raising_frame(error: BaseException) -> RaisingFrame | None:
    """Where `error` was raised: its traceback's innermost frame, its file relative to the sys.path entry that
    holds it (the longest, so a venv's site-packages wins over a folder above it)."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return None
    innermost = frames[-1]
    return RaisingFrame(file=relative_to_sys_path(innermost.filename), function=innermost.name,
                        line=innermost.lineno or 0)


def relative_to_sys_path(filename: str) -> str:
    """`filename` relative to the longest sys.path entry it is under, with `/` between parts; its base name
    where none holds it (an absolute path would name this host's folders)."""
    path = os.path.abspath(filename)
    roots = [os.path.abspath(entry or os.curdir) for entry in sys.path]
    holding = [root for root in roots if path.startswith(root.rstrip(os.sep) + os.sep)]
    if not holding:
        return os.path.basename(path)
    return os.path.relpath(path, max(holding, key=len)).replace(os.sep, "/")
