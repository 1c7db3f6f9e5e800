"""Ranks kept across tests (issue 45): what a test leaves in them that could change a later verdict is put back
between tests, or retires the set (harness.ranks.boundary). Each polluter below is a red-team attack on a rank set
that serves the next test: the next test's view must be a fresh rank's, on the same ranks where the audit could
put the pollution back, on new ones (and a reason in the report) where it could not."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import resource
import signal
import sys

import pytest
import torch

from harness.ranks import RankFailedError
from harness.ranks.pool import PoolLauncher


def boundary_view():
    """What a test sees that an earlier test could have changed for it and no call's reset puts back."""
    import torch.distributed as dist
    import transformers
    from torch.nn.modules import module as nn_module

    mask = os.umask(0o022)
    os.umask(mask)
    return {
        "pid": os.getpid(),
        "linear_forward": torch.nn.Linear.forward.__qualname__,
        "pretrained_extra": "_harness_extra" in vars(transformers.PreTrainedModel),
        "forward_hooks": len(nn_module._global_forward_hooks),
        "anomaly": torch.is_anomaly_enabled(),
        "rlimit_as": resource.getrlimit(resource.RLIMIT_AS),
        "affinity": sorted(os.sched_getaffinity(0)),
        "transformers_log_level": logging.getLogger("transformers").level,
        "sigusr2": str(signal.getsignal(signal.SIGUSR2)),
        "umask": mask,
        "recursion_limit": sys.getrecursionlimit(),
        "gc": (gc.isenabled(), gc.get_threshold()),
        "dynamo_cache_size_limit": torch._dynamo.config.cache_size_limit,
        "mkldnn": torch.backends.mkldnn.enabled,
        "trace": sys.gettrace() is None,
        "side_effectful": len(torch.fx.node._side_effectful_functions),
        "groups": len(dist.distributed_c10d._world.pg_map),
    }


def patch_a_transformers_class():
    import transformers

    transformers.PreTrainedModel._harness_extra = True


def patch_linear_forward():
    torch.nn.Linear.forward = lambda self, x: x * 0


def global_forward_hook():
    torch.nn.modules.module.register_module_forward_hook(lambda module, args, out: out)


def detect_anomaly():
    torch.autograd.set_detect_anomaly(True)


def lower_rlimit_as():
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (8 << 40, hard))


def narrow_affinity():
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def quiet_transformers_logging():
    import transformers

    transformers.logging.set_verbosity_error()


def handle_sigusr2():
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def loose_umask():
    os.umask(0)


def lower_recursion_limit():
    sys.setrecursionlimit(200)


def disable_gc():
    gc.disable()
    gc.set_threshold(1, 1, 1)


def raise_dynamo_cache_size_limit():
    torch._dynamo.config.cache_size_limit = 1


def mkldnn_off():
    torch.backends.mkldnn.enabled = False


def leave_a_trace_function():
    sys.settrace(lambda frame, event, arg: None)


def register_a_side_effect():
    """A registry torch reads while tracing, which a fresh rank has without this entry: not a known cache, not
    one the audit may refill (it pairs with state elsewhere), so the set retires."""
    torch.fx.node._side_effectful_functions.add(print)


