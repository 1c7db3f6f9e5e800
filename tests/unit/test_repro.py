"""`harness repro TEST_ID`: the suite writes one case's standalone reproducer (tests/gpu/upstream/repro_writer.py) and
harness hands it back, or says in one line why not (exit 2). Real runs: harness as a user runs it, pytest on the real
suite, the written script run alone on 2 CPU ranks."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "tests" / "gpu"
# The cheapest known red of the suite's release (transformers 5.24.0): sarvam_moe's EP load raises.
SARVAM_EP = "tests/gpu/test_training.py::test_training_steps[sarvam_moe-ep-2-float32-wide]"
SARVAM_BUG = "sarvam-fused-qkv-split"


def harness_repro(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "repro", *arguments], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def sarvam_script(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("repro") / "sarvam_moe_ep.py"
    done = harness_repro(SARVAM_EP, "-o", str(path))
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"repro written to {path}\n"
    return path


def imported_modules(tree: ast.Module) -> set[str]:
    """The top-level package of every import statement, anywhere in the script."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.add((node.module or "").split(".")[0])
    return found


def test_a_written_script_compiles_and_imports_torch_and_transformers_alone(sarvam_script):
    text = sarvam_script.read_text()
    tree = ast.parse(text)
    compile(tree, str(sarvam_script), "exec")
    imported = imported_modules(tree)
    assert imported <= set(sys.stdlib_module_names) | {"torch", "transformers"}, imported
    suite_modules = {path.stem for path in SUITE.glob("*.py")} | {path.parent.name for path in SUITE.glob("*/*.py")}
    assert not imported & suite_modules
    assert "harness" not in imported and "import harness" not in text
    docstring = ast.get_docstring(tree)
    import torch
    import transformers

    assert docstring.startswith(f"Reproduces {SARVAM_EP} ")
    assert f"transformers {transformers.__version__} and torch {torch.__version__}" in docstring
    assert "Its weights: identical to the suite's tiny checkpoint" in docstring


@pytest.mark.parametrize(("test_id", "reason"), [
    ("tests/gpu/test_training.py::test_training_steps[no_such_family-ep-2-float32-wide]", "not found: "),
    ("tests/gpu/test_no_such_file.py::test_it", "names no test file under the project root"),
])
def test_an_unknown_test_id_exits_2_with_one_line(test_id, reason):
    done = harness_repro(test_id)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("harness: error: "), done.stderr
    assert reason in done.stderr


CANARY = "CANARY"
HOSTILE = [
    # (arguments after `harness repro`, what the one line says)
    ([f";touch {CANARY}"], "names no test file"),
    ([f"tests/gpu/test_fsdp2.py;touch {CANARY}"], "names no test file"),
    ([f"$(touch {CANARY})"], "names no test file"),
    (["tests/gpu/test_fsdp2.py\n-p evil"], "holds a control character"),
    (["--", "-p evil"], "is not a test id"),
    (["--", "--help"], "is not a test id"),
    (["@/etc/hostname"], "is not a test id"),
    (["../../../etc/hostname"], "names no test file under the project root"),
    (["/etc/hostname"], "names no test file under the project root"),
]


@pytest.mark.parametrize(("arguments", "reason"), HOSTILE)
def test_a_hostile_test_id_is_refused_or_inert(tmp_path, arguments, reason):
    arguments = [argument.replace(CANARY, str(tmp_path / CANARY)) for argument in arguments]
    done = harness_repro(*arguments)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and reason in done.stderr, done.stderr
    assert not (tmp_path / CANARY).exists() and not (ROOT / CANARY).exists()


def known_bug(key: str):
    """The known-bugs table's entry (tests/gpu/upstream/known_bugs.py, imported by name as the suite's modules are)."""
    if str(SUITE) not in sys.path:
        sys.path.insert(0, str(SUITE))
    from upstream import known_bugs

    return next(bug for bug in known_bugs.KNOWN_BUGS if bug.key == key)


@pytest.mark.end_to_end
def test_a_written_script_reproduces_its_known_bug_alone_on_two_cpu_ranks(sarvam_script, tmp_path):
    """Run by the plain interpreter from another folder, with nothing of the checkout on its path; under a minute."""
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    done = subprocess.run([sys.executable, str(sarvam_script)], cwd=tmp_path, env=environment, capture_output=True,
                          text=True, timeout=120, check=False)
    bug = known_bug(SARVAM_BUG)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED on rank" in done.stdout
    first = re.search(r"^rank \d+: (\w+): (.*)$", done.stdout, re.MULTILINE)
    assert first is not None and first[1] == bug.raises and re.search(bug.match, first[2]), done.stdout
