"""Every `HARNESS_*` environment variable harness and its suite read: one `Variable` each, in `VARIABLES`.

A module reads a variable through the constant named here (`CPU_RANKS_ENV`: the name less `HARNESS_`, plus `_ENV`).
docs/reference/environment.md is rendered from `VARIABLES` (docs/gen_reference.py), and tests/unit/test_environment.py
fails when code under harness/ or tests/gpu/ names a variable missing here, or when a listed reader or writer no
longer names its variable. Imports nothing, so every layer may import it.
"""

from __future__ import annotations

import dataclasses

USER = "user"  # you set it, or leave it unset
HARNESS = "harness"  # harness sets it for the processes it starts (a cell's pytest, its hosts); never set it yourself

# Where packages come from (harness.plan.index): every environment harness builds, and every version lookup.
INDEX_URL_ENV = "HARNESS_INDEX_URL"
EXTRA_INDEX_URL_ENV = "HARNESS_EXTRA_INDEX_URL"
FIND_LINKS_ENV = "HARNESS_FIND_LINKS"
INSTALLER_ARGS_ENV = "HARNESS_INSTALLER_ARGS"
# The environments (harness.envs.build).
INSTALLER_ENV = "HARNESS_INSTALLER"
ENV_DIR_ENV = "HARNESS_ENV_DIR"
# The plan (harness.plan.files).
MATRICES_DIR_ENV = "HARNESS_MATRICES_DIR"
# A run on this host (harness.run, harness.cell, harness.containment).
BUSY_THRESHOLD_MIB_ENV = "HARNESS_BUSY_THRESHOLD_MIB"
GPU_LOCK_DIR_ENV = "HARNESS_GPU_LOCK_DIR"
CELL_CGROUP_ENV = "HARNESS_CELL_CGROUP"
# The ranks plugin, in any pytest session (harness.ranks).
CPU_RANKS_ENV = "HARNESS_CPU_RANKS"
RANKS_POOL_ENV = "HARNESS_RANKS_POOL"
RANKS_TIMING_ENV = "HARNESS_RANKS_TIMING"
# The suite (tests/gpu).
KNOWN_BUGS_AS_OF_ENV = "HARNESS_KNOWN_BUGS_AS_OF"
# Set by harness for its own processes.
CELL_ID_ENV = "HARNESS_CELL_ID"
RUNNING_TEST_FILE_ENV = "HARNESS_RUNNING_TEST_FILE"
CELL_TOKEN_ENV = "HARNESS_CELL_TOKEN"
PORT_SLOT_ENV = "HARNESS_PORT_SLOT"
HOSTS_ENV = "HARNESS_HOSTS"
HOST_RANKS_ENV = "HARNESS_HOST_RANKS"
HUB_ENV = "HARNESS_HUB"
HOSTS_CREDENTIALS_ENV = "HARNESS_HOSTS_CREDENTIALS"
HOST_CAUSE_ENV = "HARNESS_HOST_CAUSE"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Variable:
    """One environment variable: who sets it, what it does, what holds while it is unset, and which code reads it."""

    name: str
    set_by: str  # USER or HARNESS
    what: str
    default: str = ""  # what holds while it is unset; a HARNESS variable's: how a process outside harness runs
    read_by: tuple[str, ...]  # modules that read it: harness's dotted, the suite's as a path from the repository root
    written_by: tuple[str, ...] = ()  # harness's modules that set it in the environment of a process they start


