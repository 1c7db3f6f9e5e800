"""The identity of what a verdict rests on, in the zygote: torch's comparisons, reductions and collectives, the
Tensor and Module classes' attributes, torch.testing, and Python's own comparison helpers. Taken once the zygote
has imported torch, before any preload; a preload that rebinds any of it (a module that patches torch.allclose
or Tensor.sum) leaves a template whose every fork would compare falsely, and the zygote refuses to fork from it
(harness.ranks.zygote, the launcher retires it and says why in its summary).

The zygote preloads installed code only (harness.ranks.preload): this is the check behind that rule, for an
installed module, or a file a test wrote into site-packages, that patches what tests compare with.

Read from module and class dictionaries, never with getattr: torch imports some submodules on attribute access,
and taking a fingerprint imports nothing. A module's added names are not changes (a submodule bound on its
package, a lazy attribute computed); a class's are (an attribute that shadows its base's method).
Needs only the standard library; torch where it is loaded.
"""

from __future__ import annotations

import sys
import types
from typing import Any

_MISSING = object()

# Module attributes, by module.
FUNCTIONS = {
    "torch": ("allclose", "equal", "isclose", "eq", "ne", "lt", "le", "gt", "ge", "sum", "mean", "abs", "max", "min",
              "amax", "amin", "all", "any", "isnan", "isinf", "isfinite", "norm", "sub", "dist", "where",
              "cosine_similarity", "testing"),
    "torch.linalg": ("norm", "vector_norm", "matrix_norm"),
    "torch.nn.functional": ("mse_loss", "l1_loss", "cosine_similarity", "cross_entropy"),
    "torch.distributed": ("all_reduce", "all_gather", "all_gather_object", "broadcast", "broadcast_object_list",
                          "barrier", "get_rank", "get_world_size"),
    "numpy": ("allclose", "array_equal", "isclose", "testing"),
}
# Modules whose every binding counts.
NAMESPACES = ("torch.testing", "torch.testing._comparison", "builtins", "math", "operator")
# Classes whose whole dictionary counts, as (module, name).
CLASSES = (("torch", "Tensor"), ("torch._C", "TensorBase"), ("torch.nn", "Module"))


class Fingerprint:
    """What FUNCTIONS, NAMESPACES and CLASSES name, as loaded when taken; `changes()` names what differs now."""

    def __init__(self) -> None:
        self.bindings: dict[tuple[str, str], Any] = {}  # (module, name) -> the object
        for module, names in FUNCTIONS.items():
            namespace = _namespace(module)
            if namespace is not None:
                self.bindings.update({(module, name): namespace.get(name, _MISSING) for name in names})
        for module in NAMESPACES:
            namespace = _namespace(module)
            if namespace is not None:
                self.bindings.update({(module, name): value for name, value in namespace.items()})
        self.classes = {(module, name): dict(vars(cls)) for module, name in CLASSES
                        if isinstance(cls := (_namespace(module) or {}).get(name), type)}

    def changes(self) -> list[str]:
        """What is bound otherwise than when taken, as `module.name` and `module.Class.name`."""
        changed = []
        for (module, name), value in self.bindings.items():
            namespace = _namespace(module)
            if namespace is None:
                continue
            now = namespace.get(name, _MISSING)
            if now is not value and not (value is _MISSING and _submodule(module, name, now)):
                changed.append(f"{module}.{name}")
        for (module, name), fresh in self.classes.items():
            cls = (_namespace(module) or {}).get(name)
            now = dict(vars(cls)) if isinstance(cls, type) else {}
            changed += [f"{module}.{name}.{key}" for key in sorted(fresh.keys() | now.keys())
                        if now.get(key, _MISSING) is not fresh.get(key, _MISSING)]
        return changed


def _submodule(module: str, name: str, value: Any) -> bool:
    """`value` is the package's own submodule `name`, bound on it by its import (numpy.testing, which a preload may
    import first: on the device's torch 2.11 image one did, and the template refused every preload after)."""
    return isinstance(value, types.ModuleType) and sys.modules.get(f"{module}.{name}") is value


def _namespace(module: str) -> dict[str, Any] | None:
    loaded = sys.modules.get(module)
    return vars(loaded) if isinstance(loaded, types.ModuleType) else None
