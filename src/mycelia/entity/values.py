"""Property values: what an LWW field may hold, and its canonical encoding.

Invariants:

- A value is ``None``, ``bool``, ``int`` (64-bit signed), ``float`` (not NaN), ``str``,
  ``bytes`` (ids are bytes), or JSON containers of those (``dict`` with ``str`` keys,
  ``list``), nested at most ``max_nesting_depth``.
- :func:`check_value` refuses, when the value is set, whatever :func:`decode_value` would
  refuse on a peer: a string (or object key) of more than ``max_string_length`` bytes of
  UTF-8, a list or object of more than ``max_array_length`` items. (Before, a 70,000-char
  string was taken by the assignment and refused at commit, as msgpack's
  ``exceeds max_str_len``.)
- :func:`encode_value` is canonical (dict keys sorted, tuples as lists), so two replicas
  holding the same value hold the same bytes; :func:`decode_value` accepts only what
  :func:`encode_value` can produce and raises :class:`~mycelia.errors.DecodeError`
  otherwise.
"""

from __future__ import annotations

import math
from typing import Final

from mycelia.errors import DecodeError, InvalidArgument
from mycelia.proto.codec import canonical_value, pack, unpack
from mycelia.proto.limits import DEFAULT_LIMITS, Limits

__all__ = ["Value", "check_value", "decode_value", "encode_value", "oversized"]

Value = object
"""A property value (see the module docstring for what is allowed)."""

_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1


def check_value(value: object, *, limits: Limits = DEFAULT_LIMITS, depth: int = 0) -> object:
    """``value`` in canonical form; raises InvalidArgument if it cannot be stored."""
    if depth > limits.max_nesting_depth:
        raise InvalidArgument(f"value nests deeper than {limits.max_nesting_depth}")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        _check_string(value, limits, "a string")
        return value
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            raise InvalidArgument(f"integer {value} does not fit in 64 bits")
        return value
    if isinstance(value, float):
        if math.isnan(value):
            raise InvalidArgument("NaN cannot be stored (it equals nothing, itself included)")
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (list, tuple)):
        _check_items(len(value), limits, "a list")
        return [check_value(v, limits=limits, depth=depth + 1) for v in value]
    if isinstance(value, dict):
        _check_items(len(value), limits, "an object")
        for key in value:
            if not isinstance(key, str):
                raise InvalidArgument(f"object keys must be strings, not {type(key).__name__}")
            _check_string(key, limits, "an object key")
        return {k: check_value(value[k], limits=limits, depth=depth + 1) for k in sorted(value)}
    raise InvalidArgument(f"a {type(value).__name__} cannot be stored in a field")


def oversized(text: str, limits: Limits = DEFAULT_LIMITS) -> int | None:
    """The UTF-8 size of ``text`` if it is longer than a peer decodes (more than
    ``max_string_length`` bytes), else ``None``."""
    if len(text) * 4 <= limits.max_string_length:  # at most 4 bytes a character: no count
        return None
    size = len(text.encode("utf-8", "surrogatepass"))
    return size if size > limits.max_string_length else None


def _check_string(text: str, limits: Limits, what: str) -> None:
    """Refuse ``text`` if it is longer than a peer decodes (``max_string_length`` bytes)."""
    size = oversized(text, limits)
    if size is not None:
        most = limits.max_string_length
        raise InvalidArgument(
            f"{what} may hold at most {most:,} bytes of UTF-8, and this one has {size:,}: "
            f"keep long text in a Text field, and large binary data as bytes"
        )


def _check_items(count: int, limits: Limits, what: str) -> None:
    """Refuse a list or object of more items than a peer decodes."""
    if count > limits.max_array_length:
        raise InvalidArgument(
            f"{what} may hold at most {limits.max_array_length:,} items, and this one has "
            f"{count:,}: split it over several fields or entities"
        )


def encode_value(value: object) -> bytes:
    """The canonical bytes of a (checked) value."""
    return pack(canonical_value(value))


def decode_value(data: bytes, *, limits: Limits = DEFAULT_LIMITS) -> object:
    """Decode :func:`encode_value`'s output; raises DecodeError for anything else.

    The forms most fields hold (a short string, an integer of up to 64 bits signed or 32
    unsigned, a bool, nil) are read by hand: msgpack's own decode of them, without its
    per-call set-up (a fresh client adopting 1,000 entities of ten fields decodes 10,000
    values, and every commit decodes the values it wrote). Anything else, and any of
    those that does not decode, goes through msgpack.
    """
    if type(data) is bytes and data:
        first, size = data[0], len(data)
        if 0xA0 <= first <= 0xBF:  # fixstr
            if size == 1 + (first & 0x1F) and size - 1 <= limits.max_string_length:
                try:
                    return data[1:].decode()
                except UnicodeDecodeError:
                    pass  # msgpack decides, and refuses it
        elif size == 1:
            if first <= 0x7F:  # positive fixint
                return first
            if first == 0xC0:
                return None
            if first in {0xC2, 0xC3}:  # false, true
                return first == 0xC3
            if first >= 0xE0:  # negative fixint
                return first - 0x100
        else:
            form = _INTEGERS.get(first)
            if form is not None and size == form[0]:
                return int.from_bytes(data[1:], "big", signed=form[1])
    return _decode_value(data, limits)


_INTEGERS: Final = {
    0xCC: (2, False),  # uint 8
    0xCD: (3, False),  # uint 16
    0xCE: (5, False),  # uint 32 (a uint 64 may not fit a value: msgpack's decode decides)
    0xD0: (2, True),  # int 8
    0xD1: (3, True),  # int 16
    0xD2: (5, True),  # int 32
    0xD3: (9, True),  # int 64
}
"""msgpack's integer headers read by hand: (encoded size, signed)."""


def _decode_value(data: bytes, limits: Limits) -> object:
    value = unpack(data, limits=limits, what="value")
    kind = type(value)
    if kind is str or kind is bytes or kind is bool or value is None:
        return value  # a plain scalar is its own canonical form (the common case)
    try:
        return check_value(value, limits=limits)
    except InvalidArgument as exc:
        raise DecodeError(str(exc)) from exc
