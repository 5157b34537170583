"""Peering messages: deltas with a base, gets with known heads, and what they refuse."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mycelia.errors import DecodeError
from mycelia.proto import DEFAULT_LIMITS, EntityId, EventId
from mycelia.proto.codec import pack
from mycelia.proto.messages import decode_frame, encode_frame
from mycelia.proto.peering import Delta, DeltasResponse, GetRequest, KnownEntity
from mycelia.proto.state import EntityState, State
from mycelia.testing.strategies import entity_ids, event_ids

ENTITY = EntityId(b"\x02" * 32)
STATE = EntityState(ENTITY, "c", State.of(head={EventId(b"\x01" * 32): 3}, buffers={}))


@given(entity_ids(), st.lists(event_ids(), max_size=4), st.lists(event_ids(), max_size=4))
def test_gets_with_known_heads_and_deltas_with_a_base_round_trip(
    entity: EntityId, known: list[EventId], base: list[EventId]
) -> None:
    get = GetRequest(7, (entity, ENTITY), (KnownEntity(entity, tuple(known)),))
    assert decode_frame(encode_frame(get)) == get
    deltas = DeltasResponse(
        7,
        (
            Delta(ENTITY, "c", True, STATE, (), tuple(base)),
            Delta(ENTITY, "c", False, None, ()),
        ),
    )
    assert decode_frame(encode_frame(deltas)) == deltas


def _frame_with(delta_fields: list[object]) -> bytes:
    return pack([DeltasResponse.TAG, 1, [delta_fields]])


def test_a_base_without_a_state_is_refused() -> None:
    fields = Delta(ENTITY, "c", True, None, ()).to_wire()
    fields[-1] = [EventId(b"\x01" * 32)]
    with pytest.raises(DecodeError, match="base comes only with a state"):
        decode_frame(_frame_with(fields))


def test_a_base_wider_than_a_clock_is_refused() -> None:
    width = DEFAULT_LIMITS.max_clock_width + 1
    wide = tuple(EventId(i.to_bytes(32, "big")) for i in range(1, width + 1))
    fields = Delta(ENTITY, "c", True, STATE, (), wide).to_wire()
    with pytest.raises(DecodeError):
        decode_frame(_frame_with(fields))


@pytest.mark.parametrize("bad", [b"short", "text", [b"\x01" * 31]])
def test_a_malformed_base_is_refused(bad: object) -> None:
    fields = Delta(ENTITY, "c", True, STATE, ()).to_wire()
    fields[-1] = bad
    with pytest.raises(DecodeError):
        decode_frame(_frame_with(fields))
