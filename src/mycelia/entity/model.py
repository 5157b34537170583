"""Models: declarative classes over entities, frozen views and mutable handles.

::

    class Album(Model, collection="albums"):
        name: Text                 # collaborative text (pycrdt)
        artist: str                # plain types are last-writer-wins
        year: int = 0              # a default makes a field optional at create
        label: str | None          # None-able: absent means None
        meta: Json                 # any JSON value, LWW
        cover: Ref[Image] | None   # another entity's id, LWW

Invariants:

- An instance of a model class is either a **view** (a frozen snapshot: setting a field
  raises) or a **mutable handle** bound to a live transaction (reads and writes go to
  the transaction's fork; any use after commit or rollback raises TransactionClosed).
- Schema evolution: a field added later reads as its default (or ``None``) on old
  entities; fields this version does not declare stay in the entity's state untouched.
- Values are checked on assignment (type and storability); a bad value raises
  :class:`~mycelia.errors.InvalidArgument` naming the field.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Generic, TypeVar, Union

from mycelia.entity.entity import Entity, Snapshot
from mycelia.entity.values import check_value, decode_value, encode_value
from mycelia.errors import InvalidArgument, TransactionClosed
from mycelia.proto import Clock, EntityId
from mycelia.proto.codec import NAME_PATTERN

__all__ = ["Draft", "FieldSpec", "Json", "Model", "Ref", "Text"]

M = TypeVar("M", bound="Model")


class Text(str):
    """A collaborative text field's value (a ``str``).

    On a view it is a read-only snapshot. On a mutable handle, :meth:`insert`,
    :meth:`delete` and :meth:`replace` edit the transaction's copy; read the field again
    to see the new text.
    """

    __slots__ = ()

    def insert(self, index: int, text: str) -> None:
        """Insert ``text`` at ``index`` (mutable handles only)."""
        raise InvalidArgument("a view's text is read-only: edit it through trx.edit()")

    def delete(self, index: int, length: int) -> None:
        """Delete ``length`` characters from ``index`` (mutable handles only)."""
        raise InvalidArgument("a view's text is read-only: edit it through trx.edit()")

    def replace_all(self, text: str) -> None:
        """Replace the whole text (mutable handles only)."""
        raise InvalidArgument("a view's text is read-only: edit it through trx.edit()")


class _JsonMarker:
    """Marks a field as holding any JSON value."""


Json = Annotated[Any, _JsonMarker]
"""A field holding any JSON value (dicts, lists, strings, numbers, booleans, None)."""


class Ref(EntityId, Generic[M]):
    """A field holding another entity's id (``Ref[Artist]``); compares as its bytes."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """How one declared field is stored and checked."""

    name: str
    backend: str
    """``lww`` or ``text``."""
    check: Callable[[object], object]
    """Returns the canonical value or raises InvalidArgument."""
    optional: bool
    default: object
    has_default: bool
    wrap: Callable[[object], object]
    """Turns a stored value into what a view returns (Ref, Text)."""


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

    __slots__ = ("alive", "base", "entity", "model", "texts")

    def __init__(
        self, model: type[Model], entity: Entity, base: Snapshot, alive: Callable[[], bool]
    ) -> None:
        self.model = model
        self.entity = entity
        self.base = base
        self.alive = alive
        self.texts: dict[str, str] = {}
        """Each edited text field's content as a Python string, kept in step with the
        document (Yrs indexes by UTF-8 byte; users index by character)."""

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
            self.entity.text().replace(field, str(checked))
            self.texts[field] = str(checked)
            return
        self.entity.lww().set(field, encode_value(checked))

    def _text(self, field: str) -> str:
        cached = self.texts.get(field)
        if cached is None:
            backend = self.entity.text()
            cached = str(backend.text(field)) if field in backend.values() else ""
            self.texts[field] = cached
        return cached

    def text_insert(self, field: str, index: int, text: str) -> None:
        """Insert ``text`` at character ``index`` of a text field."""
        self._check()
        current = self._text(field)
        if not 0 <= index <= len(current):
            raise InvalidArgument(f"insert at {index} is outside {field!r} (length {len(current)})")
        self.entity.text().insert(field, _byte_offset(current, index), text)
        self.texts[field] = current[:index] + text + current[index:]

    def text_delete(self, field: str, index: int, length: int) -> None:
        """Delete ``length`` characters from character ``index`` of a text field."""
        self._check()
        current = self._text(field)
        if index < 0 or length < 0 or index + length > len(current):
            raise InvalidArgument(
                f"delete of {length} at {index} is outside {field!r} (length {len(current)})"
            )
        if length:
            start = _byte_offset(current, index)
            stop = _byte_offset(current, index + length)
            self.entity.text().delete(field, start, stop)
            self.texts[field] = current[:index] + current[index + length :]


