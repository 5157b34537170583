"""The handshake cannot be relayed, reflected or faked with a weak key (issue 16, defects 3
and 4), and an unauthenticated peer cannot make a node decode much (defect 5); no I/O."""

from __future__ import annotations

import pytest

from mycelia.errors import (
    DecodeError,
    InvalidMessage,
    PayloadTooLarge,
    PresenceRejected,
    RemoteProtocolError,
)
from mycelia.node.identity import NodeKey, check_public_key
from mycelia.node.session import Faulty, PeerSession, SessionState, Verified
from mycelia.proto import DEFAULT_LIMITS, EntityId, NodeId
from mycelia.proto.codec import pack
from mycelia.proto.messages import PROTOCOL_VERSION, decode_frame, encode_frame
from mycelia.proto.peering import (
    FetchRequest,
    GetRequest,
    Presence,
    PresenceProof,
)
from mycelia.proto.peering import (
    PresenceRejected as Rejected,
)

ROOT = EntityId(b"\x01" * 32)
SMALL_ORDER = [
    "01" + "00" * 31,  # the identity
    "ec" + "ff" * 30 + "7f",  # order 2
    "00" * 32,  # order 4
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",  # order 8
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",  # order 8
]
NON_CANONICAL = [
    "ed" + "ff" * 30 + "7f",  # y = p
    "ff" * 32,  # y > p
    "01" + "00" * 30 + "80",  # x = 0 with the sign bit set
]


def server(key: NodeKey | None = None) -> PeerSession:
    return PeerSession(
        key=key or NodeKey.generate(),
        durable=True,
        system_root=ROOT,
        limits=DEFAULT_LIMITS,
        dialer=False,
    )


def presence_of(session: PeerSession) -> Presence:
    msg = decode_frame(session.start()[0])
    assert isinstance(msg, Presence)
    return msg


def proof_from(frames: list[bytes]) -> PresenceProof:
    (frame,) = frames
    msg = decode_frame(frame)
    assert isinstance(msg, PresenceProof)
    return msg


def test_a_servers_own_proof_sent_back_to_it_is_refused() -> None:
    target = server()
    mine = presence_of(target)
    # Claim to be the server itself, with its own challenge: it signs as the listener...
    target.receive(
        encode_frame(Presence(mine.node_id, True, ROOT, PROTOCOL_VERSION, mine.challenge))
    )
    reflected = proof_from(target.take_outgoing())
    # ...and that signature, sent back as the dialer's proof, names the wrong direction.
    with pytest.raises(PresenceRejected, match="does not verify"):
        target.receive(encode_frame(reflected))
    assert target.state is SessionState.CLOSED


def test_a_proof_relayed_from_another_server_is_refused() -> None:
    victim_key, relay_key = NodeKey.generate(), NodeKey.generate()
    a, b = server(), server(victim_key)  # the attacker wants into ``a`` as ``b``
    presence_a = presence_of(a)
    presence_b = presence_of(b)
    # The attacker dials b naming a's challenge (as if it were a), to get b to sign it...
    b.receive(
        encode_frame(
            Presence(presence_a.node_id, False, None, PROTOCOL_VERSION, presence_a.challenge)
        )
    )
    relayed = proof_from(b.take_outgoing())
    # ...and dials a as b, handing it b's signature.
    a.receive(
        encode_frame(
            Presence(presence_b.node_id, False, None, PROTOCOL_VERSION, relay_key.sign(b"x")[:32])
        )
    )
    a.take_outgoing()
    with pytest.raises(PresenceRejected, match="does not verify"):
        a.receive(encode_frame(relayed))


def test_a_dialers_proof_is_good_for_one_connection_only() -> None:
    client_key = NodeKey.generate()
    first, second = server(), server()
    client = PeerSession(
        key=client_key, durable=False, system_root=None, limits=DEFAULT_LIMITS, dialer=True
    )
    (hello,) = client.start()
    client.receive(first.start()[0])
    first.receive(hello)
    client.receive(first.take_outgoing()[0])
    proof = client.take_outgoing()[0]
    # Replaying the client's hello and proof on another connection fails: new challenge.
    second.start()
    second.receive(hello)
    second.take_outgoing()
    with pytest.raises(PresenceRejected):
        second.receive(proof)


