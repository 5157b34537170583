"""Declared wire schemas: what a field's codec refuses, and what a record derives from them."""

from __future__ import annotations

import msgpack
import pytest

from mycelia.errors import DecodeError, PayloadTooLarge
from mycelia.proto import DEFAULT_LIMITS, EntityId, EventId, Limits, NodeId, schema
from mycelia.proto.schema import Record, record, wire

ID = EventId(b"\x05" * 32)


@record
class Pair(Record):
    """A test record: every kind of field, and a rule across two of them."""

    first: EntityId = wire(schema.ENTITY_ID)
    heads: tuple[EventId, ...] = wire(schema.Array(schema.EVENT_ID, limit="max_clock_width"))
    label: str | None = wire(schema.Optional(schema.Str(8)))
    flag: bool = wire(schema.BOOL, default=False)

    def check_decoded(self) -> None:
        if self.flag and self.label is None:
            raise DecodeError("a flagged pair needs a label")


@record
class Outer(Record):
    pairs: tuple[Pair, ...] = wire(schema.Array(schema.Nested(Pair), limit="max_batch_events"))
    count: int = wire(schema.Int(minimum=1, clamp="max_parents"))


def _decode(kind: type[Record], value: list[object], limits: Limits = DEFAULT_LIMITS) -> object:
    return kind.from_wire(msgpack.unpackb(msgpack.packb(value)), limits)


def test_a_record_round_trips_through_the_wire_form_its_fields_declare() -> None:
    pair = Pair(EntityId(b"\x01" * 32), (ID, ID), "x", True)
    outer = Outer((pair, Pair(EntityId(b"\x02" * 32), (), None)), 3)
    assert outer.to_wire() == [[pair.to_wire(), [EntityId(b"\x02" * 32), (), None, False]], 3]
    assert _decode(Outer, outer.to_wire()) == outer
    assert [name for name, _ in Pair.SCHEMA] == ["first", "heads", "label", "flag"]


@pytest.mark.parametrize(
    ("heads", "error"),
    [
        ([b"\x05" * 31], DecodeError),
        (["text"], DecodeError),
        ("not a list", DecodeError),
        ([b"\x05" * 32] * (DEFAULT_LIMITS.max_clock_width + 1), PayloadTooLarge),
    ],
)
def test_an_id_list_refuses_short_ids_other_types_and_more_than_its_limit(
    heads: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match=r"Pair\.heads"):
        _decode(Pair, [b"\x01" * 32, heads, None, False])


def test_each_field_is_checked_against_its_own_codec() -> None:
    with pytest.raises(DecodeError, match=r"Pair\.first"):
        _decode(Pair, [b"\x01" * 31, [], None, False])
    with pytest.raises(PayloadTooLarge, match=r"Pair\.label"):
        _decode(Pair, [b"\x01" * 32, [], "too long!", False])
    with pytest.raises(DecodeError, match=r"Pair\.flag"):
        _decode(Pair, [b"\x01" * 32, [], None, "yes"])
    with pytest.raises(DecodeError, match=r"Outer\.count"):
        _decode(Outer, [[], 0])


def test_a_cross_field_rule_is_judged_on_decode_only() -> None:
    local = Pair(EntityId(b"\x01" * 32), (), None, True)  # built here: trusted as it is
    with pytest.raises(DecodeError, match="needs a label"):
        _decode(Pair, local.to_wire())


def test_a_clamped_integer_is_cut_to_its_limit() -> None:
    decoded = _decode(Outer, [[], 10**6], Limits(max_parents=7))
    assert isinstance(decoded, Outer)
    assert decoded.count == 7


def test_bytes_of_a_fixed_length_or_a_maximum() -> None:
    exact, bounded = schema.Bytes(length=2), schema.Bytes(max_len=2)
    assert exact.decode(b"ab", "x", DEFAULT_LIMITS) == b"ab"
    with pytest.raises(DecodeError):
        exact.decode(b"abc", "x", DEFAULT_LIMITS)
    with pytest.raises(PayloadTooLarge):
        bounded.decode(b"abc", "x", DEFAULT_LIMITS)


def test_decoded_entity_and_event_ids_are_the_shared_objects_of_their_kind() -> None:
    """A subscriber decodes the same ids in every delta and clock: each decode yields the
    one shared object (no copy for the garbage collector to promote), of the right kind."""
    entity, head = b"\x01" * 32, b"\x07" * 32
    first = _decode(Pair, [entity, [head, head], None, False])
    second = _decode(Pair, [entity, [head], None, False])
    assert isinstance(first, Pair)
    assert isinstance(second, Pair)
    assert type(first.first) is EntityId
    assert all(type(h) is EventId for h in first.heads)
    assert first.first is second.first
    assert first.heads[0] is first.heads[1] is second.heads[0]
    node = schema.NODE_ID.decode(b"\x09" * 32, "node", DEFAULT_LIMITS)
    assert type(node) is NodeId
    assert node == b"\x09" * 32
