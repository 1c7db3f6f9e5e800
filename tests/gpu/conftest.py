"""The suite's fixtures: the plugin that runs ranks (harness/ranks/plugin.py), the tiny checkpoints of every
family, the case runner, known upstream bugs and EP coverage."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

SUITE_DIR = Path(__file__).resolve().parent
# The ranks import the suite's helper modules (rank_cases, tiny_models, ...) by name: a spawned rank
# inherits this sys.path, whatever pytest's import mode.
if str(SUITE_DIR) not in sys.path:
    sys.path.insert(0, str(SUITE_DIR))
# Everything is built locally; never reach for the Hub, in this process or the ranks it starts.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Hub kernels are an axis of their own (test_one_device.py: test_hub_kernels_on_this_device turns them on); every
# other case loads with them off, in this process and the ranks it starts, whatever the caller's environment said.
os.environ["USE_HUB_KERNELS"] = "0"  # tf_adapter.HUB_KERNELS_ENV, HUB_KERNELS_OFF; set before anything imports it

# What the case runners below take as a case's layout and checks.
from checks.kinds import Check, Layout  # noqa: E402

# Each family's tiny checkpoint (fixtures `checkpoints`, `checkpoint`): defined beside the suite's modules, as the
# suite's self-tests (tests/unit/suite) use them too. Imported once the suite directory is on sys.path; bound by
# assignment, as the case runners below take a `checkpoint` argument of their own.
from models import checkpoint_fixtures  # noqa: E402

Checkpoint = checkpoint_fixtures.Checkpoint
checkpoints = checkpoint_fixtures.checkpoints
checkpoint = checkpoint_fixtures.checkpoint

# `harness repro TEST_ID`: --harness-write-repro=FILE writes the selected case's standalone script in place of
# launching its ranks (upstream/repro_writer.py, called at the start of _run_phases).
from upstream import repro_writer  # noqa: E402

pytest_addoption = repro_writer.pytest_addoption
pytest_collection_finish = repro_writer.pytest_collection_finish

# The ranks fixture and its rank pool (HARNESS_RANKS_POOL=0 turns the pool off). An installed harness
# registers the plugin through its pytest11 entry point, `harness run` with `-p`; this covers a checkout
# on PYTHONPATH alone (where its options, such as --no-ranks-pool, arrive too late to be parsed).
PLUGIN = "harness.ranks.plugin"


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin(PLUGIN):
        config.pluginmanager.import_plugin(PLUGIN)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A strict xfail from the known-bugs table that passed: name its entries as data (the KNOWN_BUG_FIXED property,
    what triage reads) and say what to do about it."""
    from upstream import known_bugs

    from harness.contract import KNOWN_BUG_FIXED

    report = yield
    keys = known_bugs.fixed_upstream(item, call, report)
    if keys is not None:
        report.longrepr = known_bugs.fixed_upstream_message(str(report.longrepr))
        item.user_properties.append((KNOWN_BUG_FIXED, ",".join(keys)))  # junit.xml takes the test's at teardown
    return report


@pytest.fixture(scope="session", autouse=True)
def ep_coverage(record_testsuite_property) -> dict[str, str]:
    """EP families the installed transformers declares, and those the suite covers (testsuite properties)."""
    from models import ep_coverage

    properties = ep_coverage.suite_properties()
    for name, value in properties.items():
        record_testsuite_property(name, value)
    return properties


@pytest.fixture
def run_case(request, ranks, tmp_path):
    """Run a `rank_cases.Case` for a checkpoint's family on N ranks, record its metrics as JUnit properties
    (a failing case's too, before the failure propagates), and return them.

    Skips with `needs transformers>=X for ...` below the release that introduced the case's layout or the
    family's EP plan; marks a case the known-bugs table covers as a strict xfail with its reason, for the
    failure its entry names only (known_bugs.expecting).
    """
    from checks import rank_cases

    def run(world_size: int, checkpoint: Checkpoint, layout: Layout, checks: tuple[Check, ...], **options) -> dict:
        case = rank_cases.Case(checkpoint.family, layout, checks, **options)
        _skip_if_missing(case)
        return _run_recorded(request, ranks, tmp_path, world_size, checkpoint, case, rank_cases.run_case)

    return run


@pytest.fixture
def run_training(request, ranks, tmp_path):
    """Run a `steps.TrainCase` on N ranks, recorded and covered by the known-bugs table as `run_case` is; a
    resume case's checkpoints go to a folder under the test's tmp_path."""
    from loading import tf_adapter
    from training import steps

    def run(world_size: int, checkpoint: Checkpoint, layout: Layout, **options) -> dict:
        case = steps.TrainCase(checkpoint.family, layout, **options)
        _skip_if_missing(case, tf_adapter.missing_mixed_precision(layout) if case.mixed_precision else None)
        saves = tmp_path / "checkpoints"
        saves.mkdir(exist_ok=True)
        return _run_recorded(request, ranks, tmp_path, world_size, checkpoint, case, steps.run_training,
                             str(saves))

    return run


