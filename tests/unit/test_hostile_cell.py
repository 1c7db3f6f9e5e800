"""A cell's test that hides a process from the cell's end: a new session (out of pytest's process group), a
clean environment (no HARNESS_CELL_TOKEN) and a double fork (out of pytest's process tree). `harness run`
still ends it, as a child subreaper (Linux)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from process_helpers import is_alive

from harness.ranks import lifecycle

pytest.importorskip("torch")
REPO = Path(__file__).resolve().parents[2]
TORCH, TRANSFORMERS = (__import__("importlib.metadata").metadata.version(name).split("+")[0]
                       for name in ("torch", "transformers"))

ESCAPING_SUITE = """
import os
import time
from pathlib import Path


def test_leaves_a_process_behind():
    record = Path(os.environ["ESCAPED_PID_FILE"])
    if os.fork() == 0:
        os.setsid()  # a session and group of its own
        if os.fork() == 0:  # the grandchild: orphaned at once, its parent exits
            record.write_text(str(os.getpid()))
            os.execve("/bin/sleep", ["sleep", "100000"], {})  # an environment without the cell's token
        os._exit(0)
    while not record.exists() or not record.read_text():
        time.sleep(0.05)
"""


@pytest.mark.skipif(not lifecycle.adopt_orphans(False), reason="needs PR_SET_CHILD_SUBREAPER (Linux)")
def test_a_process_that_dropped_the_token_and_left_the_tree_ends_with_the_cell(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_escape.py").write_text(ESCAPING_SUITE)
    matrix = tmp_path / "escape.yaml"
    matrix.write_text(textwrap.dedent(f"""
        axes: {{gpu: [cpu], gpus: [1], torch: ["{TORCH}"], transformers: ["{TRANSFORMERS}"]}}
        suite: ["{suite}"]
        timeout_minutes: 10
    """))
    record = tmp_path / "escaped.pid"
    environ = {**os.environ, "ESCAPED_PID_FILE": str(record),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "harness", "run", "--matrix", str(matrix), "--results",
                           str(tmp_path / "results"), "--env-dir", str(tmp_path / "envs")],
                          env=environ, cwd=tmp_path, capture_output=True, text=True, timeout=540)
    escaped = int(record.read_text())
    try:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert not is_alive(escaped), f"pid {escaped} outlived its cell"
    finally:
        if is_alive(escaped):
            os.kill(escaped, 9)


def test_descendants_lists_the_whole_tree_below_a_process():
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; "
                              "subprocess.run(['sleep', '100000'])"])
    try:
        while not lifecycle.descendants(child.pid):  # until the child started its own
            time.sleep(0.05)
        [grandchild] = lifecycle.descendants(child.pid)
        assert {child.pid, grandchild} <= lifecycle.descendants(os.getpid())
    finally:
        child.kill()
        child.wait()
