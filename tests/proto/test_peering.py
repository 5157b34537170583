"""Peering messages: deltas with a base, gets with known heads, the request table, and
what they refuse."""

from __future__ import annotations

import dataclasses
import gc
import tracemalloc

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from mycelia.errors import DecodeError, InvalidArgument, PayloadTooLarge, RemoteProtocolError
from mycelia.proto import DEFAULT_LIMITS, EntityId, EventId
from mycelia.proto import delta as delta_module
from mycelia.proto.codec import COUNTED_PAYLOAD, expect_name, pack, unpack
from mycelia.proto.delta import DELTAS
from mycelia.proto.messages import Message, decode_frame, encode_frame, message_types, peek
from mycelia.proto.peering import (
    PAGES,
    REQUESTS,
    RESPONSES,
    Ack,
    Delta,
    DeltasPage,
    DeltasResponse,
    ErrorResponse,
    EventsResponse,
    GetEventsRequest,
    GetRequest,
    KnownEntity,
    Presence,
    PresenceProof,
    PresenceRejected,
    SubscriptionEnded,
    SubscriptionUpdate,
    SystemRequest,
    expect_response,
)
from mycelia.proto.schema import Record, record
from mycelia.proto.state import EntityState, State
from mycelia.testing.strategies import entity_ids, event_ids
from tests.proto.test_event import golden_events

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


_STATES = st.builds(
    lambda head, buffers: State.of(head=head, buffers=buffers),
    st.dictionaries(event_ids(), st.integers(1, 2**40), max_size=3),
    st.dictionaries(st.sampled_from(["lww", "text"]), st.binary(max_size=20), max_size=2),
)
_DELTAS = st.lists(
    st.builds(
        lambda entity, matches, state, stored, events, base: Delta(
            entity,
            "c",
            matches,
            None
            if state is None
            else EntityState.from_bytes(EntityState(entity, "c", state).to_bytes(), keep=stored),
            events,
            None if state is None else base,
        ),
        entity_ids(),
        st.booleans(),
        st.none() | _STATES,
        st.booleans(),
        st.sampled_from([(), golden_events()[:1]]),
        st.none() | st.lists(event_ids(), max_size=2).map(tuple),
    ),
    max_size=20,
)


@given(_DELTAS, st.integers(0, 2**40))
def test_a_page_splices_the_stored_states_into_the_very_bytes_the_generic_encoder_makes(
    deltas: list[Delta], request_id: int
) -> None:
    for kind in (DeltasResponse, DeltasPage):
        page = kind(request_id, tuple(deltas))
        frame = encode_frame(page)
        assert frame == pack([kind.TAG, *page.to_wire()])
        assert decode_frame(frame) == page


def test_a_page_of_stored_states_does_not_encode_them_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stored = EntityState.from_bytes(STATE.to_bytes(), keep=True)
    assert stored.wire == STATE.to_bytes()
    assert stored.wire_size() == len(stored.wire)
    page = DeltasPage(1, tuple(Delta(ENTITY, "c", True, stored, ()) for _ in range(70_000)))
    expected = pack([DeltasPage.TAG, *page.to_wire()])  # (an array 32 of deltas)

    def refuse(self: State) -> list[object]:
        raise AssertionError("a stored state was encoded again")

    monkeypatch.setattr(State, "to_wire", refuse)
    assert encode_frame(page) == expected


def test_a_copy_of_a_stored_state_does_not_keep_its_bytes() -> None:
    stored = EntityState.from_bytes(STATE.to_bytes(), keep=True)
    other = State.of(head={EventId(b"\x05" * 32): 4}, buffers={})
    copy = dataclasses.replace(stored, state=other)
    assert copy.wire is None
    assert copy.to_bytes() == EntityState(ENTITY, "c", other).to_bytes()
    assert EntityState.from_bytes(STATE.to_bytes()).wire is None  # kept only when asked


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


HANDSHAKE: set[type[Message]] = {Presence, PresenceProof, PresenceRejected}
UPDATES: set[type[Message]] = {SubscriptionUpdate, SubscriptionEnded}


def test_every_message_is_a_handshake_frame_a_request_a_response_or_an_update() -> None:
    answers = {t for types in RESPONSES.values() for t in types} | {ErrorResponse}
    answers |= set(PAGES.values())
    kinds = [HANDSHAKE, set(REQUESTS), answers, UPDATES]
    assert set[type[Message]]().union(*kinds) == set(message_types().values())
    assert sum(len(k) for k in kinds) == len(message_types())  # no message is two kinds
    for kind in (*REQUESTS, *answers):
        assert kind.SCHEMA[0][0] == "request_id", kind.__name__


def test_an_expected_response_passes_and_any_other_is_a_remote_protocol_error() -> None:
    ack = Ack(3)
    assert expect_response(ack, Ack) is ack
    with pytest.raises(RemoteProtocolError, match="expected DeltasResponse"):
        expect_response(ack, DeltasResponse)


def test_events_and_generations_must_pair_up() -> None:
    (event,) = golden_events()[1:2]
    frame = pack([EventsResponse.TAG, 1, [event.to_bytes()], [1, 2]])
    with pytest.raises(DecodeError, match="one generation per event"):
        decode_frame(frame)
    with pytest.raises(DecodeError, match="at least 1"):
        decode_frame(pack([EventsResponse.TAG, 1, [event.to_bytes()], [0]]))


def test_a_read_ahead_is_cut_to_a_batch_and_a_long_token_is_too_large() -> None:
    ahead = GetEventsRequest(1, (), 10**9)
    decoded = decode_frame(encode_frame(ahead))
    assert isinstance(decoded, GetEventsRequest)
    assert decoded.ahead == DEFAULT_LIMITS.max_batch_events
    with pytest.raises(PayloadTooLarge, match="token"):
        decode_frame(encode_frame(PresenceProof(b"\x00" * 64, b"t" * 8193)))


