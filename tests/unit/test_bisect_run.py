"""`harness bisect` end to end on this machine: a small package of our own in a local git repository,
each commit built from source into a cached environment over the cell's, real pytest runs of a small
suite, real results folders; the answer and every exit code checked."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from harness.cli import main

SUITE = """\
import os
import pytest
import tinypkg

def test_value():
    if tinypkg.MODE == "skip":
        pytest.skip("needs tinypkg>=0.2 for value")
    if tinypkg.MODE == "wobble":
        # Fails on the first run of each results folder's probe, passes on the next: outcomes differ.
        marker = os.path.join(os.environ["TINY_STATE"], tinypkg.__commit__)
        if not os.path.exists(marker):
            open(marker, "w").close()
            assert False, "first run fails"
    assert tinypkg.value() == 1, f"value() is {tinypkg.value()}"


def test_unrelated():
    assert False, "never selected: each bisect here selects test_value"
"""


def commit(repo: Path, message: str, mode: str = "ok", value: int = 1) -> str:
    (repo / "tinypkg").mkdir(exist_ok=True)
    (repo / "tinypkg" / "__init__.py").write_text(
        f'MODE = "{mode}"\n__commit__ = "{message.split()[0]}"\n\ndef value():\n    return {value}\n'
    )
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", message], check=True
    )
    return subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A git repository of tinypkg, a suite that tests it, and a cpu matrix of this interpreter's versions
    (so the cell's environment is this interpreter and only tinypkg is built per commit)."""
    repo = tmp_path / "tinypkg-src"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "pyproject.toml").write_text(
        textwrap.dedent("""\
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "tinypkg"
        version = "0.1.0"
        [tool.setuptools]
        packages = ["tinypkg"]
        """)
    )
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\n")
    (suite / "test_tiny.py").write_text(SUITE)
    matrix = tmp_path / "tiny.yaml"
    torch, transformers = (importlib.metadata.version(name).split("+")[0] for name in ("torch", "transformers"))
    matrix.write_text(
        f'axes: {{gpu: [cpu], gpus: [2], torch: ["{torch}"], transformers: ["{transformers}"]}}\n'
        f"suite: [{suite}]\ntimeout_minutes: 5\n"
    )
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("TINY_STATE", str(state))
    return {"repo": repo, "matrix": matrix, "tmp": tmp_path}


def bisect(project, *arguments: str) -> tuple[int, dict | None]:
    out = project["tmp"] / "bisect.json"
    out.unlink(missing_ok=True)
    code = main(
        [
            "bisect",
            "--matrix",
            str(project["matrix"]),
            "--package",
            "tinypkg",
            "--repo",
            str(project["repo"]),
            "--results",
            str(project["tmp"] / "results"),
            "--env-dir",
            str(project["tmp"] / "envs"),
            "--json",
            str(out),
            *arguments,
            *([] if "--" in arguments else ["--", "-k", "test_value"]),
        ]
    )
    return code, json.loads(out.read_text()) if out.exists() else None


def test_a_regression_between_commits_is_found_then_found_again_from_the_cache(project, capsys):
    repo = project["repo"]
    shas = [
        commit(repo, "c0 first"),
        commit(repo, "c1 docs"),
        commit(repo, "c2 value is 2", value=2),
        commit(repo, "c3 more"),
        commit(repo, "c4 even more", value=2),
    ]
    code, first = bisect(project, "--good", shas[0], "--bad", shas[-1])
    shown = capsys.readouterr().out
    assert code == 0, shown
    assert first["line"].startswith(f"first bad: tinypkg {shas[2][:12]} (last good {shas[1][:12]}) · test_value · ")
    assert (first["first"], first["last"], first["test"]) == (shas[2][:12], shas[1][:12], "test_value")
    assert "value() is 2" in first["message"]
    assert first["environments_built"] == len(first["probes"]) <= 2 + 2
    for probe in first["probes"]:  # each probe keeps an ordinary results folder
        assert (Path(probe["folders"][0]) / "junit.xml").is_file()
    assert f"  tinypkg {shas[0][:12]} c0 first" in shown and "pass" in shown

    code, again = bisect(project, "--good", shas[0], "--bad", shas[-1])
    assert (code, again["first"], again["environments_built"]) == (0, shas[2][:12], 0)

    # What the builds left is bisect's own kind: env clean keeps it unless asked, and nothing else is there.
    envs = project["tmp"] / "envs"
    built = sorted(path.name for path in envs.iterdir() if path.is_dir())
    assert len(built) == first["environments_built"] and all("-tinypkg@" in name for name in built)
    capsys.readouterr()
    assert main(["env", "list", "--env-dir", str(envs)]) == 0
    assert f"bisect-commit: tinypkg {shas[2][:12]}" in capsys.readouterr().out
    assert main(["env", "clean", "--env-dir", str(envs), "--all"]) == 0
    assert f"kept {len(built)} bisect commit environments" in capsys.readouterr().out
    assert main(["env", "clean", "--env-dir", str(envs), "--all", "--include-bisect"]) == 0
    assert not any(path.is_dir() for path in envs.iterdir())


