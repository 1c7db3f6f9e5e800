"""A rank's process-global state, as a fresh rank has it: taken once when the rank has joined its process group,
compared after every call. What a call changed is put back where that is exact; what cannot be put back is
named, and the launcher retires the rank set (a fresh one is forked), so a verdict never depends on the tests
that ran before it.

What is compared (`FreshState.settle`):
- torch's global settings: default device and dtype, flush-denormal, autocast per device, grad mode,
  deterministic algorithms, float32 matmul precision, threads, and the torch-function mode stack (a
  `set_default_device` or a mode left entered lives there) and the dispatch-mode stack
- file descriptors 0-2 and `sys.stdin`/`stdout`/`stderr`; live Python threads; the working directory
- `sys.modules`: a module first imported during a call was imported under that call's state
- every module-level binding of torch and transformers, and of the suite's modules the bindings and the
  contents of their module-level dicts, lists and sets (taken before each call: the suite's modules are
  the caller's, and a fresh rank imports them as they are)

Put back exactly: settings that have a setter, fds (from copies taken when fresh), the `sys` streams when
the original object is still open, the working directory, torch's and transformers' bindings (a patched
function, a flag, a cache rebound; added names other than submodules removed: lazy modules compute them
again) and the suite's
bindings and containers. Not put back, and not compared: BOOKKEEPING, counters whose rewinding could reuse
a live object's name. Retired: a closed stream, a thread left running, a new or vanished module, a
torch-function mode left on the stack, a setting that will not take its fresh value.
Needs torch in the rank only.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import types
from collections.abc import Callable, Iterable
from typing import Any

STREAMS = ("stdin", "stdout", "stderr")
STANDARD_FDS = (0, 1, 2)
LIBRARY_PREFIXES = ("torch", "transformers")
AUTOCAST_DEVICES = ("cpu", "cuda")
_MISSING = object()
# torch's and transformers' own bookkeeping that a call changes and a verdict cannot depend on, and why it is
# neither put back nor a reason to retire. Each entry is seen changing in the suite's own calls.
BOOKKEEPING = {
    # Numbers the next process group's name; a name does not change what a group computes, and rewinding it
    # could give a new group the name of one a live mesh still holds.
    "torch.distributed.distributed_c10d._group_count",
    # Numbers each meta-tensor describer; an id only tells describers apart.
    "torch._subclasses.meta_utils.DESCRIBER_NEXT_ID",
}


def _library_module(name: str) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in LIBRARY_PREFIXES)


class Setting:
    """One global setting: how to read it, how to put it back (None: it cannot be), and its words for a reason."""

    def __init__(self, words: str, read: Callable[[], Any], write: Callable[[Any], object] | None = None):
        self.words, self.read, self.write = words, read, write


def put_back(settings: list[Setting], values: list[Any]) -> list[str]:
    """Each setting back to its fresh value where it has a setter that takes; what stays otherwise, in words."""
    unfit = []
    for setting, fresh in zip(settings, values, strict=True):
        now = read_setting(setting)
        if now != fresh and setting.write is not None:
            with contextlib.suppress(Exception):
                setting.write(fresh)
            now = read_setting(setting)
        if now != fresh:
            unfit.append(f"{setting.words} left at {_short(now)} (fresh: {_short(fresh)})")
    return unfit


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= 80 else text[:77] + "..."


def torch_settings(torch: Any) -> list[Setting]:
    settings = [
        Setting("torch default device", lambda: str(torch.get_default_device()),
                lambda value: torch.set_default_device(None if value == "cpu" else value)),
        Setting("torch default dtype", lambda: str(torch.get_default_dtype()),
                lambda value: torch.set_default_dtype(getattr(torch, value.removeprefix("torch.")))),
        Setting("torch flush-denormal", lambda: _flushes_denormals(torch), torch.set_flush_denormal),
        Setting("torch grad mode", torch.is_grad_enabled, torch.set_grad_enabled),
        Setting("torch deterministic algorithms",
                lambda: (torch.are_deterministic_algorithms_enabled(),
                         torch.is_deterministic_algorithms_warn_only_enabled()),
                lambda value: torch.use_deterministic_algorithms(value[0], warn_only=value[1])),
        Setting("torch float32 matmul precision", torch.get_float32_matmul_precision,
                torch.set_float32_matmul_precision),
        Setting("torch threads", torch.get_num_threads, torch.set_num_threads),
        Setting("torch interop threads", torch.get_num_interop_threads, None),  # settable once per process
        Setting("torch function modes entered", torch._C._len_torch_function_stack, None),
        Setting("torch dispatch modes entered", torch._C._len_torch_dispatch_stack, None),
    ]
    for device in AUTOCAST_DEVICES:
        settings += _autocast_settings(torch, device)
    return settings


def _autocast_settings(torch: Any, device: str) -> list[Setting]:
    """Autocast's switch and dtype on `device` (each closure holds its own device)."""
    return [
        Setting(f"{device} autocast", lambda: torch.is_autocast_enabled(device),
                lambda value: torch.set_autocast_enabled(device, value)),
        Setting(f"{device} autocast dtype", lambda: str(torch.get_autocast_dtype(device)),
                lambda value: torch.set_autocast_dtype(device, getattr(torch, value.removeprefix("torch.")))),
    ]


