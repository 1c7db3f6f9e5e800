"""Each family's switches: the config arguments that turn an optional mechanic on (a norm, a bias, a shared expert,
a gate variant), found by introspection, and a "switches on" tiny config with every one of them flipped.

A switch is an `__init__` parameter of the family's config class (not one of PreTrainedConfig's own, which are
the same for every family: output_hidden_states, return_dict, ...):
- a boolean: its default is a bool;
- a choice: its annotation is a `Literal[...]` (possibly inside Optional/Union); its values are the literal's other
  members (then the default), tried in that order: the first that changes the model is the one taken. Choices a
  config only validates in code (`if x not in (...)`) or that the modeling code compares against a string are NOT
  found: no reliable way to read their values without running the code, so they are left out.

A switch is flipped on the family's tiny config (families.tiny_config_kwargs): to the value that config does not run.
That is the other value than the class default, except where models/families.py already set it off its default (the tiny
configs untie the embeddings, switch an MoE block on): there the default cases run the flipped value and the switches-on
config runs the class default (tied embeddings, where a family's config ties them). It is kept when the flip changes
the model built on the meta device: its modules (names and classes), its parameters and buffers (names and shapes),
or its TP / EP plans. It is dropped, with a reason, when:
- it changes nothing there (inert: a forward-only or generation-only flag, such as norm_topk_prob);
- the config refuses it or the model does not build with it (the exception's type and first line);
- the suite cannot read the family's layout with it (families.family's layout reading raises: its message);
- it conflicts with switches taken before it (in the signature's order): the switch it conflicts with and why.

`python tests/gpu/models/config_switches.py [FAMILY...]` prints, per family, the switches found, kept and dropped.
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
import sys
import typing
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

if __package__ in (None, "") and str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the suite's modules by name

from models import families

BOOL = "bool"
CHOICE = "choice"
INERT = "changes nothing in the model built on the meta device (modules, parameters, buffers, TP/EP plans)"


@dataclass(frozen=True)
class Switch:
    name: str
    kind: str  # BOOL or CHOICE
    default: object  # the config class's default
    values: tuple  # a choice's other values than the default, in the annotation's order (a bool: its negation)


@dataclass(frozen=True)
class Verdict:
    switch: Switch
    on: object  # the value the switches-on config takes (None where dropped)
    kept: bool
    reason: str  # kept: what the flip changes; dropped: why


@dataclass(frozen=True)
class FamilySwitches:
    model_type: str
    found: tuple[Switch, ...]
    verdicts: tuple[Verdict, ...]  # one per found switch, in the signature's order
    kwargs: Mapping  # the switches-on tiny config's keyword arguments (the tiny config's own where none is kept)
    error: str | None = None  # why nothing could be tried (the tiny config itself does not build)

    @property
    def kept(self) -> tuple[Verdict, ...]:
        return tuple(verdict for verdict in self.verdicts if verdict.kept)

    @property
    def dropped(self) -> tuple[Verdict, ...]:
        return tuple(verdict for verdict in self.verdicts if not verdict.kept)

    @property
    def inert(self) -> tuple[Verdict, ...]:
        return tuple(verdict for verdict in self.dropped if verdict.reason == INERT)

    @property
    def broken(self) -> tuple[Verdict, ...]:
        """Dropped for another reason than being inert (refused, not building, unreadable, conflicting)."""
        return tuple(verdict for verdict in self.dropped if verdict.reason != INERT)


# ---------------------------------------------------------------- candidates


def _base_parameters() -> frozenset[str]:
    from transformers.configuration_utils import PreTrainedConfig

    return frozenset(inspect.signature(PreTrainedConfig.__init__).parameters)


def _literal_values(annotation) -> tuple | None:
    """The members of a `Literal[...]` annotation (inside Optional / Union / `X | None` too), or None."""
    if isinstance(annotation, str):  # a postponed annotation: read the first Literal[...] it spells
        match = re.search(r"Literal\[([^\]]*)\]", annotation)
        if match is None:
            return None
        try:
            values = ast.literal_eval(f"({match[1]},)")
        except (ValueError, SyntaxError):
            return None
        return tuple(values)
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    for arg in typing.get_args(annotation):
        values = _literal_values(arg)
        if values is not None:
            return values
    return None


def candidates(config_cls) -> tuple[Switch, ...]:
    """The config class's own boolean and Literal-choice `__init__` parameters, in the signature's order."""
    base = _base_parameters()
    found = []
    for name, parameter in inspect.signature(config_cls.__init__).parameters.items():
        if name in base or name == "self" or parameter.kind in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
            continue
        default = parameter.default
        if isinstance(default, bool):
            found.append(Switch(name, BOOL, default, (not default,)))
            continue
        if default is not None and not isinstance(default, str):
            continue
        values = _literal_values(parameter.annotation)
        if values:
            others = tuple(value for value in values if value != default and isinstance(value, str))
            if others:
                found.append(Switch(name, CHOICE, default, others))
    return tuple(found)


# ---------------------------------------------------------------- what a config builds


def _first_line(error: BaseException) -> str:
    """The exception's type and first line; with the next line too where the first only introduces it (`...:`),
    as a strict dataclass's validation error does."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = " ".join(lines[:2]) if len(lines) > 1 and lines[0].endswith(":") else (lines[0] if lines else "")
    return f"{type(error).__name__}: {text}"[:300]


