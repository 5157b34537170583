"""The canonical msgpack codec: the only place bytes become values and back.

Invariants:

- :func:`pack` is deterministic: positional arrays, ``bin`` for bytes, the smallest integer
  form, float64 for floats. Hashed shapes never contain maps (ARCHITECTURE.md §3); values
  that do (``Json``) are packed with their keys sorted by :func:`canonical_value`.
- :func:`unpack` never raises anything but a :class:`~mycelia.errors.DecodeError` subclass
  and refuses any length beyond the :class:`~mycelia.proto.limits.Limits` before msgpack
  allocates for it. Its cost is linear in the input's bytes with a small constant: a
  payload may hold at most one array or map per :data:`BYTES_PER_CONTAINER` bytes (every
  shape of this protocol spends more than that on each), so a payload of nested empty
  arrays — one Python object per byte — is refused after a fraction of it was built, and
  the garbage collector, which would rescan the half-built tree again and again, is
  paused while a large payload decodes.
- The ``expect_*`` helpers turn a decoded ``object`` into a typed value or raise
  :class:`~mycelia.errors.DecodeError` naming the field, so no untyped value crosses the
  codec boundary (STYLE.md §5).
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable
from typing import Final, TypeVar

import msgpack

from mycelia.errors import DecodeError, PayloadTooLarge
from mycelia.proto.limits import DEFAULT_LIMITS, Limits

__all__ = [
    "NAME_PATTERN",
    "array_header",
    "canonical_value",
    "expect_bytes",
    "expect_int",
    "expect_list",
    "expect_name",
    "expect_optional_bytes",
    "expect_str",
    "pack",
    "unpack",
]

T = TypeVar("T")

NAME_PATTERN: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*\Z")
"""Collection, backend and property names: an identifier-like word (dots and dashes allowed)."""

BYTES_PER_CONTAINER: Final = 12
"""A payload holds at most one array or map per this many bytes (plus
:data:`CONTAINER_ALLOWANCE`). The densest shape of the protocol, a state's nested head,
generations and buffer pairs, spends at least 17 bytes on each."""
CONTAINER_ALLOWANCE: Final = 256
COUNTED_PAYLOAD: Final = 64 * 1024
"""Payloads up to this size decode without counting (they cannot hold many containers)."""

# One reusable packer: packing built-in types never calls back into Python, so a call holds
# the GIL from start to end and the shared instance is safe to use from any thread.
_packer_default: Final = msgpack.Packer(use_bin_type=True, autoreset=True)


def pack(value: object) -> bytes:
    """Encode ``value`` canonically (see the module docstring)."""
    try:
        return _packer_default.pack(value)  # type: ignore[no-any-return]
    except (TypeError, ValueError, OverflowError) as exc:
        raise DecodeError(f"value cannot be encoded: {exc}") from exc


def array_header(length: int) -> bytes:
    """The msgpack header of an array of ``length`` items (what :func:`pack` writes before
    them), for an encoder that joins items it encoded apart."""
    if length < 16:
        return bytes((0x90 | length,))
    if length < 0x10000:
        return b"\xdc" + length.to_bytes(2, "big")
    return b"\xdd" + length.to_bytes(4, "big")


def _refuse_ext(code: int, data: bytes) -> object:
    raise DecodeError(f"msgpack extension type {code} is not part of this protocol")


def unpack_options(limits: Limits) -> dict[str, object]:
    """The ``msgpack.unpackb`` keyword arguments that enforce ``limits`` (memoised on it)."""
    options: dict[str, object] | None = limits.cache.get("unpack")  # type: ignore[assignment]
    if options is None:
        options = {
            "raw": False,
            "use_list": True,
            "strict_map_key": True,
            "ext_hook": _refuse_ext,
            "max_bin_len": limits.max_frame_bytes,
            "max_str_len": limits.max_string_length,
            "max_array_len": limits.max_array_length,
            "max_map_len": limits.max_array_length,
            "max_ext_len": 0,
        }
        limits.cache["unpack"] = options
    return options


class _Containers:
    """Counts the arrays and maps msgpack builds; raises past the budget (see module)."""

    __slots__ = ("left", "what")

    def __init__(self, size: int, what: str) -> None:
        self.left = size // BYTES_PER_CONTAINER + CONTAINER_ALLOWANCE
        self.what = what

    def count(self, value: T) -> T:
        self.left -= 1
        if self.left < 0:
            raise PayloadTooLarge(
                f"{self.what} holds more arrays and maps than its size allows "
                f"(one per {BYTES_PER_CONTAINER} bytes)"
            )
        return value


def unpack(data: bytes, *, limits: Limits = DEFAULT_LIMITS, what: str = "payload") -> object:
    """Decode one msgpack value, enforcing ``limits``; raises DecodeError/PayloadTooLarge."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DecodeError(f"{what} must be bytes, got {type(data).__name__}")
    if len(data) > limits.max_frame_bytes:
        raise PayloadTooLarge(f"{what} is {len(data)} bytes; the limit is {limits.max_frame_bytes}")
    try:
        if len(data) <= COUNTED_PAYLOAD:
            return msgpack.unpackb(data, **unpack_options(limits))
        return _unpack_counted(data, limits, what)
    except DecodeError:
        raise
    except ValueError as exc:
        if "exceeds max" in str(exc):
            raise PayloadTooLarge(f"{what}: {exc}") from exc
        raise DecodeError(f"{what} is not valid msgpack: {exc}") from exc
    except Exception as exc:  # msgpack raises a zoo of types on hostile input
        raise DecodeError(f"{what} is not valid msgpack: {exc!r}") from exc


