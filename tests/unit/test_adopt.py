"""`harness init`: the starter a repository gets, the example repository that is its output, and the
callers' workflows keeping the same safety rules as harness's own."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from workflow_rules import RULES, load, uses_pinned, zizmor

from harness.cli import main
from harness.github.adopt import starter_files
from harness.plan.matrix import load_matrix

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "adopter"
EXAMPLE_USES = "your-org/harness@0123456789abcdef0123456789abcdef01234567"  # a placeholder: init takes only a full sha


@pytest.fixture
def repository(tmp_path, monkeypatch):
    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True)
    (tmp_path / "repo" / "src").mkdir()
    monkeypatch.chdir(tmp_path / "repo" / "src")
    monkeypatch.delenv("HARNESS_MATRICES_DIR", raising=False)
    return tmp_path / "repo"


def test_the_example_repository_is_what_init_writes():
    for relative, text in starter_files(EXAMPLE_USES, None).items():
        assert (EXAMPLE / relative).read_text() == text, f"examples/adopter/{relative} differs from harness init"


def test_init_writes_the_starter_at_the_repository_root_and_overwrites_nothing(repository, capsys):
    assert main(["init", "--uses", "acme/harness@" + "a" * 40]) == 0
    written = {
        str(path.relative_to(repository))
        for path in repository.rglob("*")
        if path.is_file() and ".git" not in path.parts
    }
    assert written == {
        "matrices/runners.yaml",
        "matrices/cpu.yaml",
        "matrices/gpu.yaml",
        ".github/workflows/harness-ok-to-test.yml",
        ".github/workflows/harness-nightly.yml",
    }
    caller = (repository / ".github/workflows/harness-nightly.yml").read_text()
    assert f"uses: acme/harness/.github/workflows/gpu-tests.yml@{'a' * 40}" in caller
    assert f'harness: "git+https://github.com/acme/harness@{"a" * 40}"' in caller
    assert [cell.id for cell in load_matrix("gpu").cells] == ["ada-2gpu-torch2.13.0-tf5.25.0"]
    assert load_matrix("cpu").path == repository / "matrices" / "cpu.yaml"
    capsys.readouterr()
    assert main(["init", "--uses", "acme/harness@" + "b" * 40]) == 2
    assert "exists; harness init overwrites nothing without --force" in capsys.readouterr().err
    assert main(["init", "--uses", "acme/harness@" + "b" * 40, "--force", "--harness", "harness==0.1.0"]) == 0
    assert 'harness: "harness==0.1.0"' in (repository / ".github/workflows/harness-nightly.yml").read_text()


def test_init_outside_a_git_repository_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["init", "--uses", EXAMPLE_USES]) == 0
    error = capsys.readouterr().err
    assert error.startswith(f"harness: warning: {tmp_path.resolve()} is not a git repository: ")
    assert (tmp_path / "matrices" / "cpu.yaml").exists()


def test_init_in_a_git_repository_warns_of_nothing(repository, capsys):
    assert main(["init", "--uses", EXAMPLE_USES]) == 0
    assert capsys.readouterr().err == ""


def test_the_readme_installs_the_adopting_package_as_the_example_says():
    """Step 1 installs the repository itself too (-e .), as examples/adopter/README.md does: without it the
    starter's `install: ["-e ."]` makes the first `harness run` build a second environment."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    step = next(line for line in readme.splitlines() if line.endswith("# 1. install harness and your package"))
    example = next(line for line in (EXAMPLE / "README.md").read_text().splitlines() if line.startswith("pip install"))
    assert step.split("#")[0].rstrip().endswith(" -e .") and example.endswith(" -e .")


def test_init_help_asks_for_a_full_commit_sha_and_says_a_tag_is_refused(capsys):
    """--uses takes only a full sha (FULL_SHA): the help said "at a commit or tag"."""
    with pytest.raises(SystemExit):
        main(["init", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--uses OWNER/NAME@SHA" in help_text and "full 40-character commit sha" in help_text
    assert "or tag" not in help_text and "@REF" not in help_text
    assert "a tag or branch can be moved to other code: refused" in help_text


def test_init_refuses_a_malformed_uses_in_one_line(repository, capsys):
    assert main(["init", "--uses", "acme-harness"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "expected OWNER/NAME@SHA" in err


@pytest.mark.parametrize("ref", ["v0.1.0", "main", "0123456", "A" * 40])
def test_init_refuses_a_ref_that_can_move_naming_how_to_find_its_sha(repository, capsys, ref):
    assert main(["init", "--uses", f"acme/harness@{ref}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{ref!r} is not a full commit sha" in err
    assert f"git ls-remote https://github.com/acme/harness {ref}" in err
    assert not (repository / ".github").exists()


def test_the_steps_holding_a_token_run_no_installed_code():
    """authorize holds pull-requests: write: its steps run harness's stdlib-only gh command from the source
    checked out at the pinned commit; nothing in the job installs anything."""
    text = starter_files("acme/harness@" + "a" * 40, None)[".github/workflows/harness-ok-to-test.yml"]
    authorize = load(text)["jobs"]["authorize"]
    checkout = authorize["steps"][0]
    assert checkout["with"] == {"repository": "acme/harness", "ref": "a" * 40, "path": ".harness",
                                "persist-credentials": False}
    for step in authorize["steps"]:
        assert "pip" not in step.get("run", "") and "setup-python" not in step.get("uses", "")
        if "GITHUB_TOKEN" in step.get("env", {}):
            assert step["run"].startswith("python3 -m harness gh ") and step["working-directory"] == ".harness"


def test_zizmor_finds_nothing_in_what_init_writes(repository):
    assert main(["init", "--uses", "acme/harness@" + "a" * 40]) == 0
    result = zizmor(repository / ".github" / "workflows")
    assert result.returncode == 0 and json.loads(result.stdout or "[]") == [], result.stdout[-3000:]


@pytest.mark.parametrize("name", ["harness-ok-to-test.yml", "harness-nightly.yml"])
def test_the_callers_keep_harnesss_workflow_rules(name):
    text = starter_files("acme/harness@" + "a" * 40, None)[f".github/workflows/{name}"]
    workflow = load(text)
    for rule in RULES:
        problems = rule(workflow, text, name.removeprefix("harness-"))  # the same jobs as harness's own
        if rule is uses_pinned:  # the call of harness's workflow carries no "# tag"; every action does
            problems = [problem for problem in problems if "acme/harness/.github/workflows" not in problem]
        assert problems == [], (rule.__name__, problems)
    called = [job for job in workflow["jobs"].values() if "uses" in job]
    assert called and all(set(job["with"]) >= {"matrix", "sha", "harness"} for job in called)
