"""Releases on the package index (real `pip index versions` against a local folder of wheels), their
order, and floating matrix versions (`latest`, `latest-N`) resolved when a matrix expands."""

from __future__ import annotations

import json
import textwrap

import pytest

from harness.cli import main
from harness.errors import ConfigError
from harness.plan import versions
from harness.plan.cells import Runner
from harness.plan.matrix import expand

TRANSFORMERS = ["5.9.0", "5.19.0", "5.20.0", "5.20.1", "5.21.0rc1", "5.21.0", "5.23.0", "5.24.0.dev0"]
TORCH = ["2.11.0", "2.13.0"]
RUNNERS = {"cpu": Runner(name="cpu", labels=("ubuntu-latest",), gpus=0, ranks=4)}


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A folder of wheels standing in for the index; pip reads releases from the file names alone."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    for package, releases in (("transformers", TRANSFORMERS), ("torch", TORCH)):
        for release in releases:
            (folder / f"{package}-{release}-py3-none-any.whl").write_bytes(b"")
    (folder / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")  # a local build
    for name in versions.INDEX_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")  # nothing but this folder
    monkeypatch.setenv("HARNESS_FIND_LINKS", str(folder))
    return folder


def test_releases_come_from_the_index_oldest_first_finals_only(index):
    assert versions.available_versions("transformers") == ["5.9.0", "5.19.0", "5.20.0", "5.20.1", "5.21.0", "5.23.0"]


def test_pre_releases_count_only_when_asked(index):
    listed = versions.available_versions("transformers", pre=True)
    assert listed[-4:] == ["5.21.0rc1", "5.21.0", "5.23.0", "5.24.0.dev0"]


def test_releases_between_two_versions_in_either_order(index):
    expected = ["5.19.0", "5.20.0", "5.20.1", "5.21.0", "5.23.0"]
    assert versions.releases_between("transformers", "5.23.0", "5.19.0") == expected
    assert versions.releases_between("transformers", "5.19.0", "5.23.0") == expected


def test_an_unknown_version_is_bad_input_naming_nearby_releases(index):
    with pytest.raises(
        ConfigError,
        match=r"transformers 5\.20\.9: no such release on the package index; "
        r"nearby: 5\.20\.0, 5\.20\.1",
    ) as raised:
        versions.releases_between("transformers", "5.20.9", "5.23.0")
    assert raised.value.return_code == 2


def test_a_package_missing_from_the_index_is_bad_input(index):
    with pytest.raises(versions.VersionLookupError, match="accelerate: the package index has no releases for it"):
        versions.available_versions("accelerate")


@pytest.mark.parametrize(
    ("value", "expected"), [("latest", "5.23.0"), ("latest-1", "5.21.0"), ("latest-5", "5.9.0"), ("5.20.0", "5.20.0")]
)
def test_latest_and_latest_n(index, value, expected):
    assert versions.resolve_floating("transformers", value) == expected


def test_latest_with_pre_releases(index):
    assert versions.resolve_floating("transformers", "latest", pre=True) == "5.24.0.dev0"


def test_ordering_is_pep_440_not_text():
    assert versions.ordered(["5.10.0", "5.9.0", "5.10.0rc1", "5.9.1"]) == ["5.9.0", "5.9.1", "5.10.0rc1", "5.10.0"]


# --------------------------------------------------------------------------- floating versions in a matrix


def floating_spec(transformers):
    return {"axes": {"gpu": ["cpu"], "gpus": [2], "torch": ["latest"], "transformers": transformers}}


def test_expansion_resolves_floating_versions_into_the_cell_id():
    asked = []

    def resolve(package, value):
        asked.append((package, value))
        return {"torch": {"latest": "2.13.0"}, "transformers": {"latest": "5.23.0", "latest-1": "5.21.0"}}[package][
            value
        ]

    cells = expand(floating_spec(["latest", "latest-1", "5.9.0"]), RUNNERS, name="m", source="m.yaml", resolve=resolve)
    assert [cell.id for cell in cells] == [
        "cpu-2rank-torch2.13.0-tf5.23.0",
        "cpu-2rank-torch2.13.0-tf5.21.0",
        "cpu-2rank-torch2.13.0-tf5.9.0",
    ]
    assert cells[0].to_json()["transformers"] == "5.23.0"  # what env.json and reports show
    assert sorted(asked) == [("torch", "latest"), ("transformers", "latest"), ("transformers", "latest-1")]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "latest-x",
            "m.yaml: axes.transformers: 'latest-x': malformed version (expected e.g. 2.11.0, latest or latest-1)",
        ),
        ("newest", "m.yaml: axes.transformers: 'newest': malformed version"),
        (
            "latest-99",
            "m.yaml: axes.transformers: 'latest-99': cannot resolve: transformers latest-99: the index lists "
            "only 6 releases",
        ),
    ],
)
def test_bad_or_unresolvable_floating_versions_name_the_file_and_key(index, value, message):
    with pytest.raises(ConfigError) as raised:
        expand(floating_spec([value]), RUNNERS, name="m", source="m.yaml", resolve=versions.resolve_floating)
    assert str(raised.value).startswith(message)


def test_harness_matrix_resolves_latest_from_the_index(index, tmp_path, capsys):
    matrix = tmp_path / "floating.yaml"
    matrix.write_text(
        textwrap.dedent("""\
        axes:
          gpu: [cpu]
          gpus: [2]
          torch: ["latest"]
          transformers: ["latest", "latest-2"]
        exclude:
          - {transformers: "latest-2"}
        include:
          - {gpu: cpu, gpus: 2, torch: "latest-1", transformers: "latest-2"}
        """)
    )
    assert main(["matrix", "--matrix", str(matrix), "--format", "json"]) == 0
    cells = json.loads(capsys.readouterr().out)
    assert [(cell["id"], cell["transformers"]) for cell in cells] == [
        ("cpu-2rank-torch2.13.0-tf5.23.0", "5.23.0"),
        ("cpu-2rank-torch2.11.0-tf5.20.1", "5.20.1"),
    ]


def test_harness_matrix_exits_2_when_latest_cannot_resolve(index, tmp_path, capsys):
    matrix = tmp_path / "floating.yaml"
    matrix.write_text('axes: {gpu: [cpu], gpus: [2], torch: ["latest-7"], transformers: ["5.9.0"]}\n')
    assert main(["matrix", "--matrix", str(matrix)]) == 2
    error = capsys.readouterr().err.strip()
    assert error == (
        f"harness: error: {matrix}: axes.torch: 'latest-7': cannot resolve: torch latest-7: "
        "the index lists only 2 releases"
    )