def _unpack_counted(data: bytes, limits: Limits, what: str) -> object:
    """A large payload: containers counted, the collector paused (see the module)."""
    budget = _Containers(len(data), what)
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        return msgpack.unpackb(
            data, **unpack_options(limits), list_hook=budget.count, object_hook=budget.count
        )
    finally:
        if paused:
            gc.enable()


def canonical_value(value: object, *, depth: int = 0, max_depth: int = 32) -> object:
    """A deterministic form of a ``Json``-like value: dict keys sorted, tuples as lists.

    Raises DecodeError for types outside None/bool/int/float/str/bytes/list/dict or for
    nesting deeper than ``max_depth``.
    """
    if depth > max_depth:
        raise PayloadTooLarge(f"value nests deeper than {max_depth}")
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if isinstance(value, (list, tuple)):
        return [canonical_value(v, depth=depth + 1, max_depth=max_depth) for v in value]
    if isinstance(value, dict):
        items = []
        for k in value:
            if not isinstance(k, str):
                raise DecodeError(f"object keys must be strings, got {type(k).__name__}")
            items.append(k)
        items.sort()
        return {k: canonical_value(value[k], depth=depth + 1, max_depth=max_depth) for k in items}
    raise DecodeError(f"{type(value).__name__} is not a storable value")


def expect_list(
    obj: object, what: str, *, max_len: int | None = None, length: int | None = None
) -> list[object]:
    """``obj`` as a list (optionally of an exact length or at most ``max_len`` items)."""
    if not isinstance(obj, list):
        raise DecodeError(f"{what} must be an array, got {type(obj).__name__}")
    if length is not None and len(obj) != length:
        raise DecodeError(f"{what} must have {length} items, got {len(obj)}")
    if max_len is not None and len(obj) > max_len:
        raise PayloadTooLarge(f"{what} has {len(obj)} items; the limit is {max_len}")
    return obj


def expect_bytes(obj: object, what: str, *, length: int | None = None) -> bytes:
    """``obj`` as bytes (optionally of an exact length)."""
    if not isinstance(obj, bytes):
        raise DecodeError(f"{what} must be bytes, got {type(obj).__name__}")
    if length is not None and len(obj) != length:
        raise DecodeError(f"{what} must be {length} bytes, got {len(obj)}")
    return obj


def expect_optional_bytes(obj: object, what: str, *, length: int | None = None) -> bytes | None:
    """``obj`` as bytes or None."""
    return None if obj is None else expect_bytes(obj, what, length=length)


def expect_str(obj: object, what: str, *, max_len: int | None = None) -> str:
    """``obj`` as a string (optionally at most ``max_len`` characters)."""
    if not isinstance(obj, str):
        raise DecodeError(f"{what} must be a string, got {type(obj).__name__}")
    if max_len is not None and len(obj) > max_len:
        raise PayloadTooLarge(f"{what} is {len(obj)} characters; the limit is {max_len}")
    return obj


def expect_int(obj: object, what: str, *, minimum: int | None = None) -> int:
    """``obj`` as an int (bools refused), at least ``minimum``."""
    if not isinstance(obj, int) or isinstance(obj, bool):
        raise DecodeError(f"{what} must be an integer, got {type(obj).__name__}")
    if minimum is not None and obj < minimum:
        raise DecodeError(f"{what} must be at least {minimum}, got {obj}")
    return obj


def expect_name(obj: object, what: str, *, limits: Limits = DEFAULT_LIMITS) -> str:
    """``obj`` as a collection/backend/property name (see :data:`NAME_PATTERN`); a valid
    name is remembered among :func:`valid_names` (at most :data:`KNOWN_NAMES` of them)."""
    name = expect_str(obj, what, max_len=limits.max_name_length)
    if not NAME_PATTERN.match(name):
        raise DecodeError(f"{what} {name!r} is not a valid name (letters, digits, _ . -)")
    names = valid_names(limits)
    if len(names) < KNOWN_NAMES:
        names.add(name)
    return name


KNOWN_NAMES: Final = 4096
"""Most names :func:`valid_names` remembers per :class:`Limits` (hostile input naming
new ones each time adds nothing past them)."""


def valid_names(limits: Limits) -> set[str]:
    """Names :func:`expect_name` has accepted under ``limits``: a decoder's fast path takes
    a string among them without checking it again (memoised on ``limits``)."""
    names: set[str] | None = limits.cache.get("names")  # type: ignore[assignment]
    if names is None:
        names = set()
        limits.cache["names"] = names
    return names


def expect_items(
    obj: object, what: str, item: Callable[[object, str], T], *, max_len: int
) -> list[T]:
    """``obj`` as a list whose items each pass ``item``."""
    seq = expect_list(obj, what, max_len=max_len)
    return [item(x, f"{what}[{i}]") for i, x in enumerate(seq)]
