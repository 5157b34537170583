"""Characters and UTF-8 bytes of a cached text (``entity/backends/text_offsets.py``): an
offset measured from any point on the same text, and a splice by characters, agree with
counting from the start and splicing the bytes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mycelia.entity.backends.text_offsets import measured, spliced

texts = st.text(alphabet=st.sampled_from("aé€𝄞 \n"), max_size=40)


@given(texts, st.data())
def test_an_offset_from_any_point_is_the_offset_from_the_start(
    text: str, data: st.DataObject
) -> None:
    start = data.draw(st.integers(0, len(text)))
    index = data.draw(st.integers(0, len(text)))
    point = measured(text, start, None)
    assert point == (text, start, len(text[:start].encode()))
    assert measured(text, index, point)[2] == len(text[:index].encode())
    other = text + "x"  # a point on another text is not used
    assert measured(other, index, (text, start, 10**6))[2] == len(other[:index].encode())


@given(texts, texts, st.data())
def test_a_splice_by_characters_is_the_splice_of_the_bytes(
    text: str, inserted: str, data: st.DataObject
) -> None:
    first = data.draw(st.integers(0, len(text)))
    last = data.draw(st.integers(first, len(text)))
    start, stop = len(text[:first].encode()), len(text[:last].encode())
    by_bytes, _ = spliced(text, start, stop, inserted, None)
    assert by_bytes == text[:first] + inserted + text[last:]
    by_chars, point = spliced(text, start, stop, inserted, (first, last))
    assert by_chars == by_bytes
    if not text.isascii():
        assert point == (
            by_chars,
            first + len(inserted),
            len(by_chars[: first + len(inserted)].encode()),
        )
