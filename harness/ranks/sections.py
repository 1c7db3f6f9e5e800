"""What the ranks write belongs to the test that ran them, not to the terminal: the pytest side, called from
harness.ranks.plugin's hooks (`output_capture` tells its launchers how to treat the ranks' fds 1 and 2).

- Each rank's stdout and stderr in a test's calls (captured per call: harness.ranks.output) become sections of
  the test's report, `Captured stdout (rank R) call` and `Captured stderr (rank R) call` (setup and teardown
  alike), each text starting with a `--- rank R stdout ---` line. pytest shows them with a failure as it shows
  its own captured output, and junitxml writes them into the testcase's system-out / system-err (with
  `-o junit_logging=all`, as harness run passes). Control characters show as their escapes (`\\x1b`): the text
  is the tested code's, and pytest writes a section to the terminal as it is. A rank's text is capped per test
  (head and tail kept), and the reports of one session take at most RANK_OUTPUT_JUNIT_BYTES of it, passing tests
  half, so a junit.xml stays readable.
- With `-s` (`--capture=no`) nothing is captured: the ranks write to the terminal as they go.
- What ranks write outside any call (the zygote's imports, a pool's start, the clean-up after a call) goes to
  the rank log: `--ranks-log PATH` (ini `ranks_log`; harness run gives results/<cell>/ranks.log), else
  ranks.log in a temporary folder. The session's summary names it when it holds anything; the temporary one
  is removed when it does not.

Needs the standard library and pytest.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

import pytest

from harness.contract import RANK_OUTPUT_JUNIT_BYTES, RANKS_LOG
from harness.ranks.output import RANK_OUTPUT_BYTES, merge, printable
from harness.ranks.protocol import OutputCapture, RankOutput

RANKS_LOG_HELP = ("where ranks write outside test calls (a zygote's imports, a pool's start); default: ranks.log "
                  "in a temporary folder, named at the end of the session when it holds anything")
CAPTURE_KEY = pytest.StashKey["OutputCapture | None"]()
TEMPORARY_LOG_KEY = pytest.StashKey[Path]()  # the folder of a rank log this plugin made, removed when empty
BUDGET_KEY = pytest.StashKey["JunitBudget"]()
OUTPUTS_KEY = pytest.StashKey[list]()  # the test's calls not yet attached: {rank: RankOutput} per call


@dataclasses.dataclass
class JunitBudget:
    """Rank output attached to this session's reports, in bytes: failing tests may fill RANK_OUTPUT_JUNIT_BYTES,
    passing tests half of it, so the output of a failure still fits after many chatty passes."""

    used: int = 0

    @staticmethod
    def limit(failed: bool) -> int:
        return RANK_OUTPUT_JUNIT_BYTES if failed else RANK_OUTPUT_JUNIT_BYTES // 2

    def take(self, size: int, failed: bool) -> bool:
        if self.used + size > self.limit(failed):
            return False
        self.used += size
        return True


# ---------------------------------------------------------------- the session


def output_capture(config: pytest.Config) -> OutputCapture | None:
    """How this session's launchers treat the ranks' output: None under `-s` (they write to the terminal), else
    captured per call, with the rank log (emptied now) for what they write outside calls."""
    if CAPTURE_KEY not in config.stash:
        # -s, or pytest's capture plugin switched off (-p no:capture): the ranks write where pytest does.
        config.stash[CAPTURE_KEY] = None if config.getoption("capture", "no") == "no" else \
            OutputCapture(log=str(_new_log(config)))
    return config.stash[CAPTURE_KEY]


def log_summary(config: pytest.Config) -> str | None:
    """The session summary's line naming the rank log, when the ranks wrote anything there."""
    log = _log(config)
    size = log.stat().st_size if log is not None and log.is_file() else 0
    return f"rank log: what the ranks wrote outside test calls ({size:,} bytes) is in {log}" if size else None


def remove_empty_log(config: pytest.Config) -> None:
    """The temporary rank log's folder goes when the ranks wrote nothing outside calls."""
    folder = config.stash.get(TEMPORARY_LOG_KEY, None)
    if folder is not None and log_summary(config) is None:
        shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------- a test's rank output


def keep(item: pytest.Item, outputs: dict[int, RankOutput]) -> None:
    """One call's output by rank, attached to the report of the phase (setup, call, teardown) it ran in."""
    if outputs:
        item.stash.setdefault(OUTPUTS_KEY, []).append(outputs)


def rank_sections(calls: list[dict[int, RankOutput]]) -> list[tuple[str, str]]:
    """(report section key, text) for each rank and stream that wrote anything in `calls`, by rank: a rank's
    calls merged in order and capped as one, its text labelled for junit.xml, where the keys do not show."""
    by_rank: dict[int, list[RankOutput]] = {}
    for call in calls:
        for rank, output in call.items():
            by_rank.setdefault(rank, []).append(output)
    sections = []
    for rank, outputs in sorted(by_rank.items()):
        merged = merge(outputs, RANK_OUTPUT_BYTES)
        for stream, text in (("stdout", printable(merged.stdout)), ("stderr", printable(merged.stderr))):
            if text:
                ending = "" if text.endswith("\n") else "\n"
                sections.append((f"{stream} (rank {rank})", f"--- rank {rank} {stream} ---\n{text}{ending}"))
    return sections


def attaching(item: pytest.Item, when: str):
    """The body of a phase's hook wrapper (`yield from`): run the phase, then attach what the ranks wrote in it."""
    failed = True
    try:
        result = yield
        failed = False
        return result
    finally:
        attach(item, when, failed)


def attach(item: pytest.Item, when: str, failed: bool) -> None:
    """The phase's rank output as report sections, within the session's budget."""
    sections = rank_sections(item.stash.get(OUTPUTS_KEY, []))
    item.stash[OUTPUTS_KEY] = []
    if not sections:
        return
    size = sum(len(text.encode()) for _, text in sections)
    budget = item.config.stash.setdefault(BUDGET_KEY, JunitBudget())
    if not budget.take(size, failed):
        note = (f"[{size:,} bytes the ranks wrote are left out: this session's reports already hold "
                f"{budget.used:,} bytes of rank output, and {'failing' if failed else 'passing'} tests stop at "
                f"{budget.limit(failed):,} bytes]\n")
        sections = [("stderr (ranks)", note)]
    for key, text in sections:
        item.add_report_section(when, key, text)


def _new_log(config: pytest.Config) -> Path:
    """The rank log, empty: the one the command line or the ini names, else one in a temporary folder."""
    named, ini = config.getoption("ranks_log"), config.getini("ranks_log")
    if named or ini:
        # The command line's path is the caller's (from where pytest started); the ini's, the ini file's.
        log = Path(named).absolute() if named else (config.inipath.parent if config.inipath else config.rootpath) / ini
        log.parent.mkdir(parents=True, exist_ok=True)
    else:
        folder = Path(tempfile.mkdtemp(prefix="harness-ranks-"))
        config.stash[TEMPORARY_LOG_KEY] = folder
        log = folder / RANKS_LOG
    log.write_bytes(b"")
    return log


def _log(config: pytest.Config) -> Path | None:
    capture = config.stash.get(CAPTURE_KEY, None)
    return Path(capture.log) if capture is not None and capture.log else None