@dataclass(frozen=True)
class Built:
    """A config's model on the meta device, as the comparison reads it; or why it did not build."""

    signature: tuple | None
    error: str | None = None


def _plan(model, name: str) -> tuple:
    plan = getattr(model, name, None) or {}
    return tuple(sorted((str(key), str(value)) for key, value in dict(plan).items()))


def build(model_type: str, kwargs: Mapping) -> Built:
    """Build the config and its model on the meta device; read its modules, parameters, buffers and plans; and check
    the suite can read its layout (families' own readers)."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            config = families.config_class(model_type)(**kwargs)
        except Exception as error:  # a validator's refusal, whatever its type
            return Built(None, f"the config refuses it ({_first_line(error)})")
        try:
            with torch.device("meta"):
                model = families.model_class(config)(config)
        except Exception as error:
            return Built(None, f"the model does not build ({_first_line(error)})")
    signature = (
        tuple((name, type(module).__qualname__) for name, module in model.named_modules()),
        tuple((name, tuple(param.shape)) for name, param in model.named_parameters()),
        tuple((name, tuple(buffer.shape)) for name, buffer in model.named_buffers()),
        _plan(model, "_tp_plan"),
        _plan(model, "_ep_plan"),
        tuple(sorted(dict(getattr(config, "base_model_tp_plan", None) or {}).items())),
        tuple(sorted(dict(getattr(config, "base_model_ep_plan", None) or {}).items())),
    )
    if families.MECHANICS.get(model_type, (None, "moe"))[1] is not None:  # a MoE family: its layout must read
        try:
            layers, block, experts, _ = families._plan_paths(model_type) or families._built_paths(model)
            families._read_layout(model, model_type, layers, block, experts)
        except LookupError as error:
            return Built(None, f"the suite cannot read its layout ({_first_line(error)})")
    return Built(signature)


def _difference(base: tuple, flipped: tuple) -> str:
    """What changed, in a few words: the first added or removed module / parameter / buffer, or the plans."""
    labels = ("module", "parameter", "buffer", "model TP plan", "model EP plan", "config TP plan", "config EP plan")
    for label, before, after in zip(labels, base, flipped, strict=True):
        if before == after:
            continue
        added = [entry for entry in after if entry not in set(before)]
        removed = [entry for entry in before if entry not in set(after)]
        if added:
            return f"adds {label} {_entry(added[0])}" + (f" (+{len(added) - 1} more)" if len(added) > 1 else "")
        if removed:
            return f"removes {label} {_entry(removed[0])}" + (
                f" (+{len(removed) - 1} more)" if len(removed) > 1 else "")
        return f"reorders the {label}s"
    return "changes nothing"


def _entry(entry: tuple) -> str:
    name, detail = entry
    return f"{name} ({detail})" if not isinstance(detail, tuple) else f"{name} {list(detail)}"


# ---------------------------------------------------------------- per family


@functools.cache
def family_switches(model_type: str) -> FamilySwitches:
    """The family's switches, each kept or dropped with its reason, and the switches-on tiny config."""
    tiny = dict(families.tiny_config_kwargs(model_type))
    found = candidates(families.config_class(model_type))
    base = build(model_type, tiny)
    if base.signature is None:
        verdicts = tuple(Verdict(switch, None, False, f"not tried: the tiny config {base.error}") for switch in found)
        return FamilySwitches(model_type, found, verdicts, MappingProxyType(tiny), base.error)
    singles: dict[str, tuple[object, str] | str] = {}  # name -> (on value, what it changes) or why dropped
    for switch in found:
        singles[switch.name] = _try_alone(model_type, tiny, base.signature, switch)
    taken: dict[str, object] = {}
    by_name: dict[str, Verdict] = {}
    for switch in found:
        single = singles[switch.name]
        if isinstance(single, str):
            by_name[switch.name] = Verdict(switch, None, False, single)
            continue
        value, changes = single
        attempt = tiny | taken | {switch.name: value}
        built = build(model_type, attempt)
        if built.signature is None:
            by_name[switch.name] = Verdict(switch, None, False, _conflict(model_type, tiny, taken, switch, value,
                                                                           str(built.error)))
            continue
        taken[switch.name] = value
        by_name[switch.name] = Verdict(switch, value, True, changes)
    ordered = tuple(by_name[switch.name] for switch in found)
    return FamilySwitches(model_type, found, ordered, MappingProxyType(tiny | taken))


