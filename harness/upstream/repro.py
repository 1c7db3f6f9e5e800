"""`harness repro TEST_ID [-o FILE]`: a standalone script (torch and transformers only) that reproduces one suite
case's failure, for an upstream issue.

pytest runs exactly that test, in this interpreter, from the project root, with `--harness-write-repro=FILE`: the
suite (tests/gpu/upstream/repro_writer.py) writes the case's script in place of launching its ranks, and the test skips.
Where no script comes back, how the test ended (its junit.xml, else pytest's own error) says why, in one line.

The test id is untrusted text: it reaches pytest as one argument, never through a shell, and only where it names a
test file under the project root (not an option, an @argument file or a path elsewhere, whose conftest would run).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.contract import WRITE_REPRO_OPTION
from harness.environment import CPU_RANKS_ENV, RANKS_POOL_ENV
from harness.errors import ConfigError, FatalError
from harness.project import project_root
from harness.results.junit import read_junit
from harness.results.model import Outcome

# What pytest leads its error lines with (its usage errors, a node id it cannot find).
PYTEST_ERROR = "ERROR: "
NO_TESTS_COLLECTED = 5  # pytest.ExitCode.NO_TESTS_COLLECTED
WRITABLE_CPU_RANKS = 64  # more than any world size the suite runs


def command(args: argparse.Namespace) -> int:
    root = project_root()
    test_id = checked_test_id(args.test_id, root)
    if sys.stderr.isatty():  # pytest takes a while; a caller reading stderr gets one line, the error's, or none
        print(f"harness: writing the reproducer of {test_id} (pytest runs it in {sys.executable})", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="harness-repro-") as folder:
        script, junit = Path(folder) / "repro.py", Path(folder) / "junit.xml"
        done = run_pytest(test_id, script, junit, root)
        if not script.is_file():
            raise not_written(test_id, done, junit)
        text = script.read_text(encoding="utf-8")
    if args.output is None:
        sys.stdout.write(text)
        return 0
    output = Path(args.output)
    output.write_text(text, encoding="utf-8")
    print(f"repro written to {output}")
    return 0


def checked_test_id(test_id: str, root: Path) -> str:
    """The test id where it can only name a test: refused where pytest would read it as an option or an @argument
    file, where it holds a control character, or where its file is not a file under the project root."""
    shown = ascii(test_id)[:200]
    if not test_id.strip() or test_id[0] in "-@":
        raise ConfigError(f"test id {shown} is not a test id (pytest would read it as an option or an argument file)")
    if any(ord(character) < 32 or ord(character) == 127 for character in test_id):
        raise ConfigError(f"test id {shown} holds a control character")
    file = test_id.split("::", 1)[0]
    path = (root / file).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        raise ConfigError(f"test id {shown} names no test file under the project root {root}")
    return test_id


def run_pytest(test_id: str, script: Path, junit: Path, root: Path) -> subprocess.CompletedProcess:
    """pytest on exactly `test_id`; `-m ""` selects it whatever marks the configuration leaves out by default."""
    arguments = [sys.executable, "-m", "pytest", test_id, "-p", "no:cacheprovider", "-q", "-m", "",
                 f"{WRITE_REPRO_OPTION}={script}", f"--junitxml={junit}"]
    # No ranks are launched: no rank pool to start, and on CPU a case of any world size is written.
    environment = dict(os.environ, **{RANKS_POOL_ENV: "0"})
    environment.setdefault(CPU_RANKS_ENV, str(WRITABLE_CPU_RANKS))
    return subprocess.run(arguments, cwd=root, env=environment, capture_output=True, text=True, check=False)


def not_written(test_id: str, done: subprocess.CompletedProcess, junit: Path) -> FatalError:
    """Why pytest wrote no script: the test skipped (a case the writer cannot express, or that does not run here),
    failed or errored before the writer; or pytest selected no test."""
    tests = read_junit(junit).tests
    if not tests:
        return ConfigError(f"no reproducer for {test_id}: {pytest_error(done)}")
    test = tests[0]
    if test.outcome is Outcome.SKIPPED:
        return ConfigError(f"no reproducer for {test_id}: {test.message}")
    return FatalError(f"no reproducer for {test_id}: the test {test.outcome.value} before the writer ran: "
                      f"{test.message}")


def pytest_error(done: subprocess.CompletedProcess) -> str:
    """pytest's own reason in one line: it selected no test, or its first error line."""
    if done.returncode == NO_TESTS_COLLECTED:
        return "it selects no test"
    lines = (done.stdout + "\n" + done.stderr).splitlines()
    errors = [line.removeprefix(PYTEST_ERROR).strip() for line in lines
              if line.startswith(PYTEST_ERROR) and not line.startswith(PYTEST_ERROR + "usage:")]
    if errors:
        return errors[0]
    unknown = [line.split("error: ", 1)[1] for line in lines if "error: unrecognized arguments" in line]
    if unknown:
        return f"pytest: {unknown[0]} (no conftest there takes it: is it a case of the suite, tests/gpu?)"
    last = next((line.strip() for line in reversed(lines) if line.strip()), "no output")
    return f"pytest exited {done.returncode} without writing it: {last}"
