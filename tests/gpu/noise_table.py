"""Prints the suite's measured errors per family x layout x experts implementation x dtype from a results
junit.xml: the largest logits and gradient errors, their bounds, the margin (bound / error) and the smallest
routing margin. The bounds in tolerances.py come from these tables.

    python tests/gpu/noise_table.py results/<cell>/junit.xml [more junit.xml ...]

Run by hand, not collected (no test_ prefix).
"""

from __future__ import annotations

import contextlib
import math
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict

KEY = ("family", "layout", "experts_implementation", "dtype")
COLUMNS = (
    "cases",
    "failed",
    "max logits diff",
    "logits atol",
    "logits margin",
    "max grad err",
    "grad bound",
    "grad margin",
    "min routing margin",
)


def read_cases(paths: list[str]) -> list[dict]:
    """Every testcase's properties (numbers parsed), with `failed` set when it failed or errored."""
    cases = []
    for path in paths:
        for testcase in ET.parse(path).getroot().iter("testcase"):
            properties = {prop.get("name"): prop.get("value") for prop in testcase.iter("property")}
            if not all(name in properties for name in KEY):
                continue
            for name, value in properties.items():
                with contextlib.suppress(TypeError, ValueError):  # the non-numeric ones stay text
                    properties[name] = float(value)
            properties["failed"] = testcase.find("failure") is not None or testcase.find("error") is not None
            cases.append(properties)
    return cases


def _worst(values: list[float]) -> float | None:
    numbers = [value for value in values if isinstance(value, float)]
    if not numbers:
        return None
    return math.nan if any(math.isnan(value) for value in numbers) else max(numbers)


def rows(cases: list[dict]) -> list[tuple]:
    groups = defaultdict(list)
    for case in cases:
        groups[tuple(case[name] for name in KEY)].append(case)
    table = []
    for key in sorted(groups):
        group = groups[key]
        logits = _worst([case.get("max_logits_difference") for case in group])
        atol = _worst([case.get("logits_atol") for case in group])
        grad = _worst([case.get("max_rel_grad_error") for case in group])
        bound = _worst([case.get("grad_error_bound") for case in group])
        margins = [case["min_routing_margin"] for case in group if isinstance(case.get("min_routing_margin"), float)]
        table.append(
            (
                *key,
                len(group),
                sum(case["failed"] for case in group),
                logits,
                atol,
                _ratio(atol, logits),
                grad,
                bound,
                _ratio(bound, grad),
                min(margins) if margins else None,
            )
        )
    return table


def _ratio(bound: float | None, error: float | None) -> float | None:
    if bound is None or error is None or math.isnan(error):
        return None
    return math.inf if error == 0 else bound / error


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python tests/gpu/noise_table.py JUNIT_XML [JUNIT_XML ...]", file=sys.stderr)
        return 2
    header = (*KEY, *COLUMNS)
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for row in rows(read_cases(argv)):
        print("| " + " | ".join(_cell(value) for value in row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