def enter_a_dispatch_mode_then_fail():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Doubling(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    Doubling().__enter__()
    raise AssertionError("failed with a dispatch mode left entered")


@pytest.fixture(scope="module")
def launcher():
    launcher = PoolLauncher()
    view(launcher)  # the first view imports transformers: that set retires, the zygote preloads what it imported
    launcher.renew()
    yield launcher
    launcher.close()


def view(launcher) -> list[dict]:
    return [result.value for result in launcher(2, boundary_view, timeout=60, device="cpu")]


PUT_BACK = [patch_a_transformers_class, patch_linear_forward, global_forward_hook, detect_anomaly, lower_rlimit_as,
            narrow_affinity, quiet_transformers_logging, handle_sigusr2, loose_umask, lower_recursion_limit,
            disable_gc, raise_dynamo_cache_size_limit, mkldnn_off, leave_a_trace_function]


@pytest.mark.parametrize("polluter", PUT_BACK)
def test_what_a_test_left_is_put_back_before_the_next_test_on_the_same_ranks(launcher, polluter):
    launcher.renew()
    fresh = view(launcher)
    launcher(2, polluter, timeout=60, device="cpu")
    polluted = view(launcher)
    assert polluted != fresh  # the pollution took, within its own test
    assert launcher.renew() == []  # the test boundary: audited, put back, kept
    assert view(launcher) == fresh  # the next test: a fresh rank's view, on the same ranks


@pytest.mark.parametrize(("polluter", "because"), [
    (register_a_side_effect, "module state changed: torch.fx.node._side_effectful_functions"),
    (enter_a_dispatch_mode_then_fail, "torch dispatch modes entered left at 1 (fresh: 0)"),
])
def test_what_cannot_be_put_back_retires_the_ranks_and_says_why(launcher, polluter, because):
    launcher.renew()
    fresh = view(launcher)
    with contextlib.suppress(RankFailedError):
        launcher(2, polluter, timeout=60, device="cpu")
    retirements = launcher.renew()
    assert len(retirements) == 1 and because in retirements[0], retirements
    after = view(launcher)
    assert {pid["pid"] for pid in after}.isdisjoint({pid["pid"] for pid in fresh})
    assert [{**v, "pid": None} for v in after] == [{**v, "pid": None} for v in fresh]


def registering_module(tmp_path, monkeypatch, name: str):
    """A module whose import registers a pytree node of its own class, as many a library's import does."""
    (tmp_path / f"{name}.py").write_text(
        "import torch.utils._pytree as pytree\n\n\n"
        "class Pair:\n"
        "    def __init__(self, a, b):\n"
        "        self.a, self.b = a, b\n\n\n"
        "pytree.register_pytree_node(Pair, lambda p: ((p.a, p.b), None), lambda values, _: Pair(*values))\n\n\n"
        "def registered():\n"
        "    return Pair in pytree.SUPPORTED_NODES\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return __import__(name)


def test_what_a_tests_first_call_imports_and_registers_is_a_fresh_ranks_state_too(launcher, tmp_path, monkeypatch):
    module = registering_module(tmp_path, monkeypatch, "registers_at_its_first_call")
    launcher.renew()
    before = view(launcher)  # its own test: this view ends with an audit
    launcher.renew()
    assert [result.value for result in launcher(2, module.registered, timeout=60, device="cpu")] == [True, True]
    assert launcher.renew() == []  # kept: a rank that imports the module fresh registers the same node
    assert [v["pid"] for v in view(launcher)] == [v["pid"] for v in before]


def test_what_a_later_call_of_the_test_imports_and_registers_still_retires_the_ranks(launcher, tmp_path,
                                                                                     monkeypatch):
    module = registering_module(tmp_path, monkeypatch, "registers_at_a_later_call")
    launcher.renew()
    view(launcher)  # the test's first call
    assert [result.value for result in launcher(2, module.registered, timeout=60, device="cpu")] == [True, True]
    retirements = launcher.renew()  # its import met what the first call could have left: the audit decides
    assert len(retirements) == 1 and "module state changed: torch.utils._pytree" in retirements[0], retirements


def reach_an_op_namespace_first() -> str:
    """torch.ops makes a namespace on its first use and lists it in torch.ops._dir. On torch 2.11's CUDA build a
    kernel's namespace was first reached inside the suite's tests, so every kept set retired after its test."""
    return type(torch.ops.harness_namespace_reached_once).__name__


def test_an_op_namespace_first_reached_in_a_test_keeps_the_ranks(launcher):
    launcher.renew()
    before = view(launcher)
    launcher.renew()
    assert [result.value for result in launcher(2, reach_an_op_namespace_first, timeout=60, device="cpu")] == [
        "_OpNamespace", "_OpNamespace"]
    assert launcher.renew() == []  # a cache of what was asked for: kept
    assert [v["pid"] for v in view(launcher)] == [v["pid"] for v in before]
