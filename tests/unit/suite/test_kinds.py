"""The suite's names (checks/kinds.py) read as their plain values wherever they are written, so test ids, JUnit
properties and results stay as they were with string literals."""

from __future__ import annotations

import json

import pytest
from checks.kinds import Check, Layout

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

