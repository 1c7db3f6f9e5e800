"""Prints the suite's measured errors per family x layout x experts implementation x dtype from a results
junit.xml: the largest logits and gradient errors, their bounds (measured in the run: checks/tolerances.py), the ratio
of error to bound and the smallest routing margin; then the worst ratio of error to bound per dtype over the
cases that passed (the room correct runs leave: tolerances.FACTOR was chosen from it).

    python tests/gpu/checks/noise_table.py results/<cell>/junit.xml [more junit.xml ...]

Run by hand, not collected (no test_ prefix).
"""

from __future__ import annotations

import contextlib
import math
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from typing import Any

from harness import contract

KEY = (contract.FAMILY, contract.CASE_LAYOUT, contract.CASE_EXPERTS_IMPLEMENTATION, contract.CASE_DTYPE)
COLUMNS = (
    "cases",
    "failed",
    "max logits diff",
    "logits bound",
    "logits error/bound",
    "max grad err",
    "grad bound",
    "grad error/bound",
    "min routing margin",
)


def read_cases(paths: list[str]) -> list[dict]:
    """Every testcase's properties (numbers parsed), with `failed` set when it failed or errored."""
    cases = []
    for path in paths:
        for testcase in ET.parse(path).getroot().iter("testcase"):
            properties: dict[str, Any] = {
                str(prop.get("name")): prop.get("value") for prop in testcase.iter("property")
            }
            if not all(name in properties for name in KEY):
                continue
            for name, value in properties.items():
                with contextlib.suppress(TypeError, ValueError):  # the non-numeric ones stay text
                    properties[name] = float(value)
            properties["failed"] = testcase.find("failure") is not None or testcase.find("error") is not None
            properties["test"] = testcase.get("name", "")
            # a correct run: neither failed, nor xfailed (written as skipped), nor planting a defect on purpose
            clean = not properties["failed"] and testcase.find("skipped") is None
            properties["passed"] = clean and contract.PLANTED_DEFECT not in properties
            cases.append(properties)
    return cases


def _worst(values: list[Any]) -> float | None:
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
        logits = _worst([case.get(contract.LOGITS_DIFFERENCE) for case in group])
        atol = _worst([case.get(contract.LOGITS_ATOL) for case in group])
        grad = _worst([case.get(contract.GRAD_ERROR) for case in group])
        bound = _worst([case.get(contract.GRAD_BOUND) for case in group])
        margins = [
            case[contract.ROUTING_MARGIN] for case in group if isinstance(case.get(contract.ROUTING_MARGIN), float)
        ]
        table.append(
            (
                *key,
                len(group),
                sum(case["failed"] for case in group),
                logits,
                atol,
                _worst_ratio(group, contract.LOGITS_DIFFERENCE, contract.LOGITS_ATOL),
                grad,
                bound,
                _worst_ratio(group, contract.GRAD_ERROR, contract.GRAD_BOUND),
                min(margins) if margins else None,
            )
        )
    return table


def _ratio(error: float | None, bound: float | None) -> float | None:
    if bound is None or error is None or math.isnan(error):
        return None
    return math.inf if bound == 0 else error / bound


def _worst_ratio(group: list[dict], error: str, bound: str) -> float | None:
    """The largest error / bound of one case of the group (each case has its own bound)."""
    return _worst([ratio for case in group if (ratio := _ratio(case.get(error), case.get(bound))) is not None])


def worst_ratios(cases: list[dict]) -> dict[tuple[str, str], tuple[float, str]]:
    """(dtype, "logits" | "gradients" | "trained parameters") -> the largest error / bound of a case that passed,
    with its test."""
    worst: dict[tuple[str, str], tuple[float, str]] = {}
    for case in cases:
        if not case["passed"]:
            continue
        for quantity, error, bound in (
            ("logits", contract.LOGITS_DIFFERENCE, contract.LOGITS_ATOL),
            ("gradients", contract.GRAD_ERROR, contract.GRAD_BOUND),
            ("trained parameters", contract.PARAM_ERROR, contract.PARAM_BOUND),
        ):
            ratio = _ratio(case.get(error), case.get(bound))
            key = (case[contract.CASE_DTYPE], quantity)
            if ratio is not None and ratio > worst.get(key, (-1.0, ""))[0]:
                worst[key] = (ratio, case["test"])
    return worst


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python tests/gpu/checks/noise_table.py JUNIT_XML [JUNIT_XML ...]", file=sys.stderr)
        return 2
    header = (*KEY, *COLUMNS)
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    cases = read_cases(argv)
    for row in rows(cases):
        print("| " + " | ".join(_cell(value) for value in row) + " |")
    print()
    for (dtype, quantity), (ratio, test) in sorted(worst_ratios(cases).items()):
        print(f"worst error/bound, {dtype} {quantity}: {ratio:.3g} ({test})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
