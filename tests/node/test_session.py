"""The peer session state machine, without any I/O."""

from __future__ import annotations

import pytest

from mycelia.errors import DecodeError, PresenceRejected, RemoteProtocolError
from mycelia.node.identity import NodeKey
from mycelia.node.session import (
    TRANSITIONS,
    PeerSession,
    Pushed,
    Received,
    SessionState,
    Verified,
)
from mycelia.proto import DEFAULT_LIMITS, EntityId
from mycelia.proto.codec import pack
from mycelia.proto.messages import PROTOCOL_VERSION, decode_frame, encode_frame
from mycelia.proto.peering import Ack, GetRequest, PresenceProof, SubscriptionUpdate
from mycelia.proto.peering import PresenceRejected as Rejected

ROOT = EntityId(b"\x01" * 32)


def pair(
    *, version_b: int = PROTOCOL_VERSION, key_b: NodeKey | None = None
) -> tuple[PeerSession, PeerSession]:
    """``a`` listens (a durable server), ``b`` dials it (a client with a token)."""
    a = PeerSession(
        key=NodeKey.generate(), durable=True, system_root=ROOT, limits=DEFAULT_LIMITS, dialer=False
    )
    b = PeerSession(
        key=key_b or NodeKey.generate(),
        durable=False,
        system_root=None,
        limits=DEFAULT_LIMITS,
        token=b"tok",
        version=version_b,
        dialer=True,
    )
    return a, b


def handshake(a: PeerSession, b: PeerSession) -> tuple[list[object], list[object]]:
    """Listener ``a`` proves first; dialer ``b`` verifies, then proves."""
    (pa,), (pb,) = a.start(), b.start()
    assert a.receive(pb) == []
    assert b.receive(pa) == []
    (proof_a,) = a.take_outgoing()
    assert b.take_outgoing() == []  # the dialer signs nothing before it verified the listener
    events_b: list[object] = list(b.receive(proof_a))
    (proof_b,) = b.take_outgoing()
    return list(a.receive(proof_b)), events_b


def test_a_handshake_verifies_both_sides_and_carries_the_token() -> None:
    key_b = NodeKey.generate()
    a, b = pair(key_b=key_b)
    events_a, events_b = handshake(a, b)
    assert a.state is SessionState.READY
    assert b.state is SessionState.READY
    (verified,) = events_a
    assert isinstance(verified, Verified)
    assert verified.token == b"tok"
    assert verified.presence.node_id == key_b.node_id == a.peer_id
    assert verified.presence.durable is False
    (verified_b,) = events_b
    assert isinstance(verified_b, Verified)
    assert verified_b.presence.durable is True
    assert verified_b.presence.node_id == b.peer_id != key_b.node_id


def test_application_frames_pass_up_once_ready() -> None:
    a, b = pair()
    handshake(a, b)
    (event,) = a.receive(encode_frame(GetRequest(7, (ROOT,))))
    assert isinstance(event, Received)
    assert event.message == GetRequest(7, (ROOT,))


def test_a_pushed_update_passes_up_as_its_frame_and_is_decoded_when_applied() -> None:
    a, b = pair()
    handshake(a, b)
    update = SubscriptionUpdate(3, ())
    frame = encode_frame(update)
    (event,) = a.receive(frame)
    assert isinstance(event, Pushed)
    assert event.frame is frame, "held as read: no decoded objects wait in a backlog"
    assert event.decode() == update
    (bad,) = a.receive(pack([SubscriptionUpdate.TAG, "not a query id", []]))
    assert isinstance(bad, Pushed)
    with pytest.raises(DecodeError):
        bad.decode()  # (its receiver then ends the session)


def test_a_request_before_the_proof_is_a_protocol_error() -> None:
    a, b = pair()
    (pb,) = b.start()
    a.start()
    a.receive(pb)
    with pytest.raises(RemoteProtocolError, match="not allowed"):
        a.receive(encode_frame(Ack(1)))
    assert a.state is SessionState.CLOSED


def test_a_version_mismatch_is_rejected_with_a_frame_and_a_close() -> None:
    a, b = pair(version_b=PROTOCOL_VERSION + 1)
    (pb,) = b.start()
    a.start()
    with pytest.raises(PresenceRejected, match="protocol"):
        a.receive(pb)
    (frame,) = a.take_outgoing()
    rejected = decode_frame(frame)
    assert isinstance(rejected, Rejected)
    assert (rejected.expected_version, rejected.received_version) == (
        PROTOCOL_VERSION,
        PROTOCOL_VERSION + 1,
    )
    assert a.state is SessionState.CLOSED


def test_a_proof_signed_by_another_key_is_rejected() -> None:
    a, b = pair()
    (pa,), (pb,) = a.start(), b.start()
    a.receive(pb)
    b.receive(pa)
    a.take_outgoing()
    forged = PresenceProof(NodeKey.generate().sign(b"anything"), None)
    with pytest.raises(PresenceRejected, match="does not verify"):
        a.receive(encode_frame(forged))
    with pytest.raises(PresenceRejected, match="does not verify"):
        b.receive(encode_frame(forged))


def test_garbage_is_a_decode_error_and_closes() -> None:
    a, _ = pair()
    a.start()
    with pytest.raises(DecodeError):
        a.receive(b"\xc1\xc1garbage")
    assert a.state is SessionState.CLOSED


def test_every_state_but_ready_accepts_only_handshake_frames() -> None:
    for state, kind in TRANSITIONS:
        if state is not SessionState.READY:
            assert kind.__name__.startswith("Presence")
