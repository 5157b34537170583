"""Property values: the hand-read fast path of ``decode_value`` is msgpack's decode."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st

from mycelia.entity.values import _decode_value, decode_value, encode_value
from mycelia.errors import MyceliaError
from mycelia.proto import Limits

scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text() | st.binary()
small = st.sampled_from([b"\xc0", b"\xc2", b"\xc3", b"\x00", b"\x7f", b"\x80", b"\xa0", b"\xa1"])


def _outcome(decode: Callable[[], object]) -> tuple[str, object]:
    try:
        value = decode()
    except MyceliaError as exc:
        return "error", type(exc)
    return "value", (type(value), value)  # the type too: True is not 1


@given(
    data=st.one_of(
        scalars.map(encode_value),
        st.binary(max_size=40),
        st.tuples(st.integers(0xA0, 0xBF), st.binary(max_size=40)).map(
            lambda t: bytes([t[0]]) + t[1]
        ),
        st.tuples(small, st.binary(max_size=3)).map(lambda t: t[0] + t[1]),
    ),
    max_string=st.sampled_from([4, 1 << 20]),
)
def test_decoding_by_hand_is_msgpacks_decode(data: bytes, max_string: int) -> None:
    limits = Limits(max_string_length=max_string)
    fast = _outcome(lambda: decode_value(data, limits=limits))
    assert fast == _outcome(lambda: _decode_value(data, limits))


@given(value=scalars)
def test_every_encoded_scalar_decodes_to_itself(value: object) -> None:
    assert decode_value(encode_value(value)) == value
