"""What a test may leave in ranks that serve the next test, checked between tests (harness.ranks.pool keeps a rank
set, and its process groups, across tests while this finds it as a fresh one).

A call's own leftovers are put back after every call (harness.ranks.state.FreshState). This audit adds what a test
could leave that changes a later verdict and costs more to look at, so it runs once per test, after its last call:

- every class that torch and transformers define (their dictionaries, by identity): a patched `Linear.forward`,
  an attribute added to a model class
- their modules' top-level containers (by content identity): a global forward hook lives in one; the ones known
  to be caches, whose content a verdict cannot depend on, are named in CACHES with why and left alone
- process settings no call needs to touch: anomaly detection, inference mode, torch's
  backend flags, resource limits, every thread's CPU affinity, the umask, signal handlers, the recursion limit,
  trace and profile functions, the garbage collector's switch and thresholds, torch's and transformers' loggers,
  and torch's config modules (`torch._dynamo.config` and the like)

Put back where that is exact (a class attribute, a hook registry, a setting that has a setter); what will not take
its fresh value, and a container that changed and is neither a known cache nor a registry, is named, and the rank
set is retired: the next test gets ranks forked afresh. Reads dictionaries, never attributes, so taking it imports
nothing. Needs torch in the rank only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import signal
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

from harness.ranks.state import Setting, put_back, read_setting

LIBRARY_PREFIXES = ("torch", "transformers")
_MISSING = object()

# Top-level containers of torch and transformers whose content changes in the suite's own calls, and why a
# verdict cannot depend on it. Neither put back nor compared. Each was seen changing after most tests of
# `harness run`'s default suite (torch 2.13, transformers 5.25); one not named here retires the set and is named.
_GROUPS = "the process groups the rank keeps for warm caches' meshes (harness.ranks.rank drops the others)"
_CACHE = "a cache of a function of its key"
CACHES: dict[str, str] = {
    **{f"torch.distributed.distributed_c10d.{name}": _GROUPS for name in (
        "_pg_map", "_pg_names", "_pg_group_ranks", "_pg_backend_config", "_tags_to_pg", "_pg_to_tag")},
    "torch.distributed.tensor._redistribute._planner_cache": _CACHE + " (a mesh's redistribution planner)",
    "torch.fx.operator_schemas._SCHEMA_TO_SIGNATURE_CACHE": _CACHE + " (an operator schema's signature)",
    "torch.jit._builtins._builtin_table": "a table torch builds once, on first use",
    "torch._dynamo.eval_frame.cached_backends": _CACHE + " (a compile backend by id; torch._dynamo.reset runs "
                                                         "after every call)",
    "torch.distributed.fsdp._fully_shard._fully_shard.cls_to_fsdp_cls": _CACHE + " (the FSDP subclass made for a "
                                                                                   "module class)",
    "transformers.utils.output_capturing._CAN_RECORD_REGISTRY": _CACHE + " (a model class's recorded outputs, "
                                                                         "read from the class)",
    "transformers.modeling_utils._CAN_RECORD_REGISTRY": "the same registry, bound in modeling_utils too",
    "torch.utils._stats.simple_call_counter": "counters of calls, read by no computation",
    "torch.distributed.logging_handlers._log_handlers": "c10d's log handlers, made on first use",
    "torch.distributed.c10d_logger._log_handlers": "the same handlers, bound in c10d_logger too",
    "torch.distributed.tensor._redistribute._warned_flatten_issues": "which warnings were given once already",
    "torch.ops._dir": "the operator namespaces asked for so far (torch.ops makes each on its first use and keeps it; "
                      "on torch 2.11's CUDA build the suite's first use of one is inside a test)",
}

# Registries whose fresh content is put back exactly: what a test registers there applies to every later call.
PUT_BACK = {
    "torch.nn.modules.module._global_backward_pre_hooks",
    "torch.nn.modules.module._global_backward_hooks",
    "torch.nn.modules.module._global_is_full_backward_hook",
    "torch.nn.modules.module._global_forward_pre_hooks",
    "torch.nn.modules.module._global_forward_hooks",
    "torch.nn.modules.module._global_forward_hooks_always_called",
    "torch.nn.modules.module._global_forward_hooks_with_kwargs",
    "torch.nn.modules.module._global_buffer_registration_hooks",
    "torch.nn.modules.module._global_module_registration_hooks",
    "torch.nn.modules.module._global_parameter_registration_hooks",
}


def _library_module(name: str) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in LIBRARY_PREFIXES)


def _library_modules(names: Iterable[str]) -> list[tuple[str, types.ModuleType]]:
    return [(name, module) for name in names
            if _library_module(name) and isinstance(module := sys.modules.get(name), types.ModuleType)]


def _own_classes(name: str, module: types.ModuleType) -> list[type]:
    """The classes `module` defines: type() and the class's own dictionary only (isinstance would read
    `__class__`, which some module attributes answer with a warning)."""
    classes = []
    for value in list(vars(module).values()):
        if issubclass(type(value), type) and vars(value).get("__module__") == name:
            classes.append(value)
    return classes


def _is_container(value: Any) -> bool:
    return issubclass(type(value), (dict, list, set))


def _base(value: Any) -> type:
    return dict if isinstance(value, dict) else list if isinstance(value, list) else set


def _method(value: Any, name: str) -> Callable[..., Any]:
    """`value`'s own method, unless its class overrides it in Python (transformers' lazy mappings import, and load
    models, when iterated): then the base type's. A class's C methods stay (OrderedDict keeps its own order)."""
    method = getattr(type(value), name)
    return getattr(_base(value), name) if isinstance(method, types.FunctionType) else method


def _contents(value: Any) -> Any:
    """A shallow copy that compares by identity later: a dict's items, a list's or a set's elements."""
    if isinstance(value, dict):
        return list(_method(value, "items")(value))
    return list(_method(value, "__iter__")(value))


