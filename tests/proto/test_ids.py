from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mycelia.errors import DecodeError, InvalidArgument
from mycelia.proto.ids import EntityId, EventId


@given(st.binary(min_size=32, max_size=32))
def test_ids_round_trip_through_their_text_form(raw: bytes) -> None:
    event_id = EventId(raw)
    text = event_id.to_base64()
    assert len(text) == 43
    assert "=" not in text
    assert EventId.from_base64(text) == event_id
    assert str(event_id) == text


@given(st.binary(min_size=32, max_size=32), st.binary(min_size=32, max_size=32))
def test_ids_order_by_their_bytes(a: bytes, b: bytes) -> None:
    assert (EventId(a) < EventId(b)) == (a < b)


@pytest.mark.parametrize("length", [0, 1, 31, 33, 64])
def test_an_id_of_the_wrong_length_is_refused(length: int) -> None:
    with pytest.raises(InvalidArgument, match="32 bytes"):
        EventId(b"\x00" * length)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "short",
        "A" * 42,
        "A" * 44,
        "!" * 43,
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA/",  # '/' is not URL-safe base64
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAB",  # non-zero padding bits: not canonical
    ],
)
def test_bad_text_is_refused_with_a_decode_error(text: str) -> None:
    with pytest.raises(DecodeError):
        EventId.from_base64(text)


def test_an_entity_id_is_its_genesis_event_id() -> None:
    event_id = EventId(bytes(range(32)))
    entity_id = EntityId.of_genesis(event_id)
    assert isinstance(entity_id, EntityId)
    assert entity_id.genesis_id() == event_id
    assert type(entity_id.genesis_id()) is EventId