def test_a_wrong_field_count_names_the_message() -> None:
    with pytest.raises(DecodeError, match="SystemRequest must have 1 items"):
        decode_frame(pack([SystemRequest.TAG, 1, 2]))


def test_a_record_field_must_declare_how_it_travels() -> None:
    class Loose(Record):
        value: int

    with pytest.raises(InvalidArgument, match=r"Loose\.value"):
        record(Loose)


def test_peeking_at_a_frame_reads_its_tag_and_request_id_without_allocating() -> None:
    # A receiver peeks at every frame before it decodes one. A msgpack Unpacker is a
    # 41 KiB object, and a bare one allocates a 1 MiB buffer besides: one W3 server's run
    # put 60 GB through malloc that way.
    frame = encode_frame(GetEventsRequest(7, (), 1)) + b"\x00" * 100_000
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        found = peek(frame)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert found == (GetEventsRequest.TAG, 7)
    assert peak < 1024


_scalars = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.booleans(),
    st.none(),
    st.binary(max_size=40),
    st.text(max_size=5),
    st.floats(allow_nan=False),
)


@given(st.lists(_scalars, max_size=20), st.binary(max_size=8))
def test_a_peek_reads_what_a_full_decode_reads_and_never_raises(
    items: list[object], tail: bytes
) -> None:
    frame = pack(items)
    decoded = unpack(frame)  # the oracle: msgpack's own decode of the whole frame
    assert isinstance(decoded, list)

    def an_int(value: object) -> int | None:
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    tag = an_int(decoded[0]) if decoded else None
    first = an_int(decoded[1]) if tag is not None and len(decoded) > 1 else None
    assert peek(frame + tail) == (tag, first)
    for cut in range(len(frame)):
        peek(frame[:cut])  # a truncated frame: whatever it says, it does not raise


def test_a_large_frame_decodes_with_no_collection_and_the_collector_resumes() -> None:
    """The collector is paused for a large frame's whole decode (its fields too), and
    resumed whether the decode succeeds or fails."""
    state = State.of(head={EventId(b"\x01" * 32): 3}, buffers={"lww": b"x" * 40})
    entities = [EntityId(n.to_bytes(32, "big")) for n in range(3000)]
    deltas = tuple(Delta(e, "c", True, EntityState(e, "c", state), ()) for e in entities)
    frame = encode_frame(DeltasResponse(1, deltas))
    assert len(frame) > COUNTED_PAYLOAD
    started: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.callbacks.append(count)
    try:
        decoded = decode_frame(frame)
    finally:
        gc.callbacks.remove(count)
    assert decoded == DeltasResponse(1, deltas)
    assert started == [], "no collection while the frame decoded"
    assert gc.isenabled()
    with pytest.raises(DecodeError):
        decode_frame(frame[:-3])
    assert gc.isenabled()


_ID = bytes(range(32))
_plain_state_wire = [[bytes(32)], [1], [["lww", b"\x90"]]]
_DELTA_FIELDS: list[list[object]] = [  # per field: its common form first, then others
    [_ID, bytes(31), 7],
    ["albums", "9bad", 3],
    [True, False, 1, 2, "yes"],
    [
        None,
        [_ID, "albums", _plain_state_wire],
        [bytes(32), "albums", _plain_state_wire],
        [_ID, "albums", [[], [], []]],
        [_ID, "nope!", _plain_state_wire],
        [_ID, "albums", [[bytes(32)], [0], []]],
        [_ID, "albums"],
        4,
    ],
    [[], [golden_events()[1].to_bytes()], [b"junk"], [3], 3],
    [None, [bytes(32)], [b"x"], 5],
]
near_plain_deltas = st.dictionaries(st.integers(0, 5), st.integers(0, 7), max_size=3).map(
    lambda changes: [
        options[changes[i] % len(options)] if i in changes else options[0]
        for i, options in enumerate(_DELTA_FIELDS)
    ]
)


def _deltas_decoded(items: list[object]) -> tuple[Delta, ...] | type[Exception]:
    try:
        return DELTAS.decode(items, "deltas", DEFAULT_LIMITS)
    except Exception as exc:  # the outcome compared: the deltas, or the error's type
        return type(exc)


@given(near_plain_deltas)
@example([_ID, "albums", False, None, [], None])
@example([_ID, "albums", 1, None, [], None])  # an integer for matches: the checked path
def test_the_one_step_decoding_of_a_common_delta_agrees_with_the_checked_one(
    delta: list[object],
) -> None:
    items: list[object] = [delta, [_ID, "albums", True, None, [], None]]
    for name in ("albums", "lww"):
        expect_name(name, "name")  # known: the fast path may take them
    fast = _deltas_decoded(items)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(delta_module, "_plain_delta", lambda obj, names, limits: None)
        checked = _deltas_decoded(items)
    assert fast == checked


def test_a_subscription_answer_and_a_pushed_update_take_the_one_step_decoding() -> None:
    state = EntityState(EntityId(_ID), "albums", State.of(head={EventId(bytes(32)): 1}, buffers={}))
    event = golden_events()[1]
    deltas = (
        Delta(EntityId(_ID), "albums", True, state, ()),
        Delta(event.entity_id, "albums", True, None, (event,)),
    )
    wire = unpack(pack([d.to_wire() for d in deltas]))
    assert isinstance(wire, list)
    expect_name("albums", "name")
    assert all(delta_module._plain_delta(w, {"albums"}, DEFAULT_LIMITS) for w in wire)
    assert DELTAS.decode(wire, "deltas", DEFAULT_LIMITS) == deltas