def _same(value: Any, contents: Any) -> bool:
    now = _contents(value)
    if len(now) != len(contents):
        return False
    if isinstance(value, set):
        return set(now) == set(contents)
    if isinstance(value, dict):
        return all(a[0] is b[0] and a[1] is b[1] for a, b in zip(now, contents, strict=True))
    return all(a is b for a, b in zip(now, contents, strict=True))


def _refill(value: Any, contents: Any) -> None:
    _method(value, "clear")(value)
    if isinstance(value, dict):
        _method(value, "update")(value, contents)
    elif isinstance(value, list):
        _method(value, "extend")(value, contents)
    else:
        _method(value, "update")(value, contents)


def process_settings(torch: Any) -> list[Setting]:
    settings = [
        Setting("anomaly detection", lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
                lambda value: torch.autograd.set_detect_anomaly(*value)),
        Setting("inference mode", torch.is_inference_mode_enabled),
        Setting("umask", _umask, os.umask),
        Setting("recursion limit", sys.getrecursionlimit, sys.setrecursionlimit),
        Setting("trace function", sys.gettrace, sys.settrace),
        Setting("profile function", sys.getprofile, sys.setprofile),
        Setting("garbage collector", lambda: (gc_module().isenabled(), gc_module().get_threshold()), _set_gc),
        Setting("thread CPU affinity", _affinities, _set_affinities),
    ]
    settings += [Setting(f"torch {name}", getattr(torch._C, getter), getattr(torch._C, setter))
                 for name, getter, setter in _TORCH_FLAGS
                 if hasattr(torch._C, getter) and hasattr(torch._C, setter)]
    settings += [Setting(f"resource limit {name}", _limit_reader(number), _limit_writer(number))
                 for name, number in _resource_limits()]
    settings += [Setting(f"handler of {signal.Signals(number).name}", _handler_reader(number),
                         _handler_writer(number)) for number in _catchable_signals()]
    return settings


