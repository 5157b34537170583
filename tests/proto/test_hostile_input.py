"""Hostile bytes never raise anything but a typed DecodeError, and never allocate past limits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mycelia.errors import DecodeError, PayloadTooLarge
from mycelia.proto.event import Event
from mycelia.proto.ids import NodeId
from mycelia.proto.messages import decode_frame, encode_frame
from mycelia.proto.peering import Presence
from mycelia.proto.state import EntityState
from tests.proto.test_event import golden_events

Codec = tuple[Callable[[bytes], Any], Callable[[Any], bytes]]
CODECS: list[Codec] = [
    (Event.from_bytes, Event.to_bytes),
    (decode_frame, encode_frame),
    (EntityState.from_bytes, EntityState.to_bytes),
]


def assert_refused_or_valid(codec: Codec, data: bytes) -> None:
    """``data`` gets a DecodeError, or decodes to a value that its encoder gives back.

    Anything else escaping the decoder (a KeyError, a TypeError...) fails the test.
    """
    decode, encode = codec
    try:
        value = decode(data)
    except DecodeError:
        return
    assert decode(encode(value)) == value


def _valid_samples() -> list[bytes]:
    root, genesis, update = golden_events()
    return [root.to_bytes(), genesis.to_bytes(), update.to_bytes()]


@pytest.mark.parametrize("codec", CODECS)
@given(data=st.binary(max_size=512))
def test_random_bytes_get_a_decode_error_or_a_value_that_round_trips(
    codec: Codec, data: bytes
) -> None:
    assert_refused_or_valid(codec, data)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",  # never-used msgpack byte
        b"\x95",  # an array header with nothing after it
        b"\xd4\x01\x00",  # an extension type
    ],
)
def test_empty_unused_truncated_and_extension_bytes_get_a_decode_error_from_every_decoder(
    codec: Codec, data: bytes
) -> None:
    with pytest.raises(DecodeError):
        codec[0](data)


@given(st.sampled_from(_valid_samples()), st.data())
def test_truncations_and_bit_flips_of_valid_events_get_a_decode_error_or_a_valid_event(
    blob: bytes, data: st.DataObject
) -> None:
    cut = data.draw(st.integers(0, len(blob) - 1))
    with pytest.raises(DecodeError):
        Event.from_bytes(blob[:cut])
    i = data.draw(st.integers(0, len(blob) - 1))
    bit = data.draw(st.integers(0, 7))
    flipped = bytearray(blob)
    flipped[i] ^= 1 << bit
    try:
        event = Event.from_bytes(bytes(flipped))
    except DecodeError:
        return
    # A flip that still decodes is a different (valid) event whose id is its own hash.
    assert Event.from_bytes(event.to_bytes()) == event


def _wrong_values() -> st.SearchStrategy[object]:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**64 - 1),
        st.floats(allow_nan=False),
        st.text(max_size=8),
        st.binary(max_size=40),
        st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3),
        st.dictionaries(st.text(max_size=3), st.integers(0, 9), max_size=2),
    )


@given(st.sampled_from(_valid_samples()), st.data())
def test_a_wrong_value_in_any_field_gets_a_decode_error_or_a_valid_event(
    blob: bytes, data: st.DataObject
) -> None:
    fields = msgpack.unpackb(blob)
    i = data.draw(st.integers(0, len(fields) - 1))
    fields[i] = data.draw(_wrong_values())
    assert_refused_or_valid(CODECS[0], msgpack.packb(fields, use_bin_type=True))


def test_a_wrong_type_in_the_collection_field_gets_a_decode_error() -> None:
    _, genesis, _ = golden_events()
    fields = msgpack.unpackb(genesis.to_bytes())
    fields[[type(f) for f in fields].index(str)] = 7
    with pytest.raises(DecodeError):
        Event.from_bytes(msgpack.packb(fields, use_bin_type=True))


@pytest.mark.parametrize(
    "header",
    [
        b"\xc6\xff\xff\xff\xff",  # bin32 claiming 4 GiB
        b"\xdb\xff\xff\xff\xff",  # str32 claiming 4 GiB
        b"\xdd\xff\xff\xff\xff",  # array32 claiming 4 billion items
        b"\xdf\xff\xff\xff\xff",  # map32 claiming 4 billion pairs
    ],
)
def test_huge_length_headers_are_refused_before_allocating(header: bytes) -> None:
    with pytest.raises(DecodeError):
        Event.from_bytes(header + b"\x00" * 16)


def test_a_frame_beyond_the_frame_limit_is_payload_too_large() -> None:
    with pytest.raises(PayloadTooLarge):
        decode_frame(b"\x00" * (10 * 1024 * 1024))


def test_deep_nesting_gets_a_decode_error() -> None:
    with pytest.raises(DecodeError):
        decode_frame(b"\x91" * 100_000 + b"\x00")


@given(st.binary(min_size=32, max_size=32), st.booleans(), st.binary(min_size=32, max_size=32))
def test_messages_round_trip(node: bytes, durable: bool, challenge: bytes) -> None:
    msg = Presence(NodeId(node), durable, None, 1, challenge)
    assert decode_frame(encode_frame(msg)) == msg
