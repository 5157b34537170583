from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mycelia.proto import clock as clock_module
from mycelia.proto.clock import EMPTY_CLOCK, Clock
from mycelia.proto.ids import EventId

ids = st.binary(min_size=32, max_size=32).map(EventId)


@given(st.lists(ids, max_size=20))
def test_a_clock_is_sorted_and_deduplicated_whatever_order_it_is_built_from(
    values: list[EventId],
) -> None:
    clock = Clock(values)
    assert list(clock) == sorted(set(values))
    assert Clock(reversed(values)) == clock
    assert Clock(values + values) == clock
    assert hash(Clock(reversed(values))) == hash(clock)


@given(st.lists(ids, max_size=30), ids)
def test_membership_agrees_with_a_set(values: list[EventId], probe: EventId) -> None:
    clock = Clock(values)
    for v in values:
        assert v in clock
    assert (probe in clock) == (probe in set(values))


@given(st.lists(ids, max_size=10), st.lists(ids, max_size=10), ids)
def test_set_helpers_agree_with_sets(a: list[EventId], b: list[EventId], x: EventId) -> None:
    ca, cb = Clock(a), Clock(b)
    assert set(ca.union(cb)) == set(a) | set(b)
    assert set(ca.difference(cb)) == set(a) - set(b)
    assert set(ca.intersection(cb)) == set(a) & set(b)
    assert ca.issubset(cb) == (set(a) <= set(b))
    assert set(ca.with_event(x)) == set(a) | {x}
    assert set(ca.without(x)) == set(a) - {x}
    assert list(ca.with_event(x)) == sorted(set(a) | {x})


def test_the_empty_clock_is_falsy_and_equal_to_any_empty_clock() -> None:
    assert not EMPTY_CLOCK
    assert Clock() == EMPTY_CLOCK
    assert len(EMPTY_CLOCK) == 0


def test_a_clock_never_equals_a_plain_tuple() -> None:
    x = EventId(b"\x01" * 32)
    assert Clock([x]) != (x,)


def test_one_id_clocks_are_shared_within_a_bounded_table(monkeypatch: pytest.MonkeyPatch) -> None:
    one = EventId(b"\x01" * 32)
    assert Clock.single(one) is Clock.single(EventId(bytes(one)))
    assert Clock.single(one) == Clock([one])
    assert hash(Clock.single(one)) == hash(Clock([one]))

    monkeypatch.setattr(clock_module, "_SINGLES", {})
    monkeypatch.setattr(clock_module, "SINGLES_CAP", 3)
    for n in range(10):  # hostile ids cannot grow it: full, it starts over
        event_id = EventId(bytes([n]) * 32)
        assert list(Clock.single(event_id)) == [event_id]
        assert len(clock_module._SINGLES) <= 3