# torch's process-wide backend switches, as (words, getter, setter) in torch._C.
_TORCH_FLAGS = (
    ("mkldnn enabled", "_get_mkldnn_enabled", "_set_mkldnn_enabled"),
    ("cudnn enabled", "_get_cudnn_enabled", "_set_cudnn_enabled"),
    ("cudnn benchmark", "_get_cudnn_benchmark", "_set_cudnn_benchmark"),
    ("cudnn deterministic", "_get_cudnn_deterministic", "_set_cudnn_deterministic"),
    ("cudnn allow tf32", "_get_cudnn_allow_tf32", "_set_cudnn_allow_tf32"),
    ("cuBLAS allow tf32", "_get_cublas_allow_tf32", "_set_cublas_allow_tf32"),
    ("cuBLAS fp16 reduced-precision reduction", "_get_cublas_allow_fp16_reduced_precision_reduction",
     "_set_cublas_allow_fp16_reduced_precision_reduction"),
    ("cuBLAS bf16 reduced-precision reduction", "_get_cublas_allow_bf16_reduced_precision_reduction",
     "_set_cublas_allow_bf16_reduced_precision_reduction"),
    ("warn always", "_get_warnAlways", "_set_warnAlways"),
    ("fill uninitialized memory", "_get_deterministic_fill_uninitialized_memory",
     "_set_deterministic_fill_uninitialized_memory"),
)


def gc_module() -> Any:
    import gc

    return gc


def _set_gc(value: Any) -> None:
    enabled, thresholds = value
    gc_module().set_threshold(*thresholds)
    (gc_module().enable if enabled else gc_module().disable)()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _affinities() -> frozenset[frozenset[int]]:
    """The CPU sets of the rank's threads, native ones too (a test may narrow an OpenMP worker's, and a thread
    started meanwhile inherits its starter's)."""
    found = set()
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            found.add(frozenset(os.sched_getaffinity(int(tid))))
    return frozenset(found)


def _set_affinities(value: frozenset[frozenset[int]]) -> None:
    """Every thread back to the fresh rank's one CPU set (threads of a fresh rank share one)."""
    if len(value) != 1:
        return
    (cpus,) = value
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), cpus)


def _resource_limits() -> list[tuple[str, int]]:
    return sorted((name, getattr(resource, name)) for name in dir(resource) if name.startswith("RLIMIT_"))


def _limit_reader(number: int) -> Callable[[], Any]:
    return lambda: resource.getrlimit(number)


def _limit_writer(number: int) -> Callable[[Any], None]:
    return lambda value: resource.setrlimit(number, value)


def _catchable_signals() -> list[int]:
    return [number for number in signal.valid_signals()
            if number not in (signal.SIGKILL, signal.SIGSTOP) and number < signal.SIGRTMIN]


def _handler_reader(number: int) -> Callable[[], Any]:
    return lambda: signal.getsignal(number)


def _handler_writer(number: int) -> Callable[[Any], object]:
    return lambda handler: signal.signal(number, handler if handler is not None else signal.SIG_DFL)


def _library_loggers() -> dict[str, tuple[Any, ...]]:
    """The level, handlers, switches and filters of the root logger and of torch's and transformers' loggers."""
    manager = logging.Logger.manager
    loggers: dict[str, logging.Logger] = {"": logging.getLogger()}
    loggers.update({name: logger for name, logger in list(manager.loggerDict.items())
                    if _library_module(name) and isinstance(logger, logging.Logger)})
    return {name: (logger.level, tuple(logger.handlers), logger.disabled, logger.propagate, tuple(logger.filters))
            for name, logger in loggers.items()}


def _put_back_logger(name: str, fresh: tuple[Any, ...]) -> None:
    logger = logging.getLogger(name or None)
    level, handlers, disabled, propagate, filters = fresh
    logger.setLevel(level)
    logger.handlers[:] = list(handlers)
    logger.disabled, logger.propagate = disabled, propagate
    logger.filters[:] = list(filters)


def _config_modules() -> dict[str, Any]:
    """torch's config modules (`torch._dynamo.config`, `torch._inductor.config`, ...): their settings as a copy."""
    found = {}
    for name, module in list(sys.modules.items()):
        copy = getattr(type(module), "get_config_copy", None) if name.startswith("torch") else None
        if copy is not None:
            with contextlib.suppress(Exception):
                found[name] = module.get_config_copy()
    return found


