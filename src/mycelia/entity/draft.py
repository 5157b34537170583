"""A transaction's working copy of one entity (:class:`Draft`), which its model's mutable
handles read and write, and the :class:`~mycelia.entity.fieldtypes.Text` such a handle
reads, whose edits go to that copy (ARCHITECTURE.md §5; the handles are
:class:`mycelia.entity.model.Handle`).

Invariants:

- Every read and write first asks ``alive``: once the transaction has committed or rolled
  back, each raises TransactionClosed, and the fork is left as it was.
- A write reaches the fork only once the field's spec has checked it (InvalidArgument
  naming the field otherwise, or an undeclared field); ``base`` (the snapshot the fork
  was taken from) is never written.
- Text positions are characters to the caller and UTF-8 bytes to the text backend (Yrs
  counts bytes): a position or length outside the current text raises InvalidArgument
  before the fork is touched.
"""

from __future__ import annotations

import typing
from collections.abc import Callable

from mycelia.entity.entity import Entity, Snapshot
from mycelia.entity.fieldtypes import Text
from mycelia.entity.values import decode_value, encode_value
from mycelia.errors import InvalidArgument, TransactionClosed

if typing.TYPE_CHECKING:
    from mycelia.entity.model import Model

__all__ = ["Draft"]


class _TextHandle(Text):
    """A text field read through a mutable handle: edits go to the transaction's copy."""

    __slots__ = ("_draft", "_field")

    _draft: Draft
    _field: str

    def __new__(cls, value: str, draft: Draft, field: str) -> _TextHandle:
        handle = super().__new__(cls, value)
        object.__setattr__(handle, "_draft", draft)
        object.__setattr__(handle, "_field", field)
        return handle

    def insert(self, index: int, text: str) -> None:
        self._draft.text_insert(self._field, index, text)

    def delete(self, index: int, length: int) -> None:
        self._draft.text_delete(self._field, index, length)

    def replace_all(self, text: str) -> None:
        self._draft.set(self._field, text)


class Draft:
    """A transaction's working copy of one entity: a fork plus what the transaction did."""

    __slots__ = ("alive", "base", "entity", "model")

    def __init__(
        self, model: type[Model], entity: Entity, base: Snapshot, alive: Callable[[], bool]
    ) -> None:
        self.model = model
        self.entity = entity
        self.base = base
        self.alive = alive

    def _check(self) -> None:
        if not self.alive():
            raise TransactionClosed("this handle's transaction has been committed or rolled back")

    def get(self, field: str) -> object:
        """The field's value as this transaction sees it."""
        self._check()
        spec = self.model._fields[field]
        if spec.backend == "text":
            return _TextHandle(self._text(field), self, field)
        encoded = self.entity.lww().encoded(field)
        if encoded is None:
            return spec.default
        return spec.wrap(decode_value(encoded))

    def set(self, field: str, value: object) -> None:
        """Write a field on the transaction's copy (checked)."""
        self._check()
        spec = self.model._fields.get(field)
        if spec is None:
            raise InvalidArgument(f"{self.model.__name__} has no field {field!r}")
        checked = spec.check(value)
        if spec.backend == "text":
            _check_encodes(field, str(checked))
            self.entity.text().replace(field, str(checked))
            return
        self.entity.lww().set(field, encode_value(checked))

    def _text(self, field: str) -> str:
        return self.entity.text().value(field)

    def text_insert(self, field: str, index: int, text: str) -> None:
        """Insert ``text`` at character ``index`` of a text field."""
        self._check()
        current = self._text(field)
        if not 0 <= index <= len(current):
            raise InvalidArgument(f"insert at {index} is outside {field!r} (length {len(current)})")
        _check_encodes(field, text)
        backend = self.entity.text()
        backend.insert(field, backend.byte_offset(field, index), text, at=index)

    def text_delete(self, field: str, index: int, length: int) -> None:
        """Delete ``length`` characters from character ``index`` of a text field."""
        self._check()
        current = self._text(field)
        if index < 0 or length < 0 or index + length > len(current):
            raise InvalidArgument(
                f"delete of {length} at {index} is outside {field!r} (length {len(current)})"
            )
        if length:
            backend = self.entity.text()
            start = backend.byte_offset(field, index)
            stop = start + len(current[index : index + length].encode())
            backend.delete(field, start, stop, chars=(index, index + length))


def _check_encodes(field: str, text: str) -> None:
    """Refuse text UTF-8 cannot encode (a lone surrogate) before Yrs sees it: Yrs would
    raise a bare ``UnicodeEncodeError``."""
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError as exc:
            raise InvalidArgument(
                f"{field!r}: the text holds a lone surrogate at character {exc.start}, which "
                f"UTF-8 cannot encode (decode what you read with errors='replace')"
            ) from None
