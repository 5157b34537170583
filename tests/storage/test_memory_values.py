"""MemoryStorage refuses the state values the durable engines cannot encode, and only those
(``memory._check_values`` against ``engine.encode_values``): a batch one engine accepts is
acceptable to every engine. Strings are the documented exception: they are not encoded
again, since no state's values hold a lone surrogate."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from mycelia.errors import StorageError
from mycelia.storage.engine import encode_values
from mycelia.storage.memory import _check_values

TEXT = st.text(st.characters(codec="utf-8"), max_size=8)  # no lone surrogate
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.binary(max_size=8),
    TEXT,
)
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3)
)
NAMES = st.one_of(TEXT, st.sampled_from(["f0", "année", "名前"]), st.integers(0, 3))


def _encodes(values: dict[Any, object]) -> bool:
    try:
        encode_values(values)  # names of any type, on purpose
    except StorageError:
        return False
    return True


def _checks(values: dict[Any, object]) -> bool:
    try:
        _check_values(values)
    except StorageError:
        return False
    return True


@given(st.dictionaries(NAMES, VALUES, max_size=6))
def test_memory_refuses_exactly_the_values_an_engine_cannot_encode(
    values: dict[Any, object],
) -> None:
    assert _checks(values) == _encodes(values)


def test_an_integer_msgpack_cannot_hold_is_refused_among_plain_values() -> None:
    plain: dict[str, object] = {"f0": "x", "f1": 2**64 - 1, "f2": -(2**63), "f3": None}
    _check_values(plain)
    for bad in (2**64, -(2**63) - 1):
        assert not _checks({**plain, "f4": bad})
