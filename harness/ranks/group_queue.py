"""A packed group's tests, which its workers take one at a time (harness.ranks.packing).

A worker that finishes a test takes the next from the group's one queue, so no worker idles while another still
has a list of its own: a fixed split per worker, without earlier durations to weigh the tests, left the device's
16 cores waiting on the slowest worker's list (178.6 s of test time against 147.6 s taken from one queue, simulated
on the run's own durations). The queue is two files in the group's folder: `queue.json`, the tests in the order
they start, and `claims.jsonl`, one line per test taken and by which worker, appended under an exclusive lock. The
log is also how the coordinator knows, after a worker died, which test it was in and which it held next.

Needs the standard library only.
"""

from __future__ import annotations

import fcntl
import functools
import json
from collections.abc import Sequence
from pathlib import Path

QUEUE_FILE = "queue.json"
CLAIMS_FILE = "claims.jsonl"


class GroupQueue:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @classmethod
    def create(cls, folder: Path, tests: Sequence[str]) -> GroupQueue:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / QUEUE_FILE).write_text(json.dumps(list(tests)), encoding="utf-8")
        (folder / CLAIMS_FILE).write_text("", encoding="utf-8")
        return cls(folder)

    @functools.cached_property
    def tests(self) -> list[str]:
        """The queue's tests in the order they are taken (written once, at create: read once per process)."""
        return json.loads((self.folder / QUEUE_FILE).read_text(encoding="utf-8"))

    def claim(self, worker: str) -> str | None:
        """The next test no worker has taken, now `worker`'s; None once every test is taken."""
        tests = self.tests
        with open(self.folder / CLAIMS_FILE, "a+", encoding="utf-8") as claims:
            fcntl.flock(claims, fcntl.LOCK_EX)  # released when the file closes
            claims.seek(0)
            taken = sum(1 for line in claims if line.strip())
            if taken >= len(tests):
                return None
            claims.write(json.dumps({"test": tests[taken], "worker": worker}) + "\n")
            return tests[taken]

    def claimed_by(self, worker: str) -> list[str]:
        """The tests `worker` took, in the order it took (and so ran) them."""
        return [claim["test"] for claim in self._claims() if claim["worker"] == worker]

    def unclaimed(self) -> list[str]:
        taken = {claim["test"] for claim in self._claims()}
        return [test for test in self.tests if test not in taken]

    def _claims(self) -> list[dict[str, str]]:
        text = (self.folder / CLAIMS_FILE).read_text(encoding="utf-8")
        return [json.loads(line) for line in text.splitlines() if line.strip()]
