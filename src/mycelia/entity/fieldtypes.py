"""The types a model's field may be declared with besides the plain ones (``str``, ``int``,
``float``, ``bool``, ``bytes``, each optionally ``| None``): :class:`Text`, :data:`Json`
and :class:`Ref` (ARCHITECTURE.md §11; :mod:`mycelia.entity.model` reads the annotations).

Invariants:

- A :class:`Text` is a ``str``. Read from a view it is a read-only snapshot: its edit
  methods raise InvalidArgument. Only the text a mutable handle reads
  (:mod:`mycelia.entity.draft`) edits, and it edits the transaction's copy, never itself.
- :data:`Json` is ``Any`` to a type checker and carries no type at run time: a Json field
  is recognised by its :class:`JsonMarker` alone.
- A :class:`Ref` is an :class:`~mycelia.proto.EntityId` and compares as its 32 bytes,
  whatever model it names: the model parameter is for type checkers only.
- The ``__get__``/``__set__`` stubs exist for type checkers only (``TYPE_CHECKING``): at
  run time a field is read and written through its model's descriptor.
"""

from __future__ import annotations

import typing
from typing import Annotated, Any, Generic, TypeVar

from mycelia.errors import InvalidArgument
from mycelia.proto import EntityId

if typing.TYPE_CHECKING:
    from mycelia.entity.model import Model

__all__ = ["Json", "JsonMarker", "Ref", "Text"]

R_co = TypeVar("R_co", bound="Model", covariant=True)


class Text(str):
    """A collaborative text field's value (a ``str``).

    On a view it is a read-only snapshot. On a mutable handle, :meth:`insert`,
    :meth:`delete` and :meth:`replace_all` edit the transaction's copy; read the field
    again to see the new text. ``trx.create`` and assignment take any ``str``.
    """

    __slots__ = ()

    if typing.TYPE_CHECKING:  # for the type checker only: a Text field takes a str

        def __get__(self, obj: object, owner: object = None) -> Text: ...

        def __set__(self, obj: object, value: str) -> None: ...

    def insert(self, index: int, text: str) -> None:
        """Insert ``text`` at ``index`` (mutable handles only)."""
        raise InvalidArgument("a view's text is read-only: edit it through trx.edit()")

    def delete(self, index: int, length: int) -> None:
        """Delete ``length`` characters from ``index`` (mutable handles only)."""
        raise InvalidArgument("a view's text is read-only: edit it through trx.edit()")

    def replace_all(self, text: str) -> None:
        """Replace the whole text (mutable handles only)."""
        raise InvalidArgument("a view's text is read-only: edit it through trx.edit()")


class JsonMarker:
    """Marks a field as holding any JSON value."""


Json = Annotated[Any, JsonMarker]
"""A field holding any JSON value (dicts, lists, strings, numbers, booleans, None)."""


class Ref(EntityId, Generic[R_co]):
    """A field holding another entity's id (``Ref[Artist]``); compares as its bytes.

    ``trx.create`` and assignment take an id or the entity itself (a view or handle). A
    None-able reference (``Ref[Artist] | None``) is, to a type checker, a ``Ref`` or
    ``None``: pass ``Ref(artist.id)``.
    """

    __slots__ = ()

    if typing.TYPE_CHECKING:  # for the type checker only: a Ref field takes an id or model

        def __get__(self, obj: object, owner: object = None) -> Ref[R_co]: ...

        def __set__(self, obj: object, value: EntityId | Model) -> None: ...
