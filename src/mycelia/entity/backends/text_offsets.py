"""Characters and UTF-8 bytes of a cached text (Yrs counts bytes, users characters).

A text backend keeps each root's text as a ``str`` and, for a non-ASCII one, a *point*:
that very ``str``, a character index in it and the index's UTF-8 byte offset. An offset
measured from the last point costs O(distance), not O(text), so typing at a cursor in a
long non-ASCII text stays cheap; an edit made knowing its span in characters leaves a
point just after itself. Pure functions: the backend keeps the texts and the points.
"""

from __future__ import annotations

__all__ = ["Point", "measured", "spliced"]

Point = tuple[str, int, int]
"""(the text measured, a character index in it, that index's UTF-8 byte offset)."""


def measured(current: str, index: int, point: Point | None) -> Point:
    """The point at character ``index`` of non-ASCII ``current``: counted from ``point``
    when it was measured on this very text, else from the start."""
    if point is not None and point[0] is current:
        _, at, offset = point
        if index >= at:
            offset += len(current[at:index].encode())
        else:
            offset -= len(current[index:at].encode())
    else:
        offset = len(current[:index].encode())
    return current, index, offset


def spliced(
    current: str, start: int, stop: int, text: str, chars: tuple[int, int] | None
) -> tuple[str, Point | None]:
    """``current`` with UTF-8 bytes ``start:stop`` replaced by ``text``, and the point just
    after ``text`` if one was measured (``chars``: the same span in characters, if known).
    Slicing by characters copies the text once; by bytes it encodes and decodes all of it
    (a one-char edit of 200,000 chars of 'é' spent 450 µs there)."""
    if current.isascii():
        return current[:start] + text + current[stop:], None
    if chars is not None:
        edited = current[: chars[0]] + text + current[chars[1] :]
        return edited, (edited, chars[0] + len(text), start + len(text.encode()))
    raw = current.encode()
    return (raw[:start] + text.encode() + raw[stop:]).decode(), None