def _try_alone(model_type: str, tiny: dict, base: tuple, switch: Switch) -> tuple[object, str] | str:
    """(on value, what it changes) for a switch that changes the model alone; else why it is dropped."""
    current = tiny.get(switch.name, switch.default)
    reasons = []
    values = (not current,) if switch.kind == BOOL else (*switch.values, switch.default)
    for value in values:
        if value == current:
            continue
        built = build(model_type, tiny | {switch.name: value})
        if built.signature is None:
            reasons.append(f"{value!r}: {built.error}" if switch.kind == CHOICE else str(built.error))
            continue
        if built.signature != base:
            return value, _difference(base, built.signature)
    if reasons:
        return "; ".join(reasons)
    return INERT


def _conflict(model_type: str, tiny: dict, taken: dict, switch: Switch, value, error: str) -> str:
    """Why a switch that builds alone does not build beside those taken before it: the first of them it fails with
    in a pair, else the whole set."""
    for other, other_value in taken.items():
        pair = build(model_type, tiny | {other: other_value, switch.name: value})
        if pair.signature is None:
            return f"conflicts with {other}={other_value!r}: {pair.error}"
    return f"conflicts with the switches taken before it ({', '.join(taken)}): {error}"


def switches_on_kwargs(model_type: str) -> dict:
    """The switches-on tiny config's keyword arguments (families.SWITCHES_ON builds its variant from these)."""
    return dict(family_switches(model_type).kwargs)


def switched_families() -> list[str]:
    """Declared EP families (not NOT_COVERED) with at least one kept switch, in name order."""
    return [
        name
        for name in families.declared_ep_families()
        if name not in families.NOT_COVERED and family_switches(name).kept
    ]


# ---------------------------------------------------------------- the command


def describe(result: FamilySwitches) -> str:
    lines = [
        f"{result.model_type}: {len(result.found)} found, {len(result.kept)} kept, {len(result.inert)} inert, "
        f"{len(result.dropped) - len(result.inert)} dropped otherwise"
    ]
    if result.error:
        lines.append(f"  (the tiny config itself: {result.error})")
    for verdict in result.verdicts:
        switch = verdict.switch
        if verdict.kept:
            lines.append(f"  kept     {switch.name}={verdict.on!r} (default {switch.default!r}): {verdict.reason}")
        else:
            lines.append(f"  dropped  {switch.name} (default {switch.default!r}): {verdict.reason}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    names = argv or [name for name in families.declared_ep_families() if name not in families.NOT_COVERED]
    unknown = sorted(set(names) - set(families.declared_ep_families()))
    if unknown:
        print(f"not declared EP families: {', '.join(unknown)}", file=sys.stderr)
        return 2
    for name in names:
        print(describe(family_switches(name)))
    return 0


if __name__ == "__main__":
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main(sys.argv[1:]))
