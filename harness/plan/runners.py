"""runners.yaml: the GPU types a matrix may name, where their jobs land and what one runner offers.

The shipped file is read first; each runners.yaml that wins over it (the repository's matrices/,
$HARNESS_MATRICES_DIR, the one beside a matrix file) replaces the types it names."""

from __future__ import annotations

import os
from pathlib import Path

from harness.errors import ConfigError
from harness.plan.cells import ENGINES, Runner, parse_submit
from harness.plan.files import matrix_dirs, non_negative_int, positive_int, read_yaml, reject_unknown_keys, same_folder
from harness.project import project_root

# The keys of one GPU type's entry, and what each means (docs/reference/matrices.md is rendered from this table).
RUNNER_KEYS = {
    "labels": "Required: the `runs-on` labels of the type's jobs, a non-empty list.",
    "gpus": "Required: GPUs one runner has; 0 for CPU ranks.",
    "nvml_name": "The start of the GPU's name as NVML reports it: `harness run` without `--matrix` picks the type "
                 "whose `nvml_name` this machine's GPU name starts with.",
    "ranks": "CPU ranks one runner can run; required when `gpus` is 0. Default 0.",
    "ephemeral": "`true`: every job gets a fresh machine or container and nothing is kept; only such runners take "
                 "a pull request's cells. Default `false`.",
    "engine": f"What starts a cell's hosts, one of {', '.join(f'`{name}`' for name in ENGINES)}. Default `local`.",
    "hosts": "The most hosts one cell of the type may span. Default 1.",
    "submit": "What the engine needs, a mapping; each engine's keys are listed below the table.",
    "pack": "`true`: one runner's host runs several cells at once, each on GPUs (or cores) of its own; only with "
            "`engine: local` and `hosts: 1`. Default `false`.",
}


def load_runners(root: Path | None = None, beside: Path | None = None) -> dict[str, Runner]:
    """The shipped runners, updated by each runners.yaml that wins over them: the repository's matrices/,
    $HARNESS_MATRICES_DIR, and the one beside a matrix file (`beside`, its folder)."""
    folders = [folder for _origin, folder in reversed(matrix_dirs(root or project_root()))]
    if beside is not None and not any(same_folder(beside, folder) for folder in folders):
        folders.append(beside)
    runners: dict[str, Runner] = {}
    for folder in folders:
        if os.path.lexists(folder / "runners.yaml"):
            runners.update(read_runners(folder / "runners.yaml"))
    return runners


def read_runners(path: Path) -> dict[str, Runner]:
    data = read_yaml(path)
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{path}: expected a mapping of GPU type to runner")
    runners = {}
    for name, entry in data.items():
        where = f"{path}: {name}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: expected a mapping with labels and gpus")
        reject_unknown_keys(entry, RUNNER_KEYS, where)
        labels = entry.get("labels")
        if not isinstance(labels, list) or not labels or not all(isinstance(x, str) for x in labels):
            raise ConfigError(f"{where}.labels: expected a non-empty list of strings")
        gpus = non_negative_int(entry.get("gpus"), f"{where}.gpus")
        ranks = non_negative_int(entry.get("ranks", 0), f"{where}.ranks")
        if gpus == 0 and ranks == 0:
            raise ConfigError(f"{where}: a runner with gpus: 0 needs ranks (CPU ranks it can run)")
        ephemeral = entry.get("ephemeral", False)
        if not isinstance(ephemeral, bool):
            raise ConfigError(f"{where}.ephemeral: expected true or false, got {ephemeral!r}")
        engine = entry.get("engine", "local")
        if engine not in ENGINES:
            raise ConfigError(f"{where}.engine: {engine!r}: expected one of {', '.join(ENGINES)}")
        hosts = positive_int(entry.get("hosts", 1), f"{where}.hosts")
        pack = read_pack(entry.get("pack", False), engine=engine, hosts=hosts, where=f"{where}.pack")
        runners[name] = Runner(name=name, labels=tuple(labels), gpus=gpus, nvml_name=entry.get("nvml_name"),
                               ranks=ranks, ephemeral=ephemeral, engine=engine, hosts=hosts,
                               submit=parse_submit(entry.get("submit"), f"{where}.submit"), pack=pack)
    return runners


def read_pack(value: object, *, engine: str, hosts: int, where: str) -> bool:
    """`pack:`: whether one runner's host runs several cells at once, each on its own GPUs (or cores). Only a
    runner whose cells run on its own single host can: an engine's cells get hosts of their own."""
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if value and engine != "local":
        raise ConfigError(f"{where}: only a runner with engine: local packs cells on its host; engine {engine} "
                          "gives each cell hosts of its own")
    if value and hosts > 1:
        raise ConfigError(f"{where}: a runner whose cells span {hosts} hosts cannot pack them on one host")
    return value
