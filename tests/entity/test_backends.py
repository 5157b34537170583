"""Both property backends pass the conformance suite; LWW provenance and formats."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pycrdt import Doc, Text

from mycelia.entity.backends import LwwBackend, OpaqueBackend, TextBackend
from mycelia.entity.backends.lww import decode_diff, encode_diff, state_values
from mycelia.entity.backends.testing import check_backend
from mycelia.entity.backends.text import ClientIds
from mycelia.entity.values import encode_value
from mycelia.errors import DecodeError
from mycelia.proto import AdmittedEvent, Clock, EntityId, Event
from mycelia.proto.codec import pack
from mycelia.testing.dags import DagShape, dag_shapes

ENTITY = EntityId(b"\x05" * 32)


def history(shape: DagShape, ops_for: object) -> list[AdmittedEvent]:
    """Events of ``shape`` (single root) whose operations come from ``ops_for(i)``."""
    events: list[AdmittedEvent] = []
    for i, parents in enumerate(shape.parents):
        ops = ops_for(i)  # type: ignore[operator]
        if not parents:
            event = Event.genesis(collection="c", system=ENTITY, operations=ops, nonce=bytes(16))
            events.append(AdmittedEvent(event, 1))
            continue
        parent_events = [events[p] for p in parents]
        event = Event.update(
            entity_id=events[0].entity_id,
            collection="c",
            parent=Clock(p.id for p in parent_events),
            operations=ops,
        )
        events.append(AdmittedEvent(event, 1 + max(p.generation for p in parent_events)))
    return events


@given(dag_shapes(extra_roots=False, max_events=8), st.data())
def test_lww_passes_the_conformance_suite(shape: DagShape, data: st.DataObject) -> None:
    props = ["title", "year", "tags"]
    values = st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=3), st.lists(st.booleans()))

    def ops_for(i: int) -> dict[str, list[bytes]]:
        writes = data.draw(st.dictionaries(st.sampled_from(props), values, max_size=3))
        return {"lww": [encode_diff({k: encode_value(v) for k, v in writes.items()})]}

    check_backend(LwwBackend, history(shape, ops_for))


def _text_updates(count: int, seed: int) -> list[bytes]:
    """Concurrent edits by ``count`` writers on one base document."""
    base: Doc[Any] = Doc(client_id=1)
    base.get("body", type=Text).insert(0, "hello world")
    base_update = base.get_update()
    updates = [base_update]
    for writer in range(count):
        doc: Doc[Any] = Doc(client_id=100 + writer)
        doc.apply_update(base_update)
        state = doc.get_state()
        text = doc.get("body", type=Text)
        position = (seed * 7 + writer * 3) % (len(text) + 1)
        text.insert(position, f"<{writer}>")
        if writer % 2:
            del text[0:1]
        updates.append(doc.get_update(state))
    return updates


@pytest.mark.parametrize("writers", [1, 2, 4])
def test_text_passes_the_conformance_suite(writers: int) -> None:
    updates = _text_updates(writers, seed=writers)
    shape = DagShape(((), *((0,) for _ in range(writers))))
    events = history(shape, lambda i: {"text": [updates[i]]})
    check_backend(TextBackend, events)  # the Yrs encoding is order independent here too


def test_text_state_is_canonical_when_a_client_id_is_reused() -> None:
    # A node reuses a Yrs client id once a transaction's edits are published here.
    # Yrs squashes one client's consecutive items into a block only when they arrive
    # together, so without the canonical re-encoding in to_state the buffer depends on
    # whether another client's concurrent insert at the same place arrived in between.
    ids = ClientIds(random.Random(3))
    writer = TextBackend.empty(ids)
    writer.insert("body", 0, "ab")
    base = writer.take_diff()
    ids.release(writer.client_id)
    again = writer.fork(ids)
    assert again.client_id == writer.client_id
    again.insert("body", 2, "cd")
    other = writer.fork(ClientIds(random.Random(7)))
    assert other.client_id > writer.client_id  # orders after: its "X" goes after "cd"
    other.insert("body", 2, "X")
    updates = [base, again.take_diff(), other.take_diff()]
    events = history(DagShape(((), (0,), (0,))), lambda i: {"text": [updates[i]]})
    check_backend(TextBackend, events, orders=24)


def test_lww_records_which_event_wrote_each_value() -> None:
    shape = DagShape(((), (0,)))
    events = history(
        shape,
        lambda i: {"lww": [encode_diff({"a": encode_value(i)})]},
    )
    backend = LwwBackend.empty()
    for e in events:
        backend.apply(e, e.event.diffs("lww"))
    assert backend.writer("a") == (2, events[1].id)
    assert backend.values() == {"a": 1}


def test_a_causally_later_write_wins_even_with_a_smaller_id() -> None:
    # Generation decides before id: the child always outranks its parent.
    shape = DagShape(((), (0,), (1,)))
    events = history(shape, lambda i: {"lww": [encode_diff({"p": encode_value(i)})]})
    for order in ([0, 1, 2], [0, 2, 1], [2, 1, 0]):
        backend = LwwBackend.empty()
        for i in order:
            backend.apply(events[i], events[i].event.diffs("lww"))
        assert backend.values() == {"p": 2}


def _int16_generation(row: bytes, generation: int) -> bytes:
    """``row`` packed with its generation as msgpack int16: valid, the same length as the
    canonical uint16, other bytes."""
    canonical = b"\xcd" + generation.to_bytes(2, "big")
    assert row.count(canonical) == 1
    return row.replace(canonical, b"\xd1" + generation.to_bytes(2, "big"))


def test_a_state_read_back_is_canonical_however_it_was_encoded() -> None:
    """A canonical buffer comes back as it was; rows out of order, and a generation in a
    same-length non-canonical int form, come back canonical (replicas store the same
    bytes); a change after the read is in the buffer, and not in the copy it forked."""
    rows = [["a", encode_value(1), 300, bytes(32)], ["b", encode_value("x"), 7, b"\x01" * 32]]
    canonical = pack([1, rows])
    assert LwwBackend.from_state(canonical).to_state() == canonical
    shuffled = pack([1, rows[::-1]])
    assert LwwBackend.from_state(shuffled).to_state() == canonical
    wide = _int16_generation(canonical, 300)
    assert len(wide) == len(canonical)
    assert LwwBackend.from_state(wide).values() == {"a": 1, "b": "x"}
    assert LwwBackend.from_state(wide).to_state() == canonical
    backend = LwwBackend.from_state(canonical)
    assert backend.to_state() == canonical
    fork = backend.fork()
    (event,) = history(DagShape(((),)), lambda _: {"lww": [encode_diff({"a": encode_value(2)})]})
    fork.apply(AdmittedEvent(event.event, 400), event.event.diffs("lww"))
    expected = pack([1, [["a", encode_value(2), 400, bytes(event.id)], rows[1]]])
    assert fork.to_state() == expected
    assert backend.to_state() == canonical  # the fork's change is its own
    merged = LwwBackend.from_state(canonical)
    merged.merge(LwwBackend.from_state(expected))
    assert merged.to_state() == expected


@pytest.mark.parametrize("how", ["plain", "wide generation", "a new name", "a bad writer"])
def test_state_values_reads_what_the_backend_reads(how: str) -> None:
    """state_values (a fresh client's adoption) reads plain rows in one pass and sends any
    other buffer through the checked path: either way, the backend's values or its error."""
    rows = [["a", encode_value(1), 300, bytes(32)], ["b", encode_value("x"), 7, b"\x01" * 32]]
    buffer = pack([1, rows])
    if how == "wide generation":
        buffer = _int16_generation(buffer, 300)
    elif how == "a new name":
        buffer = pack(
            [1, [*rows, [f"n{random.getrandbits(64)}", encode_value(None), 1, bytes(32)]]]
        )
    elif how == "a bad writer":
        buffer = pack([1, [*rows, ["c", encode_value(2), 1, b"short"]]])
        with pytest.raises(DecodeError):
            LwwBackend.from_state(buffer)
        with pytest.raises(DecodeError):
            state_values(buffer)
        return
    assert state_values(buffer) == LwwBackend.from_state(buffer).values()


@pytest.mark.parametrize(
    "buffer",
    [b"", b"\x00", b"\x92\x02\x90", b"\x92\x01\x91\x94\xa1p\xc4\x00\x00\xc4\x01\x00"],
)
def test_malformed_lww_state_is_a_decode_error(buffer: bytes) -> None:
    with pytest.raises(DecodeError):
        LwwBackend.from_state(buffer)


@pytest.mark.parametrize("name", [[1], {"a": 1}, 7, b"p", None, ""])
def test_a_property_that_is_no_name_is_a_decode_error(name: object) -> None:
    """Hostile input: an unhashable "name" once escaped the decoders as a TypeError."""
    LwwBackend.from_state(pack([1, [["p", b"\x01", 1, bytes(32)]]]))  # "p" is a known name
    decode_diff(pack([["p", b"\x01"]]))
    with pytest.raises(DecodeError):
        decode_diff(pack([[name, b"\x01"]]))
    with pytest.raises(DecodeError):
        LwwBackend.from_state(pack([1, [[name, b"\x01", 1, bytes(32)]]]))


def test_malformed_text_update_is_a_decode_error() -> None:
    backend = TextBackend.empty()
    event = AdmittedEvent(Event.genesis(collection="c", system=ENTITY, nonce=bytes(16)), 1)
    with pytest.raises(DecodeError):
        backend.apply(event, (b"\x05\x06garbage",))


def test_an_unknown_backend_keeps_its_diffs_in_an_order_independent_buffer() -> None:
    shape = DagShape(((), (0,), (0,)))
    events = history(shape, lambda i: {"future": [bytes([i])]})
    check_backend(OpaqueBackend, events)
