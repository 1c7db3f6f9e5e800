"""`--random-order SEED` (harness/ranks/order.py): the same seed gives the same order, another seed another,
and the header names the seed so a red can be run again in its order."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

TESTS = "\n".join(f"def test_{index}(request):\n    ORDER.append({index})\n" for index in range(12))


def run_order(pytester: pytest.Pytester, *args: str) -> tuple[list[int], pytest.RunResult]:
    pytester.makepyfile(test_order_probe="ORDER = []\n\n" + TESTS + """
def test_zz_report():
    pass


def teardown_module():
    import json, pathlib
    pathlib.Path("order.json").write_text(json.dumps(ORDER))
""")
    result = pytester.runpytest("-p", "harness.ranks.plugin", *args)
    result.assert_outcomes(passed=13)
    import json

    return json.loads((pytester.path / "order.json").read_text()), result


def test_a_seed_gives_one_order_every_time_and_another_seed_another(pytester):
    default, _ = run_order(pytester)
    first, result = run_order(pytester, "--random-order", "1")
    again, _ = run_order(pytester, "--random-order", "1")
    other, _ = run_order(pytester, "--random-order", "2")
    assert default == list(range(12))
    assert first == again and sorted(first) == default and first != default and other != first
    result.stdout.fnmatch_lines(["random order: seed 1 (--random-order 1 runs this order again)"])


def test_a_seed_that_is_not_a_number_is_a_usage_error(pytester):
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest("-p", "harness.ranks.plugin", "--random-order", "soon")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--random-order: invalid int value: 'soon'*"])
