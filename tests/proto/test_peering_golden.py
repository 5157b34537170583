"""Golden frames: the exact bytes of every peering message, so the wire can never drift.

Each sample fills every field (and the optional ones both ways). If a frame here changes,
every peer speaking this protocol version breaks: never "fix" this test, fix the code, or
bump ``PROTOCOL_VERSION`` with a note.
"""

from __future__ import annotations

from typing import Final

import pytest

from mycelia.proto import EntityId, EventId, NodeId
from mycelia.proto import peering as wire
from mycelia.proto.messages import Message, decode_frame, encode_frame, message_types
from mycelia.proto.state import EntityState, State
from tests.proto.test_event import golden_events

ROOT, GENESIS, UPDATE = golden_events()
A, B = EntityId(b"\x0a" * 32), EntityId(b"\x0b" * 32)
E1, E2 = EventId(b"\x01" * 32), EventId(b"\x02" * 32)
STATE = EntityState(A, "albums", State.of(head={E1: 3}, buffers={"lww": b"\x90"}))


def samples() -> list[tuple[str, Message]]:
    node = NodeId(b"\x0c" * 32)
    delta = wire.Delta(A, "albums", True, STATE, (UPDATE,), (E2,))
    return [
        ("presence", wire.Presence(node, True, A, 3, b"\x0d" * 32)),
        ("presence-no-root", wire.Presence(node, False, None, 0, b"\x0e" * 32)),
        ("proof", wire.PresenceProof(b"\x0f" * 64, b"token")),
        ("proof-no-token", wire.PresenceProof(b"\x10" * 64)),
        ("rejected", wire.PresenceRejected("protocol version", 2, 1)),
        (
            "get",
            wire.GetRequest(7, (A, B), (wire.KnownEntity(A, (E1, E2)), wire.KnownEntity(B, ()))),
        ),
        ("get-unknown", wire.GetRequest(0, ())),
        ("get-events", wire.GetEventsRequest(8, (E1, E2), 16)),
        ("fetch", wire.FetchRequest(9, "albums", "year > ? LIMIT 3", (1985, "x", None), ())),
        (
            "subscribe",
            wire.SubscribeRequest(10, 3, "albums", "y > 1", (1.5,), (wire.KnownEntity(B, (E2,)),)),
        ),
        ("unsubscribe", wire.UnsubscribeRequest(11, 3)),
        ("commit", wire.CommitRequest(12, (ROOT,))),
        ("commits", wire.CommitsRequest(19, ((ROOT,), (GENESIS, UPDATE)))),
        ("system", wire.SystemRequest(13)),
        ("error", wire.ErrorResponse(14, 106, "not yours")),
        ("ack", wire.Ack(15)),
        ("verdicts", wire.VerdictsResponse(19, (wire.COMMITTED, wire.Verdict(106, "not yours")))),
        ("events", wire.EventsResponse(16, (GENESIS,), (1,))),
        ("events-no-generations", wire.EventsResponse(17, ())),
        ("deltas", wire.DeltasResponse(18, (delta, wire.Delta(B, "albums", False, None, ())))),
        ("deltas-page", wire.DeltasPage(18, (wire.Delta(B, "albums", False, None, ()),))),
        ("events-page", wire.EventsPage(16, (GENESIS,), (1,))),
        ("update", wire.SubscriptionUpdate(3, (wire.Delta(B, "notes", True, None, ()),))),
        ("ended", wire.SubscriptionEnded(3, 106, "the token of 'ann' expired")),
    ]


