from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mycelia.errors import DecodeError, InvalidArgument
from mycelia.proto.clock import Clock
from mycelia.proto.codec import pack
from mycelia.proto.ids import EntityId, EventId
from mycelia.proto.state import EntityState, State
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