def test_a_dialer_refuses_a_listener_whose_proof_does_not_verify_and_signs_nothing() -> None:
    client = PeerSession(
        key=NodeKey.generate(), durable=False, system_root=None, limits=DEFAULT_LIMITS
    )
    client.start()
    impostor = server()
    client.receive(impostor.start()[0])
    with pytest.raises(PresenceRejected):
        client.receive(encode_frame(PresenceProof(NodeKey.generate().sign(b"x"), None)))
    assert [type(decode_frame(f)) for f in client.take_outgoing()] == [Rejected]


@pytest.mark.parametrize("key", SMALL_ORDER + NON_CANONICAL)
def test_small_order_and_non_canonical_keys_are_refused(key: str) -> None:
    for _ in range(2):  # every time: a refusal is never remembered as a pass
        with pytest.raises(PresenceRejected):
            check_public_key(bytes.fromhex(key))
        with pytest.raises(PresenceRejected):
            check_public_key(NodeId(bytes.fromhex(key)))


def test_a_small_order_key_with_a_trivial_signature_is_refused_at_its_presence() -> None:
    target = server()
    target.start()
    weak = NodeId(bytes.fromhex(SMALL_ORDER[0]))
    with pytest.raises(PresenceRejected, match="small-order"):
        target.receive(encode_frame(Presence(weak, False, None, PROTOCOL_VERSION, bytes(32))))
    (frame,) = target.take_outgoing()
    assert isinstance(decode_frame(frame), Rejected)
    assert target.state is SessionState.CLOSED


def test_generated_keys_are_accepted() -> None:
    for _ in range(50):
        check_public_key(NodeKey.generate().node_id)


def test_a_handshake_frame_over_the_small_limit_is_refused_before_decoding() -> None:
    target = server()
    target.start()
    bomb = pack([1, [[[]] * 100] * 200])  # a Presence tag, then thousands of arrays
    assert len(bomb) > DEFAULT_LIMITS.max_handshake_bytes
    with pytest.raises(PayloadTooLarge, match="handshake frame"):
        target.receive(bomb)
    assert target.state is SessionState.CLOSED


def test_a_frame_out_of_place_is_refused_by_its_tag_alone() -> None:
    target = server()
    target.start()
    # A request before the handshake: refused on its first bytes, whatever follows.
    with pytest.raises(RemoteProtocolError, match="not allowed"):
        target.receive(encode_frame(GetRequest(1, ())) + b"\xc1" * 100)
    other = server()
    other.start()
    with pytest.raises(InvalidMessage):
        other.receive(pack([99, 1]))


def ready_pair() -> tuple[PeerSession, PeerSession]:
    a = server()
    b = PeerSession(key=NodeKey.generate(), durable=False, system_root=None, limits=DEFAULT_LIMITS)
    (pa,), (pb,) = a.start(), b.start()
    a.receive(pb)
    b.receive(pa)
    b.receive(a.take_outgoing()[0])
    (events,) = [a.receive(f) for f in b.take_outgoing()]
    assert isinstance(events[0], Verified)
    return a, b


def test_a_request_with_an_oversized_field_fails_alone() -> None:
    a, _ = ready_pair()
    huge = "x" * (70 * 1024)  # over the query text limit, well within the frame limit
    frame = pack([FetchRequest.TAG, 7, "notes", huge, [], []])
    (event,) = a.receive(frame)
    assert isinstance(event, Faulty)
    assert event.request_id == 7
    assert isinstance(event.error, PayloadTooLarge)
    assert a.state is SessionState.READY


def test_a_malformed_request_still_closes() -> None:
    a, _ = ready_pair()
    with pytest.raises(DecodeError):
        a.receive(pack([FetchRequest.TAG, 7, "notes"]))  # the wrong number of fields
    assert a.state is SessionState.CLOSED