VARIABLES: tuple[Variable, ...] = (
    # --- set by you ---
    Variable(name=INDEX_URL_ENV, set_by=USER, read_by=("harness.plan.index",),
             what="The package index every environment is built from and every version is looked up on "
                  "(`latest`, pins checked by `harness matrix`): a CUDA torch index or a mirror.",
             default="the installer's own configuration (pip's or uv's; PyPI unless it names another)"),
    Variable(name=EXTRA_INDEX_URL_ENV, set_by=USER, read_by=("harness.plan.index",),
             what="More indexes beside it, space-separated. With uv and more than one source, harness adds "
                  "`--index-strategy unsafe-best-match`: a CUDA index and PyPI both carry torch.",
             default="none"),
    Variable(name=FIND_LINKS_ENV, set_by=USER, read_by=("harness.plan.index",),
             what="Folders or pages of wheels, space-separated, for builds and version lookups alike.",
             default="`$PIP_FIND_LINKS` (pip reads it itself; harness hands it to uv)"),
    Variable(name=INSTALLER_ARGS_ENV, set_by=USER, read_by=("harness.plan.index",),
             what="More options for the installer when it builds an environment, shell-quoted. Version lookups "
                  "(`pip index versions`) leave them out.",
             default="none"),
    Variable(name=INSTALLER_ENV, set_by=USER, read_by=("harness.envs.build",),
             what="`uv` or `pip`: what builds the cells' environments. Any other value is an error.",
             default="uv when it is beside this Python or on PATH, else pip"),
    Variable(name=ENV_DIR_ENV, set_by=USER, read_by=("harness.envs.build",),
             what="The cache folder of per-cell environments (`harness run`, `harness bisect`, `harness env`); "
                  "`--env-dir` wins over it.",
             default="`~/.cache/harness/envs`"),
    Variable(name=MATRICES_DIR_ENV, set_by=USER, read_by=("harness.plan.files",),
             what="A folder of named matrices and a runners.yaml, looked up before the repository's `matrices/` "
                  "and the shipped ones.",
             default="none: the repository's `matrices/`, then the shipped matrices"),
    Variable(name=BUSY_THRESHOLD_MIB_ENV, set_by=USER, read_by=("harness.run.prepare",),
             what="MiB of memory other processes may hold on a cell's GPU before the cell refuses to start "
                  "(error kind `busy_gpus`). Read once per harness process.",
             default="2048"),
    Variable(name=GPU_LOCK_DIR_ENV, set_by=USER, read_by=("harness.cell.gpulock",),
             what="The folder of per-GPU lock files that keep two harness runs on one host off the same GPU. "
                  "Runs that should exclude each other need the same folder; a link or another user's folder is "
                  "refused.",
             default="`harness-gpu-locks` in the system's temporary folder"),
    Variable(name=CELL_CGROUP_ENV, set_by=USER, read_by=("harness.containment.cgroup",),
             what="`auto` gives each cell a cgroup of its own where the host allows one; `off` leaves cgroups "
                  "alone, and the child subreaper ends the cell's processes. `harness run` refuses any other value "
                  "before the first cell.",
             default="`auto`"),
    Variable(name=CPU_RANKS_ENV, set_by=USER, read_by=("harness.ranks.plugin",),
             written_by=("harness.engines.base", "harness.engines.host", "harness.upstream.repro"),
             what="How many CPU ranks (gloo) the `ranks` fixture has where CUDA is not available; a test needing "
                  "more skips. `harness run` sets it to a CPU cell's `gpus`, `harness host --cpu-ranks` to hosts "
                  "times ranks per host, and `harness repro` raises it where it is unset, so that a case of any "
                  "world size is written.",
             default="2"),
    Variable(name=RANKS_POOL_ENV, set_by=USER, read_by=("harness.ranks.plugin",),
             written_by=("harness.upstream.repro",),
             what="The rank pool: `0` spawns fresh ranks for every call, `1` forks the pool's ranks from a "
                  "zygote, `spawn` keeps a pool of spawned ranks. `--ranks-pool`/`--no-ranks-pool` win over it; "
                  "it wins over the ini `ranks_pool`. A cell across hosts needs the forked pool. `harness repro` "
                  "sets `0` for the pytest it runs.",
             default="the ini `ranks_pool` (default true: forked)"),
    Variable(name=RANKS_TIMING_ENV, set_by=USER, read_by=("harness.ranks.pool",),
             what="A file that gets one JSON line per call of the ranks: each rank's seconds in the function and "
                  "the call's wall time (tests/benchmarks/bench_pool.py reads it). Only a regular file is "
                  "appended to.",
             default="no timings written"),
    Variable(name=KNOWN_BUGS_AS_OF_ENV, set_by=USER, read_by=("tests/gpu/upstream/known_bugs.py",),
             what="A transformers release V: the suite keeps only the known-bug entries known when V was the "
                  "newest release (a torch bug's entry always), so a run on the next release shows what that "
                  "release day would have.",
             default="every entry"),
    # --- set by harness for its own processes ---
    Variable(name=CELL_ID_ENV, set_by=HARNESS, read_by=(),
             written_by=("harness.engines.base", "harness.engines.jobset"),
             what="The cell's id (`ada-2gpu-torch2.11.0-tf5.9.0`), in the environment of the cell's pytest under "
                  "every engine, for the cell's tests to read. Harness itself reads it nowhere.",
             default="pytest outside a cell"),
    Variable(name=RUNNING_TEST_FILE_ENV, set_by=HARNESS, read_by=("harness.ranks.plugin",),
             written_by=("harness.engines.local",),
             what="The path of the cell's `running-test.txt`: the ranks plugin writes the running test's id there "
                  "and removes it when the test ends, so a cell stopped mid-test names the test. The workers of "
                  "a packed session run without it: their coordinator names the test (harness.ranks.packing).",
             default="no file written"),
    Variable(name=CELL_TOKEN_ENV, set_by=HARNESS, read_by=("harness.containment.cell_token", "harness.ranks.hostenv"),
             written_by=("harness.containment.containment",),
             what="A random token in the environment of a cell's first process, inherited by everything the cell "
                  "starts: at the cell's end, harness kills every process of this user that carries it. Each "
                  "host keeps its own.",
             default="unset: nothing is found by token"),
    Variable(name=PORT_SLOT_ENV, set_by=HARNESS, read_by=("harness.ranks.ports",),
             written_by=("harness.run.packed",),
             what="`INDEX/COUNT`: the share of the ports below the ephemeral range that the INDEX-th of COUNT cells "
                  "packed on one host may bind, so no two of them pick one port.",
             default="every port below the ephemeral range"),
    Variable(name=HOSTS_ENV, set_by=HARNESS, read_by=("harness.ranks.hosts",), written_by=("harness.engines.host",),
             what="How many hosts the cell spans, set by `harness host` on host 0's pytest. Above 1, the ranks "
                  "plugin places ranks on the other hosts through the hub, and needs `HARNESS_HOST_RANKS`, "
                  "`HARNESS_HUB` and `HARNESS_HOSTS_CREDENTIALS` too.",
             default="1: a cell on one host"),
    Variable(name=HOST_RANKS_ENV, set_by=HARNESS, read_by=("harness.ranks.hosts",),
             written_by=("harness.engines.host",),
             what="Ranks per host in a cell across hosts (`harness host --ranks-per-host`).",
             default="unset (a cell on one host)"),
    Variable(name=HUB_ENV, set_by=HARNESS, read_by=("harness.ranks.hosts",), written_by=("harness.engines.host",),
             what="`address:port` of the hub on host 0 that every other host's agent dials.",
             default="unset (a cell on one host)"),
    Variable(name=HOSTS_CREDENTIALS_ENV, set_by=HARNESS, read_by=("harness.ranks.hosts", "harness.ranks.hostenv"),
             written_by=("harness.engines.host",),
             what="The path of the cell's TLS key and certificate, which the engine wrote (never their content). "
                  "Each host keeps its own.",
             default="unset (a cell on one host)"),
    Variable(name=HOST_CAUSE_ENV, set_by=HARNESS, read_by=("harness.ranks.hosts",),
             written_by=("harness.engines.host",),
             what="The file where host 0 writes, as JSON, the first host it lost (`harness host --cause-file`; the "
                  "cell's `host-lost.json`).",
             default="no file written"),
)
