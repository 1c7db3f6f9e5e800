"""The suite's names (checks/kinds.py) read as their plain values wherever they are written, so test ids, JUnit
properties and results stay as they were with string literals; and the tables that name layouts and checks use them."""

from __future__ import annotations

import json

import pytest
from checks import rank_cases
from checks.kinds import Check, Layout
from loading import tf_adapter
from training import device_cases, steps
from upstream import table

MEMBERS = [*Layout, *Check]


@pytest.mark.parametrize("member", MEMBERS, ids=[f"{type(member).__name__}.{member.name}" for member in MEMBERS])
def test_a_member_is_written_as_its_plain_value(member):
    value = member.value
    assert type(value) is str
    assert str(member) == value
    assert type(str(member)) is str
    assert f"{member}" == value
    assert format(member, "") == value
    assert f"{member:>20}" == f"{value:>20}"
    assert "%s" % member == value  # noqa: UP031 - %-formatting is one of the ways a name gets written
    assert json.dumps(member) == json.dumps(value)
    assert json.dumps({member: [member]}) == json.dumps({value: [value]})


@pytest.mark.parametrize("member", MEMBERS, ids=[f"{type(member).__name__}.{member.name}" for member in MEMBERS])
def test_a_member_and_its_plain_string_are_the_same_key(member):
    """The known-bugs table's matching (KnownBug.covers) compares members with what a case holds, which may be a
    plain string (a case made outside the suite, as in these self-tests)."""
    value = member.value
    assert member == value
    assert hash(member) == hash(value)
    assert value in {member} and member in {value}
    assert type(member)(value) is member


def test_the_suites_tables_name_their_layouts_and_checks_as_members():
    assert all(isinstance(name, Layout) for name in tf_adapter.LAYOUTS)
    assert all(isinstance(layout.name, Layout) and layout.name == name for name, layout in tf_adapter.LAYOUTS.items())
    assert isinstance(device_cases.LAYOUT, Layout)
    assert all(isinstance(name, Check) for name in (*rank_cases.CHECKS, *steps.ONE_STEP_CHECKS, *device_cases.CHECKS))
    for bug in table.ENTRIES:
        assert all(isinstance(layout, Layout) for layout in bug.layouts), bug.key
        assert all(isinstance(check, Check) for check in bug.checks), bug.key
