"""The order-preserving key encoding: bytes whose memcmp order is the collation.

Invariants (the contract for LMDB secondary-index keys and PostgreSQL ``bytea`` columns):

- ``encode_key(a) < encode_key(b)`` (as bytes) iff ``compare_values(a, b) < 0``, and the keys
  are identical iff the values collate equal (``encode_key(1) == encode_key(1.0)``,
  ``encode_key(-0.0) == encode_key(0)``, NaN encodes as null).
- Every key is *prefix-free*: no key is a proper prefix of another. So the concatenation of
  several keys (one per ORDER BY column or index column) sorts column by column, and so
  does a key with every byte inverted (how DESC columns are encoded, see :func:`order_key`).

Layout (one tag byte per class, in collation order, then a class-specific body):

========  ======  ===========================================================================
class     tag     body
========  ======  ===========================================================================
null      0x05    (none)
false     0x10    (none)
true      0x11    (none)
number    0x20    8 bytes: float64 of ``float(v)`` (round-to-nearest), big-endian, sign bit
                  flipped for positives and all bits inverted for negatives; then 2 bytes:
                  the exact remainder ``v - int(float(v))`` + 0x8000, big-endian (0 for
                  floats; within ±1024 for the integers accepted, -2**63 .. 2**64-1, which is
                  every integer msgpack can carry)
string    0x30    UTF-8 (``surrogatepass``), each 0x00 written 0x00 0xFF, then 0x00 0x00
bytes     0x40    the bytes, each 0x00 written 0x00 0xFF, then 0x00 0x00
list      0x50    each element's key, then 0x00 (every key starts with a tag >= 0x05)
object    0x60    per (key, value) pair in key order: 0x01, the key escaped as a string body,
                  the value's key; then 0x00
========  ======  ===========================================================================

Why the two-part number: float64 rounding is monotonic, so ``float(a) < float(b)`` implies
``a < b``; when they round to the same float F, the remainders ``a - F`` and ``b - F`` order
them exactly. Floats have remainder 0, so an int equal to a float gets the float's key.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any, Final

from mycelia.errors import InvalidArgument
from mycelia.proto.query.syntax import OrderKey
from mycelia.proto.query.values import (
    INT_MIN,
    MAX_VALUE_DEPTH,
    Collation,
    class_of,
    object_items,
    resolve_path,
)

__all__ = ["KEY_INT_MAX", "encode_key", "invert_key", "order_key", "sort_key"]

KEY_INT_MAX: Final = 2**64 - 1
"""Largest integer :func:`encode_key` accepts (the smallest is ``INT_MIN``)."""

TAG_NULL: Final = 0x05
TAG_FALSE: Final = 0x10
TAG_TRUE: Final = 0x11
TAG_NUMBER: Final = 0x20
TAG_STRING: Final = 0x30
TAG_BYTES: Final = 0x40
TAG_LIST: Final = 0x50
TAG_OBJECT: Final = 0x60
_PAIR: Final = 0x01
_END: Final = 0x00

_SIGN: Final = 1 << 63
_ALL_ONES: Final = (1 << 64) - 1
_REMAINDER_BIAS: Final = 0x8000
_NUMBER_BODY: Final = struct.Struct(">QH")
_FLOAT: Final = struct.Struct(">d")
_U64: Final = struct.Struct(">Q")
_INVERT: Final = bytes(range(255, -1, -1))


def encode_key(value: object) -> bytes:
    """The order-preserving key of ``value`` (see the module docstring for the layout).

    Raises InvalidArgument for a value outside the value model, an integer outside
    ``-2**63 .. 2**64-1``, or nesting deeper than ``MAX_VALUE_DEPTH``.
    """
    out = bytearray()
    _encode(value, out, 0)
    return bytes(out)


sort_key = encode_key
"""``sorted(values, key=sort_key)`` sorts by the collation (the same function as encode_key)."""


def invert_key(key: bytes) -> bytes:
    """``key`` with every byte inverted: sorts in the reverse order, still prefix-free."""
    return key.translate(_INVERT)


def order_key(values: Mapping[str, object], order_by: Sequence[OrderKey]) -> bytes:
    """One row's ORDER BY key: the concatenated keys of each column, DESC ones inverted.

    Bytewise order of these keys is the ORDER BY order (nulls first in ASC, last in DESC);
    ties are for the caller to break (by entity id, see ``sort_rows``).
    """
    if not order_by:
        return b""  # (most live queries: every change computes its row's key)
    parts = []
    for key in order_by:
        encoded = encode_key(resolve_path(values, key.path))
        parts.append(invert_key(encoded) if key.descending else encoded)
    return b"".join(parts)


def _encode(value: object, out: bytearray, depth: int) -> None:
    if depth > MAX_VALUE_DEPTH:
        raise InvalidArgument(f"value nests deeper than {MAX_VALUE_DEPTH} levels")
    kind = class_of(value)
    if kind is Collation.NULL:
        out.append(TAG_NULL)
    elif kind is Collation.BOOL:
        out.append(TAG_TRUE if value else TAG_FALSE)
    elif kind is Collation.NUMBER:
        out.append(TAG_NUMBER)
        out += _number_body(value)
    elif kind is Collation.STRING:
        assert isinstance(value, str)
        out.append(TAG_STRING)
        _escape(value.encode("utf-8", "surrogatepass"), out)
    elif kind is Collation.BYTES:
        assert isinstance(value, bytes | bytearray)
        out.append(TAG_BYTES)
        _escape(bytes(value), out)
    elif kind is Collation.LIST:
        _encode_list(value, out, depth)
    else:
        assert isinstance(value, Mapping)
        _encode_object(value, out, depth)


def _encode_list(value: Any, out: bytearray, depth: int) -> None:
    out.append(TAG_LIST)
    for item in value:
        _encode(item, out, depth + 1)
    out.append(_END)


def _encode_object(value: Mapping[Any, Any], out: bytearray, depth: int) -> None:
    out.append(TAG_OBJECT)
    for key, item in object_items(value):
        out.append(_PAIR)
        _escape(key.encode("utf-8", "surrogatepass"), out)
        _encode(item, out, depth + 1)
    out.append(_END)


def _escape(raw: bytes, out: bytearray) -> None:
    out += raw.replace(b"\x00", b"\x00\xff")
    out += b"\x00\x00"


def _number_body(value: object) -> bytes:
    if isinstance(value, float):
        # -0.0 == 0.0: give both the key of +0.0.
        approx, remainder = (value if value != 0.0 else 0.0), 0
    else:
        assert isinstance(value, int)
        if not INT_MIN <= value <= KEY_INT_MAX:
            raise InvalidArgument(f"integer {value} is outside the indexable range")
        approx = float(value)
        remainder = value - int(approx)
    (bits,) = _U64.unpack(_FLOAT.pack(approx))
    bits = bits ^ _ALL_ONES if bits & _SIGN else bits | _SIGN
    return _NUMBER_BODY.pack(bits, remainder + _REMAINDER_BIAS)