def test_a_fix_between_commits(project):
    repo = project["repo"]
    shas = [commit(repo, "c0 broken", value=2), commit(repo, "c1 fixed"), commit(repo, "c2 after")]
    test_id = f"{project['tmp'] / 'suite' / 'test_tiny.py'}::test_value"  # an id replaces the suite
    code, result = bisect(project, "--good", shas[-1], "--bad", shas[0], "--", test_id)
    assert (code, result["kind"], result["first"], result["last"]) == (0, "fix", shas[1][:12], shas[0][:12])
    assert result["line"].startswith(f"first good: tinypkg {shas[1][:12]} (last bad {shas[0][:12]}) · test_value")


def test_untestable_commits_are_skipped_over_and_said(project, capsys):
    repo = project["repo"]
    shas = [commit(repo, "c0 floor", mode="skip"), commit(repo, "c1 ok"), commit(repo, "c2 broken", value=2)]
    code, result = bisect(project, "--good", shas[0], "--bad", shas[-1])
    # The good end skips (below the floor), so the search moves inward to c1, which passes.
    assert (code, result["first"], result["last"]) == (0, shas[2][:12], shas[1][:12])
    assert [probe["verdict"] for probe in result["probes"]] == ["untestable", "pass", "fail"]
    assert "untestable" in capsys.readouterr().out and "needs tinypkg>=0.2" in result["probes"][0]["note"]


def test_a_flaky_commit_stops_the_search(project):
    repo = project["repo"]
    shas = [commit(repo, "c0 ok"), commit(repo, "c1 wobble", mode="wobble"), commit(repo, "c2 broken", value=2)]
    code, result = bisect(project, "--runs", "2", "--good", shas[0], "--bad", shas[-1])
    assert code == 1 and result["found"] is False
    assert result["line"] == (
        f"no boundary: tinypkg {shas[1][:12]} c1 wobble is flaky (test_tiny.py::test_value: failed in run 1, "
        "passed in run 2); stopped rather than guess"
    )


def test_a_good_end_that_fails_too_names_its_failing_tests_for_triage(project):
    """The nightly's evidence that a crash is the machine's: the same test fails on the last good build."""
    repo = project["repo"]
    shas = [commit(repo, "c0 broken", value=2), commit(repo, "c1 broken too", value=2)]
    code, record = bisect(project, "--good", shas[0], "--bad", shas[-1])
    assert (code, record["same_verdict"]) == (2, "fail")
    assert [test.rsplit("::", 1)[-1] for test in record["failing_at_good"]] == ["test_value"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--good", "nosuchref", "--bad", "HEAD"], "--good 'nosuchref': no such commit in"),
        (
            ["--good", "HEAD", "--bad", "HEAD~1", "--", "-k", "nothing_matches"],
            "nothing selected: pytest collected no tests",
        ),
        (["--good", "HEAD~1", "--bad", "HEAD"], "good and bad give the same verdict"),
    ],
)
def test_bad_input_exits_2_with_one_line(project, capsys, arguments, message):
    repo = project["repo"]
    commit(repo, "c0 ok")
    commit(repo, "c1 ok")
    code, _ = bisect(project, *arguments)
    error = capsys.readouterr().err
    assert code == 2 and message in error and len(error.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ["--package", "transformers", "--good", "5.99.0", "--bad", "5.20.0"],
            "transformers 5.99.0: no such release on the package index",
        ),
        (
            ["--package", "transformers", "--good", "5.20.0", "--bad", "5.20.0"],
            "--good and --bad name the same versions",
        ),
        (["--package", "numpy", "--good", "1.0", "--bad", "2.0"], "--package 'numpy': expected one of torch"),
        (
            ["--package", "transformers", "--good", "5.19.0", "--bad", "5.20.0", "--runs", "0"],
            "--runs 0: expected a whole number >= 1",
        ),
        (
            ["--package", "transformers", "--good", "5.19.0", "--bad", "5.20.0", "--cell", "h200-*"],
            "no cell matches --cell h200-*",
        ),
        (["--good", "5.19.0", "--bad", "5.20.0"], "--good '5.19.0': say which package"),
    ],
)
def test_release_bisect_bad_input_exits_2_before_any_probe(tmp_path, monkeypatch, capsys, arguments, message):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for release in ("5.19.0", "5.20.0"):
        (wheels / f"transformers-{release}-py3-none-any.whl").write_bytes(b"")
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("HARNESS_FIND_LINKS", str(wheels))
    results = tmp_path / "results"
    assert main(["bisect", "--matrix", "cpu", "--results", str(results), *arguments]) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and len(error.splitlines()) == 1
    assert not results.exists()  # nothing ran
