"""Events: canonical bytes, ids recomputed from content, structural validation."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mycelia.errors import IdMismatch, InvalidArgument, InvalidEvent, PayloadTooLarge
from mycelia.proto import ids as ids_module
from mycelia.proto.clock import Clock
from mycelia.proto.event import GENESIS_TAG, UPDATE_TAG, Event
from mycelia.proto.ids import EntityId, EventId
from mycelia.proto.limits import Limits
from mycelia.testing.strategies import events, genesis_events, update_events

# Golden vectors: exact bytes and SHA-256 ids. If one of these changes, every stored event
# and every id in every deployment changes: never "fix" this test, fix the code.
ROOT_HEX = (
    "95b16d7963656c69612f67656e657369732f31c0af5f6d7963656c69615f73797374656dc410"
    "000000000000000000000000000000009192a36c777791c403010203"
)
ROOT_ID = "bd8e1fe12c488c146c7ac2036670e950287f29a8a97f9e23806cd2dc268d8bd4"
GENESIS_HEX = (
    "95b16d7963656c69612f67656e657369732f31c420bd8e1fe12c488c146c7ac2036670e950287f29a8"
    "a97f9e23806cd2dc268d8bd4a6616c62756d73c410000102030405060708090a0b0c0d0e0f9292a36c"
    "777791c4010492a47465787491c4020506"
)
GENESIS_ID = "b99c43557a5eab01ccbe5b956a8735dc7fa002e61943c99609cc6775dfdba905"
UPDATE_HEX = (
    "95b06d7963656c69612f7570646174652f31c420b99c43557a5eab01ccbe5b956a8735dc7fa002e619"
    "43c99609cc6775dfdba905a6616c62756d7392c42007070707070707070707070707070707070707070"
    "70707070707070707070707c420b99c43557a5eab01ccbe5b956a8735dc7fa002e61943c99609cc6775"
    "dfdba9059192a36c777791c40108"
)
UPDATE_ID = "0bb4bc26796d472811c79fbc833495650c58c31ef62cd66b54e0a9269656f3d2"


def golden_events() -> tuple[Event, Event, Event]:
    root = Event.genesis(
        collection="_mycelia_system",
        system=None,
        operations={"lww": [b"\x01\x02\x03"]},
        nonce=bytes(16),
    )
    genesis = Event.genesis(
        collection="albums",
        system=root.entity_id,
        operations={"text": [b"\x05\x06"], "lww": [b"\x04"]},
        nonce=bytes(range(16)),
    )
    update = Event.update(
        entity_id=genesis.entity_id,
        collection="albums",
        parent=Clock([EventId(b"\x07" * 32), genesis.id]),
        operations={"lww": [b"\x08"]},
    )
    return root, genesis, update


def test_golden_vectors_pin_the_canonical_bytes_and_ids() -> None:
    root, genesis, update = golden_events()
    for event, hex_bytes, hex_id in [
        (root, ROOT_HEX, ROOT_ID),
        (genesis, GENESIS_HEX, GENESIS_ID),
        (update, UPDATE_HEX, UPDATE_ID),
    ]:
        assert event.to_bytes().hex() == hex_bytes
        assert event.id.hex() == hex_id
        assert Event.from_bytes(bytes.fromhex(hex_bytes)).id.hex() == hex_id


def test_a_genesis_entity_id_is_its_own_id_and_binds_its_system() -> None:
    root, genesis, _ = golden_events()
    assert genesis.entity_id == EntityId.of_genesis(genesis.id)
    assert genesis.system == root.entity_id
    assert root.system is None
    assert genesis.is_genesis


@given(events())
def test_decoding_what_was_encoded_gives_the_same_event(event: Event) -> None:
    decoded = Event.from_bytes(event.to_bytes())
    assert decoded == event
    assert tuple(decoded) == tuple(event)  # every field, not only the id
    assert decoded.to_bytes() == event.to_bytes()


@given(update_events())
def test_parent_order_on_the_wire_cannot_change_an_id(event: Event) -> None:
    fields = msgpack.unpackb(event.to_bytes())
    fields[3] = list(reversed(fields[3])) + fields[3][:1]  # reversed and duplicated
    decoded = Event.from_bytes(msgpack.packb(fields, use_bin_type=True))
    assert decoded.id == event.id
    assert decoded.parent == event.parent


@given(genesis_events())
def test_a_genesis_and_an_update_with_the_same_fields_never_collide(genesis: Event) -> None:
    update = Event.update(
        entity_id=genesis.entity_id,
        collection=genesis.collection,
        parent=Clock([EventId(bytes(genesis.entity_id))]),
        operations=genesis.operations,
    )
    assert update.id != genesis.id
    shapes = {msgpack.unpackb(e.to_bytes())[0] for e in (genesis, update)}
    assert shapes == {GENESIS_TAG, UPDATE_TAG}


@given(genesis_events(), st.data())
def test_changing_any_hashed_field_of_a_genesis_changes_its_id(
    event: Event, data: st.DataObject
) -> None:
    field = data.draw(st.sampled_from(["collection", "system", "nonce", "operations"]))
    kwargs = {
        "collection": event.collection,
        "system": event.system,
        "nonce": event.nonce,
        "operations": event.operations,
    }
    if field == "collection":
        kwargs["collection"] = event.collection + "x"
    elif field == "system":
        kwargs["system"] = EntityId(b"\x01" * 32) if event.system is None else None
    elif field == "nonce":
        assert event.nonce is not None
        kwargs["nonce"] = bytes(b ^ 0xFF for b in event.nonce)
    else:
        kwargs["operations"] = (*event.operations, ("zz", (b"new",)))
    assert Event.genesis(**kwargs).id != event.id  # type: ignore[arg-type]


@given(update_events(), st.sampled_from(["entity_id", "collection", "parent", "operations"]))
def test_changing_any_hashed_field_of_an_update_changes_its_id(event: Event, field: str) -> None:
    kwargs: dict[str, object] = {
        "entity_id": event.entity_id,
        "collection": event.collection,
        "parent": event.parent,
        "operations": event.operations,
    }
    if field == "entity_id":
        kwargs["entity_id"] = EntityId(bytes(b ^ 1 for b in event.entity_id))
    elif field == "collection":
        kwargs["collection"] = event.collection + "x"
    elif field == "parent":
        kwargs["parent"] = event.parent.with_event(EventId(b"\xfe" * 32))
    else:
        kwargs["operations"] = (*event.operations, ("zz", (b"new",)))
    assert Event.update(**kwargs).id != event.id  # type: ignore[arg-type]


def test_an_update_without_parents_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="at least one parent"):
        Event.update(
            entity_id=EntityId(b"\x01" * 32), collection="c", parent=Clock(), operations={}
        )
    _, genesis, _ = golden_events()
    fields = msgpack.unpackb(genesis.to_bytes())
    forged = [UPDATE_TAG, bytes(genesis.entity_id), "albums", [], fields[4]]
    with pytest.raises(InvalidEvent, match="at least one parent"):
        Event.from_bytes(msgpack.packb(forged, use_bin_type=True))


def test_expecting_a_different_id_raises_id_mismatch() -> None:
    _, genesis, update = golden_events()
    with pytest.raises(IdMismatch):
        Event.from_bytes(genesis.to_bytes(), expect_id=update.id)
    assert Event.from_bytes(genesis.to_bytes(), expect_id=genesis.id) == genesis


@pytest.mark.parametrize("name", ["", "has space", "1starts-with-digit", "x" * 65, "ü"])
def test_invalid_collection_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidArgument):
        Event.genesis(collection=name, system=None, nonce=bytes(16))


def test_oversized_operations_are_refused_on_both_paths() -> None:
    limits = Limits(max_operation_bytes=10)
    with pytest.raises(InvalidArgument, match=r"11 bytes.* at most 10: make the change in several"):
        Event.genesis(
            collection="c",
            system=None,
            operations={"lww": [b"x" * 11]},
            nonce=bytes(16),
            limits=limits,
        )
    big = Event.genesis(
        collection="c", system=None, operations={"lww": [b"x" * 11]}, nonce=bytes(16)
    )
    with pytest.raises(PayloadTooLarge):
        Event.from_bytes(big.to_bytes(), limits=limits)


def test_too_many_parents_are_refused() -> None:
    parent = Clock(EventId(bytes([i]) * 32) for i in range(5))
    limits = Limits(max_parents=4)
    with pytest.raises(InvalidArgument):
        Event.update(
            entity_id=EntityId(b"\x01" * 32),
            collection="c",
            parent=parent,
            operations={},
            limits=limits,
        )
    ok = Event.update(
        entity_id=EntityId(b"\x01" * 32), collection="c", parent=parent, operations={}
    )
    with pytest.raises(PayloadTooLarge):
        Event.from_bytes(ok.to_bytes(), limits=limits)


def test_identical_payloads_with_distinct_nonces_make_distinct_entities() -> None:
    a = Event.genesis(collection="c", system=None, operations={"lww": [b"same"]}, nonce=bytes(16))
    b = Event.genesis(
        collection="c", system=None, operations={"lww": [b"same"]}, nonce=b"\x01" * 16
    )
    assert a.entity_id != b.entity_id
    assert a.operations == b.operations


@pytest.mark.parametrize("length", [0, 15, 17])
def test_a_genesis_nonce_of_the_wrong_length_is_refused(length: int) -> None:
    with pytest.raises(InvalidArgument, match="nonce"):
        Event.genesis(collection="c", system=None, nonce=bytes(length))


def test_repeated_backends_are_merged_in_order_and_empty_ones_dropped() -> None:
    event = Event.genesis(
        collection="c",
        system=None,
        operations=[("lww", [b"1"]), ("text", []), ("lww", [b"2"])],
        nonce=bytes(16),
    )
    assert event.operations == (("lww", (b"1", b"2")),)
    assert event.diffs("lww") == (b"1", b"2")
    assert event.diffs("text") == ()


FORGERIES: list[Callable[[Event, EventId], object]] = [
    lambda event, forged: Event(forged, *event[1:]),
    lambda event, forged: Event(**{**event._asdict(), "id": forged}),
    lambda event, forged: Event._make([forged, *event[1:]]),
    lambda event, forged: event._replace(id=forged),
]


@pytest.mark.parametrize("forge", FORGERIES)
def test_an_event_cannot_be_built_from_fields_so_its_id_always_matches_its_content(
    forge: Callable[[Event, EventId], object],
) -> None:
    _, genesis, _ = golden_events()
    with pytest.raises(TypeError, match=r"Event\.genesis, Event\.update or Event\.from_bytes"):
        forge(genesis, EventId(b"\x00" * 32))


@pytest.mark.parametrize(
    "clone", [copy.copy, copy.deepcopy, lambda e: pickle.loads(pickle.dumps(e))]
)
def test_copies_and_pickles_of_an_event_are_decoded_again_from_its_bytes(
    clone: Callable[[Event], Event],
) -> None:
    for event in golden_events():
        again = clone(event)
        assert type(again) is Event
        assert tuple(again) == tuple(event)


def test_decoded_events_share_the_id_objects_they_name_within_a_bounded_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, genesis, update = golden_events()
    on_it = Event.update(
        entity_id=genesis.entity_id,
        collection="albums",
        parent=Clock([update.id]),
        operations={"lww": [b"\x09"]},
    )
    first, second = Event.from_bytes(update.to_bytes()), Event.from_bytes(on_it.to_bytes())
    assert second.parent.ids[0] is first.id, "a parent is the object its event decoded to"
    assert second.parent is Clock.single(first.id), "and one parent, the shared clock of it"
    assert second.entity_id is first.entity_id
    assert first.parent == update.parent
    assert second.parent == on_it.parent

    monkeypatch.setattr(ids_module, "_IDS_CAP", 3)
    for n in range(10):  # hostile ids cannot grow it: full, it starts over
        parent = Clock([EventId(bytes([n]) * 32)])
        made = Event.update(
            entity_id=genesis.entity_id, collection="albums", parent=parent,
            operations={"lww": [b"\x01"]},
        )  # fmt: skip
        decoded = Event.from_bytes(made.to_bytes())
        assert decoded == made
        assert type(decoded.id) is EventId
        assert type(decoded.entity_id) is EntityId
        assert len(ids_module._EVENT_IDS) <= 3