GOLDEN: Final[dict[str, str]] = {
    "presence": (
        "9601c4200c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0cc3c4200a0a0a"
        "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a03c4200d0d0d0d0d0d0d0d0d0d"
        "0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d"
    ),
    "presence-no-root": (
        "9601c4200c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0cc2c000c4200e"
        "0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e"
    ),
    "proof": (
        "9302c4400f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f"
        "0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0fc405746f6b656e"
    ),
    "proof-no-token": (
        "9302c4401010101010101010101010101010101010101010101010101010101010101010101010101010"
        "1010101010101010101010101010101010101010101010101010c0"
    ),
    "rejected": "9403b070726f746f636f6c2076657273696f6e0201",
    "get": (
        "940a0792c4200a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0ac4200b0b"
        "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b9292c4200a0a0a0a0a0a0a0a"
        "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a92c420010101010101010101010101010101"
        "0101010101010101010101010101010101c4200202020202020202020202020202020202020202020202"
        "02020202020202020292c4200b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b"
        "0b0b90"
    ),
    "get-unknown": "940a009090",
    "get-events": (
        "940b0892c4200101010101010101010101010101010101010101010101010101010101010101c4200202"
        "02020202020202020202020202020202020202020202020202020202020210"
    ),
    "fetch": ("960c09a6616c62756d73b079656172203e203f204c494d4954203393cd07c1a178c090"),
    "subscribe": (
        "970d0a03a6616c62756d73a579203e203191cb3ff80000000000009192c4200b0b0b0b0b0b0b0b0b0b0b"
        "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b91c420020202020202020202020202020202020202"
        "0202020202020202020202020202"
    ),
    "unsubscribe": "930e0b03",
    "commit": (
        "930f0c91c44295b16d7963656c69612f67656e657369732f31c0af5f6d7963656c69615f73797374656d"
        "c410000000000000000000000000000000009192a36c777791c403010203"
    ),
    "commits": (
        "9311139291c44295b16d7963656c69612f67656e657369732f31c0af5f6d7963656c69615f7379737465"
        "6dc410000000000000000000000000000000009192a36c777791c40301020392c46395b16d7963656c69"
        "612f67656e657369732f31c420bd8e1fe12c488c146c7ac2036670e950287f29a8a97f9e23806cd2dc26"
        "8d8bd4a6616c62756d73c410000102030405060708090a0b0c0d0e0f9292a36c777791c4010492a47465"
        "787491c4020506c48a95b06d7963656c69612f7570646174652f31c420b99c43557a5eab01ccbe5b956a"
        "8735dc7fa002e61943c99609cc6775dfdba905a6616c62756d7392c42007070707070707070707070707"
        "07070707070707070707070707070707070707c420b99c43557a5eab01ccbe5b956a8735dc7fa002e619"
        "43c99609cc6775dfdba9059192a36c777791c40108"
    ),
    "system": "92100d",
    "error": "94140e6aa96e6f7420796f757273",
    "ack": "92150f",
    "verdicts": "931b13929200a0926aa96e6f7420796f757273",
    "events": (
        "94171091c46395b16d7963656c69612f67656e657369732f31c420bd8e1fe12c488c146c7ac2036670e9"
        "50287f29a8a97f9e23806cd2dc268d8bd4a6616c62756d73c410000102030405060708090a0b0c0d0e0f"
        "9292a36c777791c4010492a47465787491c40205069101"
    ),
    "events-no-generations": "9417119090",
    "deltas": (
        "9318129296c4200a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0aa6616c"
        "62756d73c393c4200a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0aa661"
        "6c62756d739391c420010101010101010101010101010101010101010101010101010101010101010191"
        "039192a36c7777c4019091c48a95b06d7963656c69612f7570646174652f31c420b99c43557a5eab01cc"
        "be5b956a8735dc7fa002e61943c99609cc6775dfdba905a6616c62756d7392c420070707070707070707"
        "0707070707070707070707070707070707070707070707c420b99c43557a5eab01ccbe5b956a8735dc7f"
        "a002e61943c99609cc6775dfdba9059192a36c777791c4010891c4200202020202020202020202020202"
        "02020202020202020202020202020202020296c4200b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b"
        "0b0b0b0b0b0b0b0b0b0b0ba6616c62756d73c2c090c0"
    ),
    "deltas-page": (
        "9319129196c4200b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0ba6616c"
        "62756d73c2c090c0"
    ),
    "events-page": (
        "941a1091c46395b16d7963656c69612f67656e657369732f31c420bd8e1fe12c488c146c7ac2036670e9"
        "50287f29a8a97f9e23806cd2dc268d8bd4a6616c62756d73c410000102030405060708090a0b0c0d0e0f"
        "9292a36c777791c4010492a47465787491c40205069101"
    ),
    "ended": "941f036aba74686520746f6b656e206f662027616e6e272065787069726564",
    "update": (
        "931e039196c4200b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0ba56e6f"
        "746573c3c090c0"
    ),
}


def test_every_message_class_has_a_golden_frame() -> None:
    sampled = {type(msg) for _, msg in samples()}
    assert sampled == set(message_types().values())
    assert {name for name, _ in samples()} == set(GOLDEN)


@pytest.mark.parametrize(("name", "msg"), samples(), ids=[name for name, _ in samples()])
def test_every_message_encodes_to_its_golden_frame_and_back(name: str, msg: Message) -> None:
    frame = encode_frame(msg)
    assert frame.hex() == GOLDEN[name]
    assert decode_frame(frame) == msg
