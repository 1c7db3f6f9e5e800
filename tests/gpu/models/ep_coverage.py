"""Coverage as a number: the model families the installed transformers declares an expert-parallel plan for
(`base_model_ep_plan` on the config class), and those of them the suite runs EP cases on: every declared
family but the ones families.NOT_COVERED lists with a reason.

The suite records these as testsuite properties (harness/contract.py: `ep_families_declared`,
`ep_families_covered`, comma-separated; `ep_families_not_covered`, a JSON object of reasons) beside
`transformers_version`; reports say "EP families covered: N of M (transformers X)" and list the rest.
"""

from __future__ import annotations

import json

from harness import contract
from models import families


def covered_ep_families(declared: list[str]) -> list[str]:
    """The declared families whose EP cases the suite runs (deep or wide)."""
    return sorted(name for name in declared if name not in families.NOT_COVERED)


def not_covered_ep_families(declared: list[str]) -> dict[str, str]:
    return {name: families.NOT_COVERED[name] for name in sorted(declared) if name in families.NOT_COVERED}


def suite_properties() -> dict[str, str]:
    import transformers

    declared = families.declared_ep_families()
    return {
        contract.EP_FAMILIES_DECLARED: ",".join(declared),
        contract.EP_FAMILIES_COVERED: ",".join(covered_ep_families(declared)),
        contract.EP_FAMILIES_NOT_COVERED: json.dumps(not_covered_ep_families(declared)),
        contract.TRANSFORMERS_VERSION: transformers.__version__,
    }
