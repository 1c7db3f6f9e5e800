"""The results-folder contract, written once: what `harness run` and the suite write into
`results/<cell-id>/`, and what `harness.results` reads back.

A new metric is one constant here, the suite's `ranks.record(NAME, value)`, and the rendering that
shows it. The file names, the env.json record and the property names are not spelled anywhere else.
Standard library only: `harness gh` and the suite import it on runners that installed nothing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

SCHEMA = 1  # env.json and memory.json carry it; the reader says when a folder speaks another

# Files of one cell folder.
JUNIT_XML = "junit.xml"
ENV_JSON = "env.json"
MEMORY_JSON = "memory.json"
PYTEST_LOG = "pytest.log"
INSTALL_LOG = "install.log"
CONTRACT_FILES = (JUNIT_XML, ENV_JSON, MEMORY_JSON, PYTEST_LOG)  # a folder holding any of them is a cell
# A cell across hosts also leaves: each host's output (HOST_LOG.format(index=I)), the engine's job script,
# and (when a host went silent or its agent's connection closed) which host that was, as host 0 saw it.
HOST_LOG = "host{index}.log"
JOB_SCRIPT = "job.sh"
JOB_MANIFEST = "jobset.yaml"
HOST_LOST_JSON = "host-lost.json"
HOST_MEMORY_JSON = "memory.host{index}.json"  # host I's own memory.json; harness merges them into memory.json
# The id of the test that is running, written when it starts and removed when it ends (harness.ranks.plugin):
# left in the folder, it names the test a timeout, a crash or an interrupt stopped. Its path reaches pytest
# through $HARNESS_RUNNING_TEST_FILE (harness.environment).
RUNNING_TEST = "running-test.txt"
# Beside the cells, in the results folder: the earlier runs `harness run` kept aside, one folder each, named by when
# that run began (harness.run.earlier). A cell on one host starts its longest tests first, by their seconds in the
# newest kept run of the same cell (harness.results.durations).
EARLIER_FOLDER = ".earlier"
# `harness repro TEST_ID` runs pytest on that test with this option (the suite's upstream/repro_writer.py takes it): the
# case's standalone reproducer is written to the option's FILE in place of launching its ranks, and the test skips.
WRITE_REPRO_OPTION = "--harness-write-repro"
# What the ranks wrote outside any test's call (the zygote's imports, a pool's start); what they write in a call
# is that test's, in junit.xml (harness.ranks.sections).
RANKS_LOG = "ranks.log"
# A junit.xml beyond this is not one a suite of thousands of tests writes; parsing 100 MB costs minutes and over
# a GB of memory, so harness.results refuses it unread.
JUNIT_BYTES = 32 * 1024 * 1024
# The ranks' output one session attaches to its test reports (junit.xml's system-out and system-err), at most:
# a chatty suite still leaves a junit.xml that can be read.
RANK_OUTPUT_JUNIT_BYTES = JUNIT_BYTES // 2

# env.json "status". not_run: nothing failed, but no distributed case (world size 2 or more) ran while some
# were skipped for too few GPUs or ranks (the typed properties below say so): neither passed nor failed.
STATUS_PASSED = "passed"
STATUS_FAILED = "failed"  # tests failed
STATUS_ERRORED = "errored"  # the cell itself broke: `error` and `error_kind` say why
STATUS_NOT_RUN = "not_run"
STATUSES = (STATUS_PASSED, STATUS_FAILED, STATUS_ERRORED, STATUS_NOT_RUN)

# env.json "error_kind": why a cell errored, as data (bisect and triage read it; "error" is its words for people).
ERROR_ENVIRONMENT = "environment"  # the cell's packages could not be installed
ERROR_BUSY_GPUS = "busy_gpus"  # its GPUs were in use before it began
ERROR_TIMEOUT = "timeout"  # ran past the cell's timeout and was killed: a hang, or too slow
ERROR_SIGNAL = "signal"  # pytest itself died of a signal (a crash, the OOM killer)
ERROR_INTERRUPTED = "interrupted"  # harness or pytest was interrupted (SIGTERM, Ctrl-C, a cancelled job)
# The code under test sent harness SIGTERM or SIGINT (a process of the cell, or a sender gone before harness could
# tell whose it was): a red of that code, not an interruption (harness.engines.interruption)
ERROR_SIGNALLED_HARNESS = "signalled_harness"
ERROR_COLLECTION = "collection"  # the suite could not be collected
ERROR_NO_TESTS = "no_tests"  # nothing was collected
ERROR_NO_JUNIT = "no_junit"  # pytest ended without writing junit.xml
ERROR_PYTEST = "pytest"  # pytest's internal or usage error, or an exit code it does not document
ERROR_HARNESS = "harness"  # harness itself failed
ERROR_ENGINE = "engine"  # a multi-host cell's engine ended it and cannot say why (a job that vanished, ended Failed)
# A host of the cell was lost, as harness saw it: host 0 heard no heartbeat from it or its agent's connection closed
# (host-lost.json), or the scheduler failed its node (Slurm NODE_FAIL, BOOT_FAIL).
ERROR_HOST_LOST = "host_lost"
ERRORS_BEFORE_PYTEST = (ERROR_ENVIRONMENT, ERROR_BUSY_GPUS)  # pytest never started: no junit.xml or pytest.log
ERROR_KINDS = (ERROR_ENGINE, ERROR_HOST_LOST, ERROR_ENVIRONMENT, ERROR_BUSY_GPUS, ERROR_TIMEOUT, ERROR_SIGNAL,
               ERROR_INTERRUPTED, ERROR_SIGNALLED_HARNESS, ERROR_COLLECTION, ERROR_NO_TESTS, ERROR_NO_JUNIT,
               ERROR_PYTEST, ERROR_HARNESS)

# env.json "cleanup": how the cell's processes were ended when it ended (harness.containment.containment), and whether
# any survived. The mechanism is the strongest one the host offered:
CLEANUP_CGROUP = "cgroup"  # the cell's own cgroup (v2), killed whole: no fork leaves it
CLEANUP_SUBREAPER = "subreaper"  # no cgroup: harness, the cell's child subreaper, killed every descendant (pidfds)
CLEANUP_TOKEN = "token"  # neither (not Linux): every process carrying the cell's token in its environment
CLEANUP_MECHANISMS = (CLEANUP_CGROUP, CLEANUP_SUBREAPER, CLEANUP_TOKEN)

# What the suite records per test case (record_property, through `ranks.record`). A failing check
# records its metrics before it raises, so a red case still shows its numbers.
GRAD_ERROR = "max_rel_grad_error"
GRAD_BOUND = "grad_error_bound"
GRAD_ERROR_PARAM = "max_rel_grad_error_param"  # the parameter whose gradient had the largest error
# A metric named with this prefix is a minimum: over ranks the smallest is kept (tests/gpu: rank_cases.summarize).
MINIMUM_PREFIX = "min_"
ROUTING_MARGIN = f"{MINIMUM_PREFIX}routing_margin"
LOGITS_DIFFERENCE = "max_logits_difference"
LOGITS_ATOL = "logits_atol"  # the logits' bound: largest |sharded - float64| allowed
# The whole model's own distance from the float64 reference, in the case's dtype on this machine: the rounding
# the bounds above are a stated multiple of (tests/gpu/checks/tolerances.py), recorded beside them.
WHOLE_GRAD_ERROR = "whole_rel_grad_error"
WHOLE_LOGITS_DIFFERENCE = "whole_logits_difference"
PEAK_ALLOCATED_PREFIX = "peak_allocated_mib."  # + "rank" and the rank (harness.ranks.plugin)
PEAK_RESERVED_PREFIX = "peak_reserved_mib."  # likewise: the allocator's reserved peak
# Training cases (tests/gpu/training/steps.py): the steps taken, then per step k (from 1) the sharded run's loss and
# global gradient norm, and the whole model's loss beside it; a resume case says after which step it resumed.
TRAIN_STEPS = "train_steps"
LOSS_STEP = "loss_step_{step}"
WHOLE_LOSS_STEP = "whole_loss_step_{step}"
GRAD_NORM_STEP = "grad_norm_step_{step}"
RESUMED_AT_STEP = "resumed_at_step"
# "made" or "reused": whether a training case ran the whole model's loops itself or compared with the identical
# ones an earlier layout of its family ran in the same rank process (tests/gpu/training/steps.py, WholeRuns)
WHOLE_RUNS = "whole_runs"
# A case a library refused on this device before any step (accelerate's ParallelismConfig on CPU ranks): its
# message, recorded before the case is not run with it (tests/gpu/training/user_loops.py)
REFUSED_BY_LIBRARY = "refused_by_library"
PARAM_ERROR = "max_rel_param_error"  # the updated parameters' worst relative error against float64, any step
PARAM_BOUND = "param_error_bound"
PARAM_ERROR_PARAM = "max_rel_param_error_param"  # "step K: NAME"
CASE_METRICS = (GRAD_ERROR, GRAD_BOUND, GRAD_ERROR_PARAM, ROUTING_MARGIN, LOGITS_DIFFERENCE, LOGITS_ATOL)
# (WHOLE_GRAD_ERROR and WHOLE_LOGITS_DIFFERENCE are the evidence behind each bound, recorded for the nightly's
# history and tests/gpu/checks/noise_table.py; the reports show the bound itself.)
# A case that plants a defect on purpose (a deliberate-bug or negative test) names it: its error over the bound is
# the expected outcome, not noise a correct run left (tests/gpu/checks/noise_table.py leaves it out).
PLANTED_DEFECT = "planted_defect"
# The rank pool's note on a test whose calls left a rank unlike a fresh one: "pool replaced after TEST: why".
POOL_REPLACED = "rank_pool_replaced"
# The ranks fixture: a case that launched records its world size (before launching, so a failed case has it too);
# a case skipped because the host has too few GPUs or ranks records, before it skips, what it needed and what the
# host has (a count and its unit). Reports count "not run" from these, never from the skip's words.
WORLD_SIZE = "world_size"
NEEDS_WORLD_SIZE = "needs_world_size"
HOST_RANKS = "host_ranks"
HOST_RANK_UNIT = "host_rank_unit"
RANK_UNIT_GPUS = "GPUs"  # NCCL, one GPU per rank
RANK_UNIT_CPU = "ranks"  # gloo on CPU (HARNESS_CPU_RANKS)
RANK_UNITS = (RANK_UNIT_GPUS, RANK_UNIT_CPU)
# How a launch of the ranks fixture failed, as the launcher saw it (harness.ranks.plugin records it before the error
# propagates): a rank exited without a result (a signal, the OOM killer, os._exit), ranks still ran at the launch's
# deadline, or a host of the cell was lost. Triage reads it, never the error's words: a lost host is infrastructure;
# a dead rank or a hang is a real failure, and infrastructure only where the last good build fails so too.
LAUNCH_FAILED = "launch_failed"
LAUNCH_RANK_DIED = "rank_died"
LAUNCH_TIMED_OUT = "timed_out"
LAUNCH_HOST_LOST = "host_lost"
LAUNCH_FAILURES = (LAUNCH_RANK_DIED, LAUNCH_TIMED_OUT, LAUNCH_HOST_LOST)
# The model family a suite case ran (tests/gpu: rank_cases); EP coverage counts a family where one of its
# distributed cases ran.
FAMILY = "family"
# What else names a suite case beside its family (tests/gpu: rank_cases.case_metrics, and the noise table's key).
CASE_LAYOUT = "layout"
CASE_DTYPE = "dtype"
CASE_EXPERTS_IMPLEMENTATION = "experts_implementation"

# What the suite records once per run (record_testsuite_property).
EP_FAMILIES_DECLARED = "ep_families_declared"  # comma-separated model_type names
EP_FAMILIES_COVERED = "ep_families_covered"  # those the suite can run; reports count one where a case of it ran
EP_FAMILIES_NOT_COVERED = "ep_families_not_covered"  # a JSON object: model_type -> why the suite cannot run it
TRANSFORMERS_VERSION = "transformers_version"
SUITE_PROPERTIES = (EP_FAMILIES_DECLARED, EP_FAMILIES_COVERED, EP_FAMILIES_NOT_COVERED, TRANSFORMERS_VERSION)

# The PR comment starts with this line, so the next run finds and edits it (harness gh, no jinja2 needed).
COMMENT_MARKER = "<!-- harness-report -->"
COMMENT_LIMIT = 65_536  # characters GitHub accepts in a comment or issue body: every renderer and poster fits to it

# Nightly triage's class of a new red (triage.json "class"; harness.results.triage says how each is decided).
TRIAGE_KNOWN_UPSTREAM = "known upstream bug"
TRIAGE_FLAKY = "flaky"
TRIAGE_INFRASTRUCTURE = "infrastructure"
TRIAGE_REAL = "real failure"
TRIAGE_CLASSES = (TRIAGE_KNOWN_UPSTREAM, TRIAGE_FLAKY, TRIAGE_INFRASTRUCTURE, TRIAGE_REAL)

# A known upstream bug is a strict xfail whose reason starts with this; its XPASS says the other. Words for people:
# what the report and triage decide by are the properties below.
KNOWN_BUG_PREFIX = f"{TRIAGE_KNOWN_UPSTREAM}: "
FIXED_UPSTREAM = "fixed upstream: close the range"
# The suite's known-bugs table (tests/gpu/upstream/table/) names the entry it matched, by the entry's key: a case whose
# failure an entry explained (an expected failure) carries KNOWN_BUG; a covered case that passed (the strict xfail's
# XPASS, "fixed upstream") carries KNOWN_BUG_FIXED, the keys of the entries covering it, comma-separated. Triage's
# "known upstream bug" is a red carrying KNOWN_BUG_FIXED, nothing else. The values are untrusted: a key is
# KNOWN_BUG_KEY_PATTERN of at most KNOWN_BUG_KEY_CHARS characters, at most KNOWN_BUG_KEYS of them.
KNOWN_BUG = "known_bug"
KNOWN_BUG_FIXED = "known_bug_fixed"
KNOWN_BUG_KEY_PATTERN = r"[a-z0-9]+(?:[-_.][a-z0-9]+)*"
KNOWN_BUG_KEY_CHARS = 64
KNOWN_BUG_KEYS = 8

# A case the suite's own code could not build or shape on the installed release (its tiny config refused by the
# config class, an experts layout or router its registry does not know, inputs it cannot make): a gap of the harness,
# never a red of the code under test and never a pass. The case is skipped with a reason starting NOT_BUILT_PREFIX
# and carries the NOT_BUILT property (the reason, untrusted text, at most NOT_BUILT_CHARS characters).
NOT_BUILT = "not_built"
NOT_BUILT_PREFIX = "not built: "
NOT_BUILT_CHARS = 500
# Every case of a run is exactly one of these (harness.results.case_class decides it from the outcome and the
# properties above, never from words): the release view of a run, in every rendering and in triage.json.
CASE_NEW_RED = "new red"  # a failure no known-bugs entry explains: the only red
CASE_KNOWN_PRESENT = "known, still present"  # an expected failure a known-bugs entry explained (KNOWN_BUG)
CASE_FIXED_UPSTREAM = "fixed upstream"  # a covered case that passed (KNOWN_BUG_FIXED): close the entry's range
CASE_NOT_BUILT = "not built"  # NOT_BUILT: the suite could not build or shape it
CASE_NOT_RUN = "not run"  # skipped: the host or the environment cannot (too few GPUs, a feature, a cache)
CASE_PASSED = "passed"
CASE_CLASSES = (CASE_NEW_RED, CASE_KNOWN_PRESENT, CASE_FIXED_UPSTREAM, CASE_NOT_BUILT, CASE_NOT_RUN, CASE_PASSED)

# What the nightly's jobs hand on (typed in harness.results.nightly_records): `harness bisect --json FILE`
# (bisect.json) to `harness triage --bisects DIR`, which reads every file under DIR named BISECT_JSON_GLOB, and
# `harness triage -o FILE` (triage.json) to `harness gh nightly-issue --triage-json FILE`.
BISECT_JSON_GLOB = "bisect*.json"
# A bisect probe's verdict (harness.bisect.search.Verdict), and `same_verdict` of a bisect whose ends agreed.
VERDICT_PASS = "pass"
VERDICT_FAIL = "fail"
VERDICT_UNTESTABLE = "untestable"
VERDICT_FLAKY = "flaky"


@dataclass(frozen=True, kw_only=True)
class CleanupRecord:
    """env.json "cleanup": what ended the cell's processes, and what it could not end."""

    mechanism: str  # one of CLEANUP_MECHANISMS
    fallback: str | None = None  # why not a cgroup, in words (None: the cgroup ended them)
    killed: int = 0  # processes of the cell still running when it ended, killed then
    survivors: list[int] = field(default_factory=list)  # pids still alive after every round of kills
    cgroup: str | None = None  # the cell's cgroup (removed when it ended), where it had one

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# env.json's `matrix_reference` of a run of the embedded default matrix (no --matrix); a cell's "matrix" too.
EMBEDDED_MATRIX = "local"


