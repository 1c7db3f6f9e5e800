"""Coverage as a number: the model families the installed transformers declares an expert-parallel plan for
(`base_model_ep_plan` on the config class), and those of them the suite runs EP cases on.

The suite records both as testsuite properties (`ep_families_declared`, `ep_families_covered`: comma-separated
model_type lists) beside `transformers_version`; reports say "EP families covered: N of M (transformers X)".
"""

from __future__ import annotations

import warnings

import families


def declared_ep_families() -> list[str]:
    """Every model_type whose config class carries a non-empty EP plan in the installed release."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

    declared = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation notes of configs we only look at
        for model_type in CONFIG_MAPPING_NAMES:
            try:
                config_class = CONFIG_MAPPING[model_type]
            except (ImportError, AttributeError, KeyError):  # a config needing an extra that is not installed
                continue
            if getattr(config_class, "base_model_ep_plan", None):
                declared.append(model_type)
    return sorted(declared)


def covered_ep_families(declared: list[str]) -> list[str]:
    """The suite's MoE families the installed release declares EP for (their EP cases run, not skip)."""
    return sorted(set(families.MOE_FAMILIES) & set(declared))


def suite_properties() -> dict[str, str]:
    import transformers

    declared = declared_ep_families()
    return {
        "ep_families_declared": ",".join(declared),
        "ep_families_covered": ",".join(covered_ep_families(declared)),
        "transformers_version": transformers.__version__,
    }