@pytest.fixture
def run_user_loop(request, ranks, tmp_path):
    """Run a `user_loops.UserLoopCase` (accelerate's or the Trainer's loop) on N ranks, recorded and covered by the
    known-bugs table as `run_case` is; not run, with the library's message, where the library refused the layout
    on this device at setup (user_loops.REFUSED)."""
    from training import user_loops

    def run(world_size: int, checkpoint: Checkpoint, layout: Layout, loop: str, **options) -> dict:
        case = user_loops.UserLoopCase(checkpoint.family, layout, loop, **options)
        _skip_if_missing(case)
        metrics = _run_recorded(request, ranks, tmp_path, world_size, checkpoint, case, user_loops.run_user_loop)
        if metrics.get(user_loops.REFUSED):
            pytest.skip(metrics[user_loops.REFUSED])
        return metrics

    return run


@pytest.fixture
def run_device_case(request, ranks, tmp_path):
    """Run a `device_cases.DeviceCase` on one rank (this host's first GPU, or the CPU), recorded and covered by
    the known-bugs table as `run_case` is."""
    from loading import tf_adapter
    from training import device_cases

    def run(checkpoint: Checkpoint, **options) -> dict:
        case = device_cases.DeviceCase(checkpoint.family, **options)
        reason = tf_adapter.missing_experts_implementation(case.experts_implementation)
        if reason is not None:
            pytest.skip(reason)
        return _run_recorded(request, ranks, tmp_path, 1, checkpoint, case, device_cases.run_device_case)

    return run


@pytest.fixture
def run_checkpoint_case(request, ranks, tmp_path):
    """Run a `checkpointing.CheckpointCase`: phase 1 at its world size, then (a resume case) phase 2 at the
    other, both saving to one folder under the test's tmp_path; recorded and covered by the known-bugs table as
    `run_case` is, the two launches' metrics summarized together."""
    from training import checkpointing

    def run(checkpoint: Checkpoint, layout: Layout, kind: str, **options) -> dict:
        case = checkpointing.CheckpointCase(checkpoint.family, layout, kind, **options)
        _skip_if_missing(case)
        folder = tmp_path / "saved"
        folder.mkdir()
        functions = (checkpointing.train_and_save, checkpointing.resume_and_continue)
        # save, then (a resume case) resume at the other world: a save_pretrained case has one world, one phase
        phases = list(zip(case.world_sizes, functions, strict=False))
        return _run_phases(request, ranks, tmp_path, checkpoint, case,
                           [(world_size, function, (str(folder),)) for world_size, function in phases])

    return run


def _skip_if_missing(case, reason: str | None = None) -> None:
    """Not run, saying why: the installed release lacks the case's layout, its family's EP plan or its experts
    implementation (tf_adapter.missing_feature), or what else the caller found missing (`reason`)."""
    from loading import tf_adapter
    from models import families

    reason = tf_adapter.missing_feature(case.layout, families.family(case.family), case.experts_implementation) \
        or reason
    if reason is not None:
        pytest.skip(reason)


def _run_recorded(request, ranks, tmp_path, world_size: int, checkpoint: Checkpoint, case, function, *more) -> dict:
    return _run_phases(request, ranks, tmp_path, checkpoint, case, [(world_size, function, more)])


def _run_phases(request, ranks, tmp_path, checkpoint: Checkpoint, case,
                phases: list[tuple[int, object, tuple]]) -> dict:
    """Launch each phase (world size, rank function, its extra arguments) in turn on the case; record the metrics
    every rank of every phase wrote, summarized (a failing case's too, before the failure propagates)."""
    from checks import rank_cases
    from loading import tf_adapter
    from models import families
    from upstream import known_bugs

    from harness import contract

    repro_writer.write_if_requested(request, checkpoint, case, phases)  # skips the test where it writes

    # Every phase's world size before any launch: a host too small for one skips the case whole. The family before
    # the launch, as ranks.run records the world size: a case that ran and failed (even before any rank wrote its
    # metrics) still counts its family as run; one skipped for ranks does not.
    for world_size, _, _ in phases:
        ranks.require(world_size)
    ranks.record(**{contract.FAMILY: families.split_variant(case.family)[0]})  # a variant counts as its family's
    metrics_dirs = []
    try:
        with known_bugs.expecting(request, known_bugs.known_bugs(case)):
            measured = []
            for world_size, function, more in phases:
                metrics_dirs.append(tmp_path / f"metrics-{len(list(tmp_path.glob('metrics-*')))}")
                metrics_dirs[-1].mkdir()
                measured += ranks.run(world_size, function, checkpoint.path, case, str(metrics_dirs[-1]),
                                      tf_adapter.model_class(checkpoint.path), *more)
            metrics = rank_cases.summarize(measured)
    except BaseException:
        written = [each for path in metrics_dirs for each in rank_cases.read_metrics(str(path))]
        if written:
            ranks.record(**rank_cases.summarize(written))
        raise
    ranks.record(**metrics)
    return metrics
