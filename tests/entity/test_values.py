"""Property values: the hand-read fast path of ``decode_value`` is msgpack's decode, and
``check_value`` refuses at assignment exactly what a peer's decode would refuse."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mycelia.entity.values import _decode_value, check_value, decode_value, encode_value
from mycelia.errors import InvalidArgument, MyceliaError
from mycelia.proto import Limits

scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text() | st.binary()
integer_headers = st.sampled_from([0xCC, 0xCD, 0xCE, 0xCF, 0xD0, 0xD1, 0xD2, 0xD3, 0xE0, 0xFF])
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
        st.tuples(integer_headers, st.binary(max_size=9)).map(lambda t: bytes([t[0]]) + t[1]),
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


def test_every_integer_form_read_by_hand_is_msgpacks_decode() -> None:
    for header in (0xCC, 0xCD, 0xCE, 0xCF, 0xD0, 0xD1, 0xD2, 0xD3):
        for length in range(10):
            for fill in (0x00, 0x01, 0x7F, 0x80, 0xFF):
                data = bytes([header]) + bytes([fill]) * length
                fast = _outcome(lambda: decode_value(data))  # noqa: B023 - called at once
                assert fast == _outcome(lambda: _decode_value(data, Limits())), data  # noqa: B023
    for first in range(0xE0, 0x100):  # negative fixint
        assert decode_value(bytes([first])) == _decode_value(bytes([first]), Limits())


SMALL = Limits(max_string_length=16)


@given(
    value=st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=20), inner),
        max_leaves=8,
    )
)
def test_check_value_takes_exactly_what_decode_value_takes(value: object) -> None:
    """A value the assignment takes decodes on a peer with the same limits, and one it
    refuses would not (before, a long string passed the assignment and failed at commit)."""
    try:
        checked = check_value(value, limits=SMALL)
    except InvalidArgument:
        with pytest.raises(MyceliaError):
            decode_value(encode_value(value), limits=SMALL)
    else:
        assert decode_value(encode_value(checked), limits=SMALL) == checked


@pytest.mark.parametrize("char", ["a", "é", "€", "𝄞"])  # 1, 2, 3 and 4 bytes of UTF-8
def test_a_string_may_fill_the_limit_in_bytes_and_no_more(char: str) -> None:
    most = SMALL.max_string_length
    fits = char * (most // len(char.encode()))
    assert check_value(fits, limits=SMALL) == fits
    over = fits + char
    with pytest.raises(InvalidArgument, match=f"at most {most} bytes of UTF-8.*Text field"):
        check_value(over, limits=SMALL)
    with pytest.raises(InvalidArgument, match="an object key"):
        check_value({over: 1}, limits=SMALL)
    with pytest.raises(InvalidArgument, match="a string"):
        check_value([[over]], limits=SMALL)


def test_a_list_or_object_may_hold_at_most_max_array_length_items() -> None:
    most = Limits().max_array_length
    assert len(check_value([0] * most)) == most  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=f"a list may hold at most {most:,} items"):
        check_value([0] * (most + 1))
    with pytest.raises(InvalidArgument, match=f"an object may hold at most {most:,} items"):
        check_value({str(i): i for i in range(most + 1)})