class BoundaryState:
    """A fresh rank's classes, module containers and process settings; `settle()` after a test's last call puts
    back what it can and names the rest (empty: the rank may serve the next test)."""

    def __init__(self, torch: Any):
        self.settings = process_settings(torch)
        self.values = [read_setting(setting) for setting in self.settings]
        self.classes: dict[type, dict[str, Any]] = {}
        self.containers: dict[str, tuple[Any, Any]] = {}
        self.loggers = _library_loggers()
        self.configs = _config_modules()
        self.accept_imports(list(sys.modules))

    def accept_imports(self, names: Iterable[str], *, first_since_audit: bool = False) -> None:
        """Modules a fresh rank has too (imported before a call ran): their classes and containers as they are.
        The first call after an audit (or a rank's start) finds every class and container as fresh; what its
        unpickling imported and changed there (a pytree node, a higher-order op, a torch.library definition
        registered at import) a fresh rank that imports the same modules has too: taken as fresh. A later call's
        imports find the earlier calls' changes beside theirs, so those still meet the audit."""
        names = list(names)
        if first_since_audit and names:
            self._take_as_fresh()
        for name, module in _library_modules(names):
            for cls in _own_classes(name, module):
                self.classes.setdefault(cls, dict(vars(cls)))
            for key, value in list(vars(module).items()):
                qualified = f"{name}.{key}"
                if _is_container(value) and qualified not in CACHES and qualified not in self.containers:
                    self.containers[qualified] = (value, _contents(value))

    def _take_as_fresh(self) -> None:
        for cls, fresh in self.classes.items():
            if not _unchanged(cls, fresh):
                self.classes[cls] = dict(vars(cls))
        for name, (value, contents) in self.containers.items():
            if not _same(value, contents):
                self.containers[name] = (value, _contents(value))

    def settle(self) -> list[str]:
        unfit = put_back(self.settings, self.values)
        unfit += _named("class attributes changed", self._classes())
        unfit += _named("module state changed", self._containers())
        unfit += _named("loggers changed", self._loggers())
        unfit += _named("config changed", self._configs())
        return unfit

    def _classes(self) -> list[str]:
        changed = []
        for cls, fresh in self.classes.items():
            namespace = vars(cls)
            if _unchanged(cls, fresh):
                continue
            for key in [key for key in namespace if key not in fresh]:
                with contextlib.suppress(Exception):
                    delattr(cls, key)
            for key, value in fresh.items():
                if namespace.get(key, _MISSING) is not value:
                    with contextlib.suppress(Exception):
                        setattr(cls, key, value)
            if not _unchanged(cls, fresh):
                changed.append(f"{cls.__module__}.{cls.__qualname__}")
        return changed

    def _containers(self) -> list[str]:
        changed = []
        for name, (value, contents) in self.containers.items():
            if _same(value, contents):
                continue
            if name in PUT_BACK:
                _refill(value, contents)
            else:
                changed.append(name)
        return changed

    def _loggers(self) -> list[str]:
        changed = []
        now = _library_loggers()
        for name, fresh in self.loggers.items():
            if now.get(name) != fresh:
                _put_back_logger(name, fresh)
                if _library_loggers().get(name) != fresh:
                    changed.append(name or "root")
        return changed

    def _configs(self) -> list[str]:
        changed = []
        for name, fresh in self.configs.items():
            module = sys.modules.get(name)
            if module is None:
                continue
            with contextlib.suppress(Exception):
                if module.get_config_copy() != fresh:
                    module.load_config(fresh)
            with contextlib.suppress(Exception):
                if module.get_config_copy() != fresh:
                    changed.append(name)
        return changed


def _unchanged(cls: type, fresh: dict[str, Any]) -> bool:
    namespace = vars(cls)
    return len(namespace) == len(fresh) and all(namespace.get(k, _MISSING) is v for k, v in fresh.items())


def _named(what: str, names: list[str]) -> list[str]:
    if not names:
        return []
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return [f"{what}: {', '.join(names[:3])}{more}"]