@dataclass(frozen=True, kw_only=True)
class EnvRecord:
    """env.json: how one cell ran. `harness run` writes it on every exit path; a folder without it
    (or without a status) reads as errored."""

    schema: int = SCHEMA
    # Cell.to_json(): id, gpu, gpus, hosts, torch, transformers, matrix, ...: readers take the cell's fields from
    # here; its id is built once (Cell.id) and never parsed.
    cell: dict[str, Any] = field(default_factory=dict)
    status: str = STATUS_ERRORED  # one of STATUSES
    error: str | None = None  # why errored, in words
    error_kind: str | None = None  # why errored, one of ERROR_KINDS: what bisect and triage read
    exit_code: int | None = None  # pytest's
    versions: dict[str, str | None] = field(default_factory=dict)  # python, torch, transformers, accelerate, cuda
    gpus: list[dict[str, Any]] = field(default_factory=list)  # GpuIdentity.to_json() of the cell's GPUs
    driver: str | None = None
    host: str | None = None
    runner: str | None = None
    git_sha: str | None = None  # `git rev-parse HEAD` of the repository that ran: the code tested
    git_dirty: bool | None = None  # tracked files differed from git_sha
    trigger_sha: str | None = None  # $GITHUB_SHA: the commit the workflow run was started for (not what ran)
    start: str | None = None  # ISO 8601, UTC
    end: str | None = None
    duration_s: float | None = None
    # What reruns the cell is typed fields, never a command line: a report rebuilds `harness run [--matrix M] --cell
    # ID -- ARGS` from `matrix_reference`, cell["id"] and `pytest_args`, each checked against a strict pattern and
    # shell-quoted (harness.results.records.reproduce), since the folder is written by the code under test.
    # `--matrix` as the run was given it (Matrix.reference: a name under matrices/ or a path; "local": the embedded
    # default, no --matrix). A folder written before this field has `reproduce` (a whole command), never read.
    matrix_reference: str | None = None
    # The run's own arguments after `--`, as pytest got them; None: written before this field existed.
    pytest_args: list[str] | None = None
    engine: str | None = None  # local, slurm, jobset (None: written before engines existed)
    job_id: str | None = None  # the engine's job (Slurm job id, JobSet name)
    hosts: list[str] = field(default_factory=list)  # every host of the cell, host 0 first
    # How this machine ended the cell's processes (None: an engine's hosts ended them; each host's log says how).
    cleanup: CleanupRecord | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


ENV_FIELDS = tuple(entry.name for entry in dataclasses.fields(EnvRecord))


@dataclass(frozen=True, kw_only=True)
class MemoryGpuRecord:
    """One GPU of memory.json: what the NVML monitor measured; None wherever NVML could not tell."""

    index: int  # NVML's index (the parent GPU's for a MIG instance)
    name: str
    uuid: str
    total_mib: float | None
    used_before_mib: float | None  # used when the cell began (other processes, driver reservations)
    peak_used_mib: float | None
    interval_s: float
    sample_count: int
    host: str | None = None  # the host the GPU is on in a cell across hosts (None: the cell's one host)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, kw_only=True)
class MemoryRecord:
    """memory.json. `available` False (with the reason) on a CPU cell or where NVML cannot be used."""

    schema: int = SCHEMA
    available: bool
    reason: str | None
    interval_s: float
    sample_count: int
    gpus: list[MemoryGpuRecord] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


MEMORY_GPU_FIELDS = tuple(entry.name for entry in dataclasses.fields(MemoryGpuRecord))
