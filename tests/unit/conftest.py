"""Fixtures shared by the unit tests' modules; their helpers are modules of their own (fake_github.py, ...).

A cell that runs a suite below tests/unit (slurm_suite/, from test_slurm.py) loads this file too: nothing here is
autouse, and it imports nothing but the standard library, pytest and those helpers at the top."""

from __future__ import annotations

import importlib.metadata
import socket
import threading
from http.server import ThreadingHTTPServer

import pytest
from fake_github import REPO, TOKEN, FakeGitHub, Handler

# --------------------------------------------------------------------------- the local GitHub API (fake_github.py)


@pytest.fixture
def fake():
    """The local stand-in for GitHub's API, served on 127.0.0.1; its state and request log."""
    state = FakeGitHub()
    handler = type("BoundHandler", (Handler,), {"fake": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    state.base = f"http://127.0.0.1:{server.server_port}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


@pytest.fixture
def sleeps(monkeypatch):
    """The waits `harness gh` asked for (retries, rate limits), recorded instead of slept."""
    from harness.github import api as github_api

    waited: list[float] = []
    monkeypatch.setattr(github_api, "sleep", waited.append)
    return waited


@pytest.fixture
def env(fake, tmp_path, monkeypatch, sleeps):
    """The GITHUB_* environment of an Actions step, pointing at `fake`; returns the GITHUB_OUTPUT file."""
    outputs = tmp_path / "github_output"
    outputs.write_text("")
    for key in ("GITHUB_ACTIONS", "GITHUB_RUN_ID", "GITHUB_SERVER_URL", "GITHUB_SHA"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("GITHUB_API_URL", fake.base)
    for key in ("no_proxy", "NO_PROXY"):  # a proxy configured for the machine must not see these requests
        monkeypatch.setenv(key, "127.0.0.1,localhost")
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("GITHUB_REPOSITORY", REPO)
    monkeypatch.setenv("GITHUB_OUTPUT", str(outputs))
    return outputs


# --------------------------------------------------------------------------- the package index (harness.plan.versions)


@pytest.fixture
def pip_index(monkeypatch):
    """The package index as pip lists it, newest first; records which packages were asked. It lists the installed
    torch and transformers, and torch 0.0.1: the release test_run's broken-environment cells pin, so their build
    starts (and fails offline)."""
    from harness.plan import versions

    torch, transformers = (importlib.metadata.version(name).split("+")[0] for name in ("torch", "transformers"))
    index = {"torch": ["0.0.1", "2.11.0", "2.12.0", torch, "2.14.0rc1"],
             "transformers": ["5.9.0", "5.20.0", transformers]}
    asked = []

    def ask_pip(package, pre):
        asked.append(package)
        listed = [v for v in index[package] if pre or "rc" not in v]
        return f"{package} ({listed[-1]})\nAvailable versions: {', '.join(reversed(listed))}\n"

    monkeypatch.setattr(versions, "ask_pip", ask_pip)
    versions._cached.cache_clear()
    yield asked
    versions._cached.cache_clear()


# Where pip looks, and how often it retries: set by the fixtures below for this process and the harness processes a
# test starts, so none of them asks the internet.
PIP_SOURCES = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX", "PIP_RETRIES",
               "HARNESS_INDEX_URL", "HARNESS_EXTRA_INDEX_URL", "HARNESS_FIND_LINKS")


def _pip_sees_only(monkeypatch, **variables: str) -> None:
    from harness.plan import versions

    for name in PIP_SOURCES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")  # the machine's pip.conf may name other indexes
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    versions._cached.cache_clear()


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """`local_index({"torch": ["2.13.0"], ...})`: a folder of empty wheels as the only index, for real
    `pip index versions` (it reads releases from the file names alone)."""
    def serve(releases: dict[str, list[str]]):
        folder = tmp_path / "local-index"
        folder.mkdir(exist_ok=True)
        for package, listed in releases.items():
            for release in listed:
                (folder / f"{package}-{release}-py3-none-any.whl").write_bytes(b"")
        _pip_sees_only(monkeypatch, PIP_NO_INDEX="1", HARNESS_FIND_LINKS=str(folder))
        return folder

    yield serve
    from harness.plan import versions

    versions._cached.cache_clear()


@pytest.fixture
def unreachable_index(monkeypatch):
    """An index URL whose port refuses connections (bound, never listening), asked by real pip with one retry (its
    warning is what says the index was not reached; the retry waits nothing). Returns the URL."""
    refusing = socket.socket()
    refusing.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{refusing.getsockname()[1]}/simple"
    _pip_sees_only(monkeypatch, PIP_INDEX_URL=url, PIP_RETRIES="1")
    yield url
    refusing.close()
    from harness.plan import versions

    versions._cached.cache_clear()