def _flushes_denormals(torch: Any) -> bool:
    """torch has no getter: a float32 denormal times one is zero when denormals are flushed."""
    denormal = torch.tensor([1e-40], dtype=torch.float32, device="cpu")
    return bool(denormal.mul(1.0).item() == 0.0)


def _fd_identity(fd: int) -> tuple[int, int] | None:
    try:
        stat = os.fstat(fd)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def _threads() -> dict[int, str]:
    return {thread.ident: thread.name for thread in threading.enumerate() if thread.ident is not None}


def _library_bindings() -> dict[str, dict[str, Any]]:
    return {name: dict(vars(module)) for name, module in list(sys.modules.items())
            if _library_module(name) and isinstance(module, types.ModuleType)}


class SuiteSnapshot:
    """The suite's modules before a call: their bindings and shallow copies of their containers."""

    def __init__(self, modules: Iterable[types.ModuleType]):
        self.bindings = {module.__name__: dict(vars(module)) for module in modules}
        self.contents = {(module, name): _copy(value) for module, namespace in self.bindings.items()
                         for name, value in namespace.items() if _is_container(value)}

    def restore(self) -> None:
        for name, saved in self.bindings.items():
            module = sys.modules.get(name)
            if module is None:
                continue
            namespace = vars(module)
            for added in [key for key in namespace if key not in saved]:
                del namespace[added]
            for key, value in saved.items():
                if namespace.get(key, _MISSING) is not value:
                    namespace[key] = value
        for (module_name, name), contents in self.contents.items():
            _refill(self.bindings[module_name][name], contents)


def _is_container(value: Any) -> bool:
    return type(value) in (dict, list, set)


def _copy(value: Any) -> Any:
    return dict(value) if type(value) is dict else list(value) if type(value) is list else set(value)


def _refill(container: Any, contents: Any) -> None:
    if type(container) is list:
        if len(container) != len(contents) or any(a is not b for a, b in zip(container, contents, strict=True)):
            container[:] = contents
    elif type(container) is dict:
        if container.keys() != contents.keys() or any(container[k] is not v for k, v in contents.items()):
            container.clear()
            container.update(contents)
    elif container != contents:
        container.clear()
        container.update(contents)


