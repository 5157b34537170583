from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from mycelia.errors import DecodeError, InvalidArgument
from mycelia.proto import state as state_module
from mycelia.proto.clock import Clock
from mycelia.proto.codec import KNOWN_NAMES, expect_name, pack, valid_names
from mycelia.proto.ids import EntityId, EventId
from mycelia.proto.limits import Limits
from mycelia.proto.state import Deferred, EntityState, State
from mycelia.testing.strategies import entity_ids, event_ids

states = st.builds(
    lambda head, buffers: State.of(head=head, buffers=buffers),
    st.dictionaries(event_ids(), st.integers(1, 2**40), max_size=6),
    st.dictionaries(st.sampled_from(["lww", "text", "zz"]), st.binary(max_size=40), max_size=3),
)


@given(entity_ids(), states)
def test_entity_states_round_trip_byte_for_byte(entity: EntityId, state: State) -> None:
    es = EntityState(entity, "albums", state)
    blob = es.to_bytes()
    again = EntityState.from_bytes(blob)
    assert again == es
    assert again.to_bytes() == blob
    assert again.state.head_generations() == state.head_generations()


def test_a_state_needs_one_generation_per_head_id() -> None:
    with pytest.raises(InvalidArgument):
        State(Clock([EventId(b"\x01" * 32)]), (), ())


def test_a_generation_below_one_is_refused() -> None:
    es = EntityState(
        EntityId(b"\x02" * 32), "c", State.of(head={EventId(b"\x01" * 32): 1}, buffers={})
    )
    wire = es.to_wire()
    wire[2][1] = [0]  # type: ignore[index]
    with pytest.raises(DecodeError, match="at least 1"):
        EntityState.from_bytes(pack(wire))


def _decoded(obj: object) -> State | type[Exception]:
    try:
        return State.from_wire(obj)
    except Exception as exc:  # the outcome compared: a state, or the error's type
        return type(exc)


near_plain_states = st.tuples(
    st.lists(
        st.one_of(
            st.sampled_from([bytes(32), b"\x01" * 32, b"\xff" * 32]),
            st.binary(min_size=32, max_size=32),
            st.binary(max_size=33),
        ),
        max_size=4,
    ),
    st.lists(st.one_of(st.integers(-1, 3), st.booleans()), max_size=4),
    st.lists(
        st.one_of(
            st.tuples(
                st.sampled_from(["lww", "text", "zz", "9bad", ""]),
                st.one_of(st.binary(max_size=8), st.integers(0, 3)),
            ).map(list),
            st.integers(0, 3),
        ),
        max_size=3,
    ),
).map(list)


@given(near_plain_states)
@example([[bytes(32)], [1], [["zz", b""], ["lww", b""]]])  # out of order: sorted
@example([[bytes(32)], [1], [["lww", b""], ["lww", b"x"]]])  # twice: refused
@example([[bytes(32)], [True], [["lww", b""]]])
@example([[bytes(32), b"\x01" * 32], [1, 2], [["lww", b""]]])  # a wide head, in order
@example([[b"\x01" * 32, bytes(32)], [2, 1], [["lww", b""]]])  # out of order: sorted
@example([[bytes(32), bytes(32)], [1, 2], [["lww", b""]]])  # an id twice
def test_the_unchecked_decoding_of_the_common_shape_agrees_with_the_checked_one(
    obj: list[object],
) -> None:
    for name in ("lww", "text", "zz", "albums"):
        expect_name(name, "name")  # known: the fast path may take them
    fast = _decoded(obj)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(state_module, "_plain_state", lambda obj, names, width: None)
        checked = _decoded(obj)
    assert fast == checked


@pytest.mark.parametrize("checked", [False, True], ids=["common shape", "checked path"])
def test_decoded_heads_share_the_id_objects_of_what_they_name(checked: bool) -> None:
    """A client of many concurrent writers decodes the same wide head in every state it
    reads; each copy of each id was an object the collector walked (200 clients × 10
    edits of one entity: 150,000 EventId objects for 2,000 ids)."""
    a, b = EventId(b"\x01" * 32), EventId(b"\x02" * 32)
    sent = EntityState(EntityId(b"\x03" * 32), "c", State.of(head={a: 1, b: 1}, buffers={}))
    with pytest.MonkeyPatch.context() as patch:
        if checked:
            patch.setattr(state_module, "_plain_state", lambda obj, names, width: None)
        first, second = (EntityState.from_bytes(sent.to_bytes()) for _ in range(2))
    assert first == second == sent
    for one, other in zip(first.state.head.ids, second.state.head.ids, strict=True):
        assert one is other


def test_a_name_never_checked_goes_through_the_checks() -> None:
    head = [bytes(32)]
    fresh = Limits()
    assert "a-new-backend" not in valid_names(fresh)
    state = State.from_wire([head, [1], [["a-new-backend", b"x"]]], limits=fresh)
    assert state.buffers == (("a-new-backend", b"x"),)
    assert "a-new-backend" in valid_names(fresh)
    with pytest.raises(DecodeError, match="not a valid name"):
        State.from_wire([head, [1], [["9-bad", b"x"]]], limits=fresh)
    assert "9-bad" not in valid_names(fresh)


def test_remembered_names_are_bounded() -> None:
    fresh = Limits()
    for i in range(KNOWN_NAMES + 10):
        expect_name(f"n{i}", "name", limits=fresh)
    assert len(valid_names(fresh)) == KNOWN_NAMES


def test_parts_given_as_a_function_are_made_once_when_first_read_and_stored() -> None:
    calls = []

    def parts() -> tuple[bytes, ...]:
        calls.append(1)
        return (b"base", b"update")

    buffer = Deferred(lambda: b"merged", estimate=10, parts=parts)
    head = Clock.single(EventId(b"\x02" * 32))
    state = EntityState(EntityId(b"\x01" * 32), "docs", State(head, (3,), (("text", buffer),)))
    assert calls == [], "nobody read them yet"
    stored = state.to_stored()
    assert stored != state.to_bytes(), "stored as parts, not as the merged buffer"
    assert EntityState.from_bytes(stored, merge=lambda _, got: b"|".join(got)).state.buffers == (
        ("text", b"base|update"),
    )
    assert buffer.parts == (b"base", b"update")
    assert calls == [1]
