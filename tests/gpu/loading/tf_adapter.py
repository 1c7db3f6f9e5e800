"""The one place that knows how each transformers release loads a sharded model.

The subject under test is transformers' own distributed loading,
`from_pretrained(..., distributed_config=DistributedConfig(...))`, whose API moved across 5.x:

| releases    | expert parallel (EP) of Qwen3-MoE                   | FSDP2            | FSDP2 + EP             |
| ----------- | --------------------------------------------------- | ---------------- | ---------------------- |
| 5.0 - 5.6   | no EP plan for Qwen3-MoE (EP of others: see below)   | -                | -                      |
| 5.7 - 5.12  | enable_expert_parallel=True (TP group = the world)   | -                | -                      |
| 5.13 - 5.18 | enable_expert_parallel=True, tp_size=N               | fsdp_size (5.15) | -                      |
| 5.19        | ep_size=N, tp_size=N, tp_plan={} (dense TP-sharded)  | fsdp_size        | refused (all-reduce EP) |
| 5.20 - 5.22 | ep_size=N, tp_size=N, tp_plan={} (dense replicated)  | fsdp_size        | ep_size=N, fsdp_size=N |
| 5.23 -      | ep_size=N, tp_size=N (replicated dense refused: TP)  | fsdp_size        | ep_size=N, fsdp_size=N |

Other MoE families got their EP plans later (models/families.py: `ep_floor`), four earlier (ep_plan_history.json has
each model type's first release: one from 4.54, one from 5.3, two from 5.6). Those releases speak the 5.7 API,
`enable_expert_parallel=True` (from 4.56: `dtype=`, before it `torch_dtype=`; 4.x needs accelerate), and it loads
and matches on 2 gloo ranks at 4.56.2 and 4.57.6 (the one family declared there; its forward fails at 4.54.1) and
from 5.6.0, not between: 4.54.0 raises `AttributeError: type object 'DistributedConfig' has no attribute
'from_config'` for every model; 5.0 - 5.5 hand the weight loader the TP plan instead of the EP plan
(`UnboundLocalError: cannot access local variable 'tp_plan_alt'` where a config has no TP plan, a `KeyError` of an
EP-plan key where it has one). The EP layout's floor stays 5.7.0; families verified at their first release below
it (families.EARLY_EP, one mechanics family among them, from 5.3.0, whose EP loading 5.3-5.5 gets wrong: known
bugs) run from there (`layout_floor`). A case skips below the first release that *has* its feature (the floor),
with the floor as the reason.
From the floor on it runs, so a release that has a feature and gets it wrong shows red.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from checks import kinds

# From this release on, EP beside replicated dense weights is refused (see the table above). The other
# changes are told apart by DistributedConfig's fields (tp_size, ep_size).
FIRST_REFUSING_REPLICATED_DENSE_EP = "5.23.0"


@dataclass(frozen=True)
class LayoutTraits:
    """How a sharded model is laid out over the ranks, as far as the checks need to know."""

    name: kinds.Layout  # its key in LAYOUTS
    experts_sharded: bool  # each rank holds a contiguous 1/world of every expert stack
    fsdp_sharded: bool  # parameters are FSDP2 shards (dim-0 chunks), gathered for compute
    splits_batch: bool  # ranks take different rows of the batch (data parallel) instead of sharing it
    floor: str | None  # first transformers release that has it (None: torch's own, no transformers floor)
    feature: str


LAYOUTS = {
    kinds.Layout.EP: LayoutTraits(
        kinds.Layout.EP,
        experts_sharded=True,
        fsdp_sharded=False,
        splits_batch=False,
        floor="5.7.0",
        feature="expert-parallel loading (DistributedConfig(enable_expert_parallel=True))",
    ),
    kinds.Layout.FSDP: LayoutTraits(
        kinds.Layout.FSDP,
        experts_sharded=False,
        fsdp_sharded=True,
        splits_batch=True,
        floor="5.15.0",
        feature="FSDP2 loading (DistributedConfig(fsdp_size=N))",
    ),
    kinds.Layout.FSDP_EP: LayoutTraits(
        kinds.Layout.FSDP_EP,
        experts_sharded=True,
        fsdp_sharded=True,
        splits_batch=True,
        floor="5.20.0",
        feature="FSDP2 with expert parallelism (DistributedConfig(ep_size=N, fsdp_size=N))",
    ),
    # torch's fully_shard applied by the suite itself: no transformers feature involved
    kinds.Layout.FULLY_SHARD: LayoutTraits(
        kinds.Layout.FULLY_SHARD,
        experts_sharded=False,
        fsdp_sharded=True,
        splits_batch=True,
        floor=None,
        feature="torch fully_shard",
    ),
}


# From this release on, Hub kernels are on by default: from_pretrained's `use_kernels` defaults to True unless
# USE_HUB_KERNELS says no, and `model.train()` kernelizes for the model's device, fetching kernels-community
# repositories from the Hub. The suite runs every case with them off (HUB_KERNELS_ENV=0, conftest.py) and the Hub
# kernels cases with them on (device_cases: hub_kernels=True), where the kernels are in the local cache.
FIRST_HUB_KERNELS_BY_DEFAULT = "5.25.0"
HUB_KERNELS_ENV = "USE_HUB_KERNELS"
HUB_KERNELS_OFF = "0"
HUB_KERNELS_ON = "1"


@contextlib.contextmanager
def hub_kernels(on: bool):
    """Hub kernels on (or off) for the loads inside: transformers reads USE_HUB_KERNELS at from_pretrained."""
    before = os.environ.get(HUB_KERNELS_ENV)
    os.environ[HUB_KERNELS_ENV] = HUB_KERNELS_ON if on else HUB_KERNELS_OFF
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(HUB_KERNELS_ENV, None)
        else:
            os.environ[HUB_KERNELS_ENV] = before


def hub_kernel_repositories(device_type: str) -> tuple[str, ...]:
    """The Hub repositories the installed release maps a layer to, for training on this device type."""
    from transformers.integrations import hub_kernels as integration

    repositories = set()
    for per_device in integration.get_kernel_mapping_transformers().values():
        for device, per_mode in per_device.items():
            if getattr(device, "type", device) != device_type:
                continue
            for repository in (per_mode.values() if isinstance(per_mode, dict) else (per_mode,)):
                name = getattr(repository, "repo_id", None) or getattr(repository, "_repo_id", None)
                if name:
                    repositories.add(name)
    return tuple(sorted(repositories))


def hub_kernels_not_run(device_type: str) -> str | None:
    """Why a Hub kernels case cannot run here (the release predates them, none exists for the device, or the Hub is
    offline and they are not in the local cache), with the one setting that enables it; None: it runs."""
    from packaging.version import Version

    installed = transformers_version()
    if installed < Version(FIRST_HUB_KERNELS_BY_DEFAULT):
        return f"needs transformers>={FIRST_HUB_KERNELS_BY_DEFAULT} for Hub kernels by default (installed: {installed})"
    repositories = hub_kernel_repositories(device_type)
    if not repositories:
        return f"transformers {installed} maps no Hub kernels to {device_type}: the default path is the torch one"
    from huggingface_hub import constants

    if not constants.HF_HUB_OFFLINE:
        return None
    missing = [name for name in repositories
               if not (Path(constants.HF_HUB_CACHE) / f"models--{name.replace('/', '--')}").is_dir()]
    if missing:
        return (f"Hub kernels not cached: {', '.join(missing)} not in {constants.HF_HUB_CACHE} and the Hub is "
                "offline (HF_HUB_OFFLINE=1); run once with HF_HUB_OFFLINE=0 to fill the cache (README: Hub kernels)")
    return None


def transformers_version():
    import transformers
    from packaging.version import Version

    return Version(transformers.__version__)


def missing_feature(layout_name: kinds.Layout, family=None, experts_implementation: str | None = None) -> str | None:
    """`needs transformers>=X for ...` when the installed release predates the layout's floor or the family's
    EP floor, or why it cannot run the experts implementation; else None."""
    from packaging.version import Version

    layout = LAYOUTS[layout_name]
    installed = transformers_version()
    floor = layout_floor(layout_name, family)
    if floor is not None and installed < Version(floor):
        return f"needs transformers>={floor} for {layout.feature} (installed: {installed})"
    if family is not None and layout.experts_sharded:
        reason = below_ep_floor(family)
        if reason:
            return reason
    return missing_experts_implementation(experts_implementation)


def missing_mixed_precision(layout_name: kinds.Layout) -> str | None:
    """Why the installed release cannot load this layout with FSDP2 mixed precision, or None."""
    if layout_name == kinds.Layout.FULLY_SHARD:
        return None  # torch's own MixedPrecisionPolicy
    from transformers.distributed.configuration_utils import DistributedConfig

    if "fsdp_mixed_precision" not in DistributedConfig.__dataclass_fields__:
        return (f"transformers {transformers_version()} has no DistributedConfig(fsdp_mixed_precision=...) for "
                f"{LAYOUTS[layout_name].feature}")
    return None


def layout_floor(layout_name: kinds.Layout, family=None) -> str | None:
    """The first release a case of this layout runs on: the layout's floor; for the EP layout, the family's own EP
    floor where it lies below that (families.EARLY_EP: verified on ranks there, see the table above)."""
    from packaging.version import Version

    floor = LAYOUTS[layout_name].floor
    own = getattr(family, "ep_floor", None)
    if layout_name == kinds.Layout.EP and floor is not None and own and Version(own) < Version(floor):
        return own
    return floor


def below_ep_floor(family) -> str | None:
    """`needs transformers>=X for expert parallelism of F` when the installed release predates the family's EP
    floor; else None. Below it the suite does not build the family's tiny model at all: its router's outputs were
    another shape there (granitemoe before 5.21: index, weights, logits), which the routing recorder does not read."""
    from packaging.version import Version

    installed = transformers_version()
    if family.ep_floor and installed < Version(family.ep_floor):
        return (
            f"needs transformers>={family.ep_floor} for expert parallelism of {family.model_type} "
            f"(installed: {installed})"
        )
    return None


def missing_experts_implementation(experts_implementation: str | None) -> str | None:
    """Why the installed release cannot run `experts_implementation`, or None."""
    if experts_implementation is None or experts_implementation in experts_implementations():
        return None
    return (
        f"transformers {transformers_version()} offers no experts_implementation={experts_implementation!r} "
        f"(offered: {', '.join(experts_implementations())})"
    )


# Experts implementations that run everywhere the suite does; deepgemm and sonicmoe need their own CUDA kernels.
PORTABLE_EXPERTS_IMPLEMENTATIONS = ("eager", "grouped_mm", "batched_mm")


def experts_implementations() -> tuple[str, ...]:
    """The portable experts implementations the installed release offers (`experts_implementation=`)."""
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except ImportError:  # before the experts interface: one implementation, the modeling file's loop
        return ("eager",)
    return tuple(name for name in PORTABLE_EXPERTS_IMPLEMENTATIONS if name == "eager" or name in ALL_EXPERTS_FUNCTIONS)


def distributed_config_kwargs(layout_name: kinds.Layout, world_size: int) -> dict:
    """The DistributedConfig arguments the installed release wants for this layout on `world_size` ranks."""
    from packaging.version import Version
    from transformers.distributed.configuration_utils import DistributedConfig

    fields = DistributedConfig.__dataclass_fields__
    version = transformers_version()
    if layout_name == kinds.Layout.EP:
        if "ep_size" not in fields:
            kwargs: dict[str, bool | int] = {"enable_expert_parallel": True}
            if "tp_size" in fields:  # before 5.13 the TP (and so EP) group is the whole world
                kwargs["tp_size"] = world_size
            return kwargs
        if version < Version(FIRST_REFUSING_REPLICATED_DENSE_EP):
            return {"ep_size": world_size, "tp_size": world_size, "tp_plan": {}}
        # These releases refuse EP beside replicated dense weights: shard the dense ones with TP.
        return {"ep_size": world_size, "tp_size": world_size}
    if layout_name == kinds.Layout.FSDP:
        return {"fsdp_size": world_size}
    if layout_name == kinds.Layout.FSDP_EP:
        return {"ep_size": world_size, "fsdp_size": world_size}
    raise ValueError(
        f"transformers has no distributed loading for layout {layout_name!r}; "
        f"known: {sorted(map(str, set(LAYOUTS) - {kinds.Layout.FULLY_SHARD}))}"
    )


def build_load_caches() -> None:
    """Build what every load of a release first builds once per process: from 5.x on, transformers' checkpoint
    conversion mapping (every family's weight renamings and converters, a few hundred regexes compiled: about 0.27 s
    of each rank's first load). This module calls it at import, so the rank pool's template has it before it forks
    (a fresh rank per test would otherwise build it again). The mapping is the library's own constant table: a load
    hands a rank a deep copy of its entry, so nothing a test does to its copy reaches the next test's fork."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    except ImportError:  # a release without the mapping
        return
    get_checkpoint_conversion_mapping("")  # any model type: the first call builds the whole table


def _implementation_kwargs(experts_implementation: str | None) -> dict:
    return {} if experts_implementation is None else {"experts_implementation": experts_implementation}


@functools.cache
def model_class(checkpoint: str):
    """The class a checkpoint loads through: the Auto class its config maps to (families.model_class). Cached:
    a checkpoint folder is written once per session, and every case of its family asks (the caller and each rank)."""
    from models import families
    from transformers import AutoConfig

    return families.model_class(AutoConfig.from_pretrained(checkpoint))


def load_whole(checkpoint: str, dtype: torch.dtype, device: torch.device, experts_implementation: str | None = None,
               cls=None):
    """The reference: the same checkpoint loaded whole on this rank's device (through `cls` when given)."""
    return (
        (cls or model_class(checkpoint))
        .from_pretrained(checkpoint, dtype=dtype, **_implementation_kwargs(experts_implementation))
        .to(device)
    )


@dataclass(frozen=True)
class Loaded:
    """A whole model as from_pretrained gave it (nothing has run on it: keep a copy), and how it was asked for: a
    second load of the same checkpoint, dtype and experts implementation is a copy of it (the same files read the
    same way give the same weights, buffers and settings), which costs a few ms where a load costs tens."""

    model: torch.nn.Module
    dtype: torch.dtype
    experts_implementation: str | None


def whole_as_loaded(loaded: Loaded | None, checkpoint: str, dtype: torch.dtype, device: torch.device,
                    experts_implementation: str | None, cls=None):
    """load_whole's model: a copy of `loaded` where that was loaded the same way, else loaded."""
    if loaded is not None and (loaded.dtype, loaded.experts_implementation) == (dtype, experts_implementation):
        return copy.deepcopy(loaded.model).to(device)
    return load_whole(checkpoint, dtype, device, experts_implementation, cls)


def eager_implementation(cls) -> str | None:
    """The experts implementation of load_eager: the eager loop where the model lets one be set (every release has
    it; fused kernels such as grouped_mm offer no float64), else None (its own forward)."""
    can_set = getattr(cls, "_can_set_experts_implementation", None)
    settable = "eager" in experts_implementations() and (can_set is None or can_set())
    return "eager" if settable else None


def load_eager(checkpoint: str, dtype: torch.dtype, device: torch.device, cls=None, loaded: Loaded | None = None):
    """The whole model with the eager experts loop where the model lets one be set, else its own forward (a copy of
    `loaded` where that is the same load)."""
    cls = cls or model_class(checkpoint)
    return whole_as_loaded(loaded, checkpoint, dtype, device, eager_implementation(cls), cls)


def load_reference(checkpoint: str, dtype: torch.dtype, device: torch.device, cls=None, loaded: Loaded | None = None):
    """The ground truth the bounds are measured against (checks/tolerances.py): the whole model with exactly the case
    dtype's weights, computed in float64 by the eager experts loop (a copy of `loaded` where that is the same
    load, cast)."""
    from checks.tolerances import REFERENCE_DTYPE

    return load_eager(checkpoint, dtype, device, cls, loaded).to(REFERENCE_DTYPE)


def load_sharded(
    checkpoint: str,
    layout_name: kinds.Layout,
    world_size: int,
    dtype: torch.dtype,
    experts_implementation: str | None = None,
    cls=None,
    mixed_precision: bool = False,
):
    """The checkpoint loaded sharded by transformers itself, on the process group already initialised.
    `mixed_precision`: FSDP2's MixedPrecisionPolicy as transformers sets it (bfloat16 compute, float32 gradient
    reduction; DistributedConfig(fsdp_mixed_precision=True)), on `dtype` (float32) parameters."""
    from transformers.distributed.configuration_utils import DistributedConfig

    kwargs = distributed_config_kwargs(layout_name, world_size)
    if mixed_precision:
        kwargs["fsdp_mixed_precision"] = True
    config = DistributedConfig(**kwargs)
    return (cls or model_class(checkpoint)).from_pretrained(
        checkpoint, dtype=dtype, distributed_config=config, **_implementation_kwargs(experts_implementation)
    )


build_load_caches()