class FreshState:
    """What a fresh rank looks like; `settle()` after each call puts back what it can and names the rest."""

    def __init__(self, torch: Any):
        self.settings = torch_settings(torch)
        self.values = [setting.read() for setting in self.settings]
        self.fds = {fd: _fd_identity(fd) for fd in STANDARD_FDS}
        self.fd_copies = {fd: os.dup(fd) for fd, identity in self.fds.items() if identity is not None}
        self.streams = {name: getattr(sys, name) for name in STREAMS}
        self.threads = _threads()
        self.cwd = os.getcwd()
        self.modules = set(sys.modules)
        self.bindings = _library_bindings()

    def accept_imports(self) -> set[str]:
        """What unpickling a call imported (its function's module, and the threads that module starts) is part of
        the fresh state: a fresh rank imports it the same way, from the same state, before the call runs. The
        modules it imported."""
        self.threads.update(_threads())
        new = set(sys.modules) - self.modules
        self.modules |= new
        self.bindings.update({name: dict(vars(sys.modules[name])) for name in new
                              if _library_module(name) and isinstance(sys.modules[name], types.ModuleType)})
        return new

    def settle(self) -> list[str]:
        """Put back what the last call changed where that is exact; what could not be, in words (empty: this
        rank is as a fresh one)."""
        unfit = put_back(self.settings, self.values)
        for fd, identity in self.fds.items():
            if _fd_identity(fd) != identity and fd in self.fd_copies:
                os.dup2(self.fd_copies[fd], fd)
            if _fd_identity(fd) != identity:
                unfit.append(f"fd {fd} left {'closed' if _fd_identity(fd) is None else 'pointing elsewhere'}")
        for name, stream in self.streams.items():
            if getattr(stream, "closed", False):
                unfit.append(f"sys.{name} closed")
            elif getattr(sys, name) is not stream:
                setattr(sys, name, stream)
        threads = {ident: name for ident, name in _threads().items() if ident not in self.threads}
        if threads:
            unfit.append(f"threads left running: {', '.join(sorted(threads.values()))}")
        with contextlib.suppress(OSError):
            os.chdir(self.cwd)
        if os.getcwd() != self.cwd:
            unfit.append(f"working directory left at {os.getcwd()}")
        unfit += self._modules()
        unfit += self._library_bindings()
        return unfit

    def _modules(self) -> list[str]:
        now = set(sys.modules)
        words = []
        for what, names in (("imported first during a call", now - self.modules),
                            ("removed from sys.modules", self.modules - now)):
            if names:
                shown = sorted(names)
                more = f" and {len(shown) - 3} more" if len(shown) > 3 else ""
                words.append(f"modules {what}: {', '.join(shown[:3])}{more}")
        return words

    def _library_bindings(self) -> list[str]:
        """torch's and transformers' bindings put back (added names removed); what would not take, named."""
        changed = []
        for module_name, fresh in self.bindings.items():
            module = sys.modules.get(module_name)
            if module is None:
                continue  # named by _modules
            namespace = vars(module)
            if len(namespace) == len(fresh) and all(namespace.get(k, _MISSING) is v or f"{module_name}.{k}" in
                                                    BOOKKEEPING for k, v in fresh.items()):
                continue
            for added in [key for key in namespace if key not in fresh]:
                # A submodule bound on its package stays: importing it again would not bind it again.
                if not isinstance(namespace[added], types.ModuleType):
                    del namespace[added]  # a fresh rank has no such name: lazy modules compute it again
            for key, value in fresh.items():
                now = namespace.get(key, _MISSING)
                if now is value or f"{module_name}.{key}" in BOOKKEEPING:
                    continue
                namespace[key] = value
                if namespace.get(key, _MISSING) is not value:  # a namespace that refuses the fresh value
                    changed.append(f"{module_name}.{key}")
        if not changed:
            return []
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        return [f"module bindings changed: {', '.join(changed[:3])}{more}"]


def read_setting(setting: Setting) -> Any:
    try:
        return setting.read()
    except Exception as error:  # a setting the call broke reads as its error
        return f"unreadable ({type(error).__name__})"