def _byte_offset(text: str, index: int) -> int:
    """The UTF-8 byte offset of character ``index`` (Yrs counts bytes, users characters)."""
    return index if text.isascii() else len(text[:index].encode("utf-8"))


class Model:
    """Base of declarative entity classes; see the module docstring."""

    __collection__: ClassVar[str]
    _fields: ClassVar[dict[str, FieldSpec]]
    _mutable_class: ClassVar[type[Model]]
    __slots__ = ("__dict__",)

    id: EntityId
    head: Clock

    def __init_subclass__(cls, collection: str | None = None, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if getattr(cls, "_is_mutable_class", False):
            return
        name = collection or cls.__name__.lower()
        if not NAME_PATTERN.match(name) or name.startswith("_mycelia_"):
            raise InvalidArgument(f"{name!r} is not a valid collection name for {cls.__name__}")
        cls.__collection__ = name
        try:
            cls._fields = _declared_fields(cls)
        except NameError:
            # A forward reference to a class not defined yet (``Ref["Self"]``): resolve the
            # fields on first use instead, once the module has been executed.
            cls._fields = _LazyFields()  # type: ignore[assignment]
        cls._mutable_class = type(
            f"Mutable{cls.__name__}", (cls,), {"_is_mutable_class": True, "__slots__": ()}
        )

    def __init__(self) -> None:
        raise InvalidArgument(
            f"models are not constructed directly: use trx.create({type(self).__name__}, ...)"
        )

    @classmethod
    def _view(cls, snapshot: Snapshot) -> typing.Self:
        """A frozen view of ``snapshot`` (internal: contexts build views)."""
        view = object.__new__(cls)
        state = view.__dict__
        state["id"] = snapshot.entity_id
        state["head"] = snapshot.head
        values = snapshot.values
        for name, spec in cls._fields.items():
            raw = values.get(name, None)
            if raw is None and name not in values:
                state[name] = Text("") if spec.backend == "text" else spec.default
            else:
                state[name] = spec.wrap(raw)
        return view

    @classmethod
    def _handle(cls, draft: Draft) -> typing.Self:
        """A mutable handle on ``draft`` (internal: transactions build handles)."""
        handle = object.__new__(cls._mutable_class)
        handle.__dict__["_draft"] = draft
        handle.__dict__["id"] = draft.entity.entity_id
        return handle  # type: ignore[return-value]

    def __getattribute__(self, name: str) -> Any:
        state = object.__getattribute__(self, "__dict__")
        draft = state.get("_draft")
        if draft is not None:
            fields = object.__getattribute__(self, "_fields")
            if name in fields:
                return draft.get(name)
            if name == "head":
                draft._check()
                return draft.entity.head
        return object.__getattribute__(self, name)

    def __setattr__(self, name: str, value: object) -> None:
        draft = self.__dict__.get("_draft")
        if draft is None:
            raise InvalidArgument(
                f"a {type(self).__name__} view is read-only: edit it with trx.edit()"
            )
        draft.set(name, value)

    def __repr__(self) -> str:
        kind = "Mutable" if "_draft" in self.__dict__ else "View"
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self._fields)
        return f"{type(self).__name__}<{kind} {self.id}>({fields})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Model) or "_draft" in self.__dict__:
            return NotImplemented
        return self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]


