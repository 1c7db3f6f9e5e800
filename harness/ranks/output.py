"""A rank's output: what it writes to its fds 1 and 2 (Python, C and C++ alike) belongs to the call it runs.

Which process does what, when the launch captures (`Launch.capture`; pytest -s turns it off):

    zygote    at start: fds 1 and 2 -> the rank log (OutputCapture.log), so its imports' output, and every
              rank it forks, start there
    rank      at start: fds 1 and 2 -> the rank log (a rank on another host keeps its agent's: that host's log)
              per call: fds 1 and 2 -> output.rankR.stdout / .stderr in its work folder; after the call it
                        flushes Python's and C's buffers, points the fds back and reads both files, capped,
                        into the call's Done or Failed
    launcher  a rank that died or hung sends nothing: the launcher reads its files (an agent, on its host)

Files, not pipes: nothing has to drain them while a call runs, and what a rank wrote before it died is still
there. What harness shows of the tested code's output (the ranks' sections, pytest's output relayed to the
terminal) goes through `printable`: an escape sequence is shown as text, never played. Standard library only.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import functools
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path

from harness.ranks.protocol import RankOutput

# What one rank's output may take in a call's result (both streams together): the head and the tail are kept.
RANK_OUTPUT_BYTES = 64 * 1024
STANDARD_FDS = (1, 2)
# C0 and C1 controls but newline and tab, and the bidirectional overrides: a terminal plays an escape sequence (it
# can retitle the window, move the cursor over earlier lines, set the clipboard) and reorders text around them.
_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with each control character (ESC, CR, BEL...) but newline and tab shown as its escape: `\\x1b`."""
    return _UNPRINTABLE.sub(_shown, text)


def _shown(control: re.Match[str]) -> str:
    code = ord(control.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


class PrintableStream:
    """A byte stream's chunks, each made `printable` as UTF-8: a character split between two chunks (a C1 control
    is two bytes) is decoded whole; bytes that are not UTF-8 show as U+FFFD."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, chunk: bytes) -> bytes:
        return printable(self._decoder.decode(chunk)).encode()


def output_paths(workdir: str | Path, rank: int) -> tuple[Path, Path]:
    """The files a rank's stdout and stderr go to during a call."""
    return Path(workdir) / f"output.rank{rank}.stdout", Path(workdir) / f"output.rank{rank}.stderr"


def send_to_log(log: str | None) -> None:
    """Point fds 1 and 2 at the rank log, appending (the zygote and every rank share it). Where it cannot be
    opened (a host that does not see the folder) they stay as they were."""
    if log is None:
        return
    try:
        descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:
        return
    flush_streams()
    for standard in STANDARD_FDS:
        os.dup2(descriptor, standard)
    os.close(descriptor)


class CallCapture:
    """The rank's side: its fds 1 and 2 go to the rank log between calls and to this call's files during one."""

    def __init__(self, log: str | None, workdir: str | Path, rank: int):
        send_to_log(log)
        self.paths = output_paths(workdir, rank)
        self._between_calls = tuple(os.dup(standard) for standard in STANDARD_FDS)
        _libc()  # loaded now, not inside the first call
        # Line-buffered: what a rank printed before it hung or crashed is in its file, not lost in its buffer.
        with contextlib.suppress(AttributeError, ValueError, OSError):
            # TextIO declares no reconfigure; a stdout without it (replaced by a test) is the AttributeError above.
            sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]

    def start(self) -> None:
        flush_streams()
        for path, standard in zip(self.paths, STANDARD_FDS, strict=True):
            # Never through a link planted at the name: the call's files are written, then read back into results.
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_NOFOLLOW, 0o600)
            os.dup2(descriptor, standard)
            os.close(descriptor)

    def stop(self) -> RankOutput:
        """Every byte the call wrote is in the files before they are read: flushed first, then the fds go back."""
        flush_streams()
        for saved, standard in zip(self._between_calls, STANDARD_FDS, strict=True):
            os.dup2(saved, standard)
        return read_output(self.paths)


def flush_streams() -> None:
    """Python's buffered streams (the call's own sys.stdout too, if it replaced it) and C's stdio buffers."""
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        if stream is None:  # sys.__stdout__ and sys.__stderr__ where the interpreter started without them
            continue
        with contextlib.suppress(Exception):  # closed, or not a stream at all
            stream.flush()
    libc = _libc()
    if libc is not None:
        libc.fflush(None)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


# ---------------------------------------------------------------- reading and capping


def read_output(paths: tuple[Path, Path], limit: int = RANK_OUTPUT_BYTES) -> RankOutput:
    """A rank's two files, together at most `limit` bytes; never more than that is read, however large they are."""
    stdout_limit, stderr_limit = stream_limits((_size(paths[0]), _size(paths[1])), limit)
    return RankOutput(stdout=_read_head_and_tail(paths[0], stdout_limit),
                      stderr=_read_head_and_tail(paths[1], stderr_limit))


def merge(outputs: Iterable[RankOutput], limit: int = RANK_OUTPUT_BYTES) -> RankOutput:
    """One rank's outputs of several calls, in order, capped as one."""
    outputs = list(outputs)
    stdout = "".join(output.stdout for output in outputs).encode()
    stderr = "".join(output.stderr for output in outputs).encode()
    stdout_limit, stderr_limit = stream_limits((len(stdout), len(stderr)), limit)
    return RankOutput(stdout=head_and_tail(stdout, stdout_limit), stderr=head_and_tail(stderr, stderr_limit))


def stream_limits(sizes: tuple[int, int], limit: int) -> tuple[int, int]:
    """How much of stdout and of stderr to keep: each gets at least half, and what the other leaves of its half."""
    half = limit // 2
    return limit - min(sizes[1], half), limit - min(sizes[0], half)


def head_and_tail(data: bytes, limit: int) -> str:
    if len(data) <= limit:
        return data.decode(errors="replace")
    head = limit // 2
    return _joined(data[:head], data[len(data) - (limit - head):], cut=len(data) - limit)


def _read_head_and_tail(path: Path, limit: int) -> str:
    try:
        with open(path, "rb") as stream:
            size = os.fstat(stream.fileno()).st_size
            if size <= limit:
                return stream.read(limit).decode(errors="replace")
            head = stream.read(limit // 2)
            stream.seek(size - (limit - len(head)))
            tail = stream.read(limit - len(head))
    except FileNotFoundError:
        return ""
    return _joined(head, tail, cut=size - len(head) - len(tail))


def _joined(head: bytes, tail: bytes, cut: int) -> str:
    marker = f"\n[... {cut:,} bytes of this rank's output cut here: its first and last bytes are kept ...]\n"
    return head.decode(errors="replace") + marker + tail.decode(errors="replace")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
