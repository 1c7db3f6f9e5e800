"""Small throwaway suites, a one-cell matrix running one, and `harness run` on it: shared by the run tests
(test_run.py, test_preflight.py)."""

from __future__ import annotations

import importlib.metadata
import json
import textwrap
from pathlib import Path

from harness.cli import main

TORCH = importlib.metadata.version("torch").split("+")[0]
TRANSFORMERS = importlib.metadata.version("transformers").split("+")[0]

SUITES = {
    "passing": """
        def test_one():
            assert 1 + 1 == 2

        def test_two(record_property):
            record_property("max_rel_grad_error", 0.001)
    """,
    "failing": """
        def test_ok():
            pass

        def test_broken():
            assert 1 == 2, "one is not two"
    """,
    "crashing": """
        import os, signal

        def test_dies():
            os.kill(os.getpid(), signal.SIGKILL)
    """,
    "hanging": """
        import os, subprocess, sys, time

        def test_hangs():
            # a child like a rank process: the cell's timeout must take it down too
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
            open(os.environ["CHILD_PID_FILE"], "w").write(str(child.pid))
            time.sleep(300)
    """,
    "empty": """
        x = 1
    """,
    # The tested code ends pytest as an interrupt would (pytest exits 2): nobody interrupted harness.
    "self-interrupting": """
        def test_ok():
            pass

        def test_says_interrupted():
            raise KeyboardInterrupt
    """,
    # The ranks fixture with a trivial function: on one rank both world sizes skip before any rank starts.
    "distributed": """
        import pytest

        def plus_one(value):
            return value + 1

        @pytest.mark.parametrize("world_size", [2, 4])
        def test_on_ranks(ranks, world_size):
            assert ranks.run(world_size, plus_one, 1) == [2] * world_size

        def test_in_one_process():
            pass
    """,
    "chatty": """
        import os

        def say_hello():
            os.write(1, b"a rank says hello\\n")

        def test_ranks_talk(ranks):
            ranks.run(2, say_hello)
    """,
}


def write_matrix(tmp_path: Path, suite: str, *, torch: str = TORCH, timeout_minutes: float = 5,
                 ranks: int = 2) -> str:
    return str(write_suite_matrix(tmp_path / f"suite_{suite}", f"test_{suite}.py", textwrap.dedent(SUITES[suite]),
                                  tmp_path / f"{suite}.yaml", torch=torch, timeout_minutes=timeout_minutes,
                                  ranks=ranks))


def write_suite_matrix(suite_dir: Path, test_file: str, source: str, path: Path, *, torch: str = TORCH,
                       timeout_minutes: float = 5, test_timeout_seconds: int | None = 120, ranks: int = 2) -> Path:
    """`source` as suite_dir/test_file, and at `path` a one-cell CPU matrix running that folder at the installed
    transformers (so `harness run` reuses this interpreter); `test_timeout_seconds` None: the matrix default."""
    suite_dir.mkdir(exist_ok=True)
    (suite_dir / test_file).write_text(source)
    path.write_text(textwrap.dedent(f"""
        axes: {{gpu: [cpu], gpus: [{ranks}], torch: ["{torch}"], transformers: ["{TRANSFORMERS}"]}}
        suite: ["{suite_dir}"]
        timeout_minutes: {timeout_minutes}
    """) + ("" if test_timeout_seconds is None else f"test_timeout_seconds: {test_timeout_seconds}\n"))
    return path


def cell_folder(results: Path, torch: str = TORCH, ranks: int = 2) -> Path:
    return results / f"cpu-{ranks}rank-torch{torch}-tf{TRANSFORMERS}"


def run(tmp_path: Path, matrix: str, *extra: str) -> int:
    return main(["run", "--matrix", matrix, "--results", str(tmp_path / "results"),
                 "--env-dir", str(tmp_path / "envs"), *extra])


def write_packed_matrix(folder: Path, suite: list[str], runners: dict[str, dict], *, gpus: list[int],
                        timeout_minutes: float = 5, test_timeout_seconds: int = 120) -> str:
    """A matrix crossing `runners` (written to the runners.yaml beside it, e.g. with pack: true) with `gpus`, at
    the installed torch and transformers, running `suite` (paths from the project root)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "runners.yaml").write_text("".join(f"{name}: {json.dumps(entry)}\n" for name, entry in runners.items()))
    path = folder / "packed.yaml"
    path.write_text(json.dumps({"axes": {"gpu": list(runners), "gpus": gpus, "torch": [TORCH],
                                         "transformers": [TRANSFORMERS]},
                                "suite": suite, "timeout_minutes": timeout_minutes,
                                "test_timeout_seconds": test_timeout_seconds}))
    return str(path)