class _LazyFields:
    """A model's fields, resolved on first access (see ``Model.__init_subclass__``)."""

    def __get__(self, obj: object, owner: type[Model]) -> dict[str, FieldSpec]:
        fields = _declared_fields(owner)
        for klass in owner.__mro__:
            if klass.__dict__.get("_fields") is self:
                setattr(klass, "_fields", fields)  # noqa: B010 - replace the placeholder for good
        return fields


def _declared_fields(cls: type[Model]) -> dict[str, FieldSpec]:
    hints = typing.get_type_hints(cls, include_extras=True)
    fields: dict[str, FieldSpec] = {}
    for name, hint in hints.items():
        if name in {"id", "head"} or typing.get_origin(hint) is ClassVar:
            continue
        if name.startswith("_") or not NAME_PATTERN.match(name):
            raise InvalidArgument(f"{cls.__name__}.{name}: field names must be plain words")
        fields[name] = _spec(cls, name, hint)
    return fields


def _spec(cls: type[Model], name: str, hint: object) -> FieldSpec:
    optional = False
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            raise InvalidArgument(f"{cls.__name__}.{name}: unions are not supported")
        hint, optional = rest[0], True
    has_default = name in cls.__dict__
    default = cls.__dict__.get(name)
    backend, check, wrap = _kind(cls, name, hint)
    if check is check_value:
        optional = True  # JSON's null is a JSON value
    if backend == "text":
        has_default, default = True, Text(default if isinstance(default, str) else "")

    def checked(value: object) -> object:
        if value is None:
            if optional:
                return None
            raise InvalidArgument(f"{cls.__name__}.{name} cannot be None")
        return check(value)

    return FieldSpec(name, backend, checked, optional, default, has_default or optional, wrap)


def _kind(
    cls: type[Model], name: str, hint: object
) -> tuple[str, Callable[[object], object], Callable[[object], object]]:
    where = f"{cls.__name__}.{name}"
    if hint is Text:
        return "text", _typed(where, (str,)), lambda v: Text(str(v))
    if typing.get_origin(hint) is Annotated and _JsonMarker in typing.get_args(hint):
        return "lww", check_value, _identity
    if hint is Ref or typing.get_origin(hint) is Ref:
        return "lww", _ref_check(where), lambda v: Ref(v) if isinstance(v, bytes) else v
    plain: Mapping[object, tuple[type, ...]] = {
        str: (str,),
        int: (int,),
        float: (float, int),
        bool: (bool,),
        bytes: (bytes,),
    }
    if hint in plain:
        return "lww", _typed(where, plain[hint]), _identity
    raise InvalidArgument(f"{where}: {hint!r} is not a supported field type")


def _identity(value: object) -> object:
    return value


def _typed(where: str, allowed: tuple[type, ...]) -> Callable[[object], object]:
    def check(value: object) -> object:
        if isinstance(value, bool) and bool not in allowed:
            raise InvalidArgument(f"{where} takes {allowed[0].__name__}, not bool")
        if not isinstance(value, allowed):
            raise InvalidArgument(
                f"{where} takes {allowed[0].__name__}, not {type(value).__name__}"
            )
        if allowed == (float, int):
            value = float(value)  # type: ignore[arg-type]
        return check_value(value)

    return check


def _ref_check(where: str) -> Callable[[object], object]:
    def check(value: object) -> object:
        if isinstance(value, Model):
            value = value.id
        if not isinstance(value, bytes) or len(value) != 32:
            raise InvalidArgument(f"{where} takes an entity id (or a model instance)")
        return bytes(value)

    return check
