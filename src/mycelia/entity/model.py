"""Models: declarative classes over entities, frozen views and mutable handles.

::

    class Album(Model, collection="albums"):
        name: Text                 # collaborative text (pycrdt)
        artist: str                # plain types are last-writer-wins
        year: int = 0              # a default makes a field optional at create
        label: str | None          # None-able: absent means None
        meta: Json                 # any JSON value, LWW
        cover: Ref[Image] | None   # another entity's id, LWW

The field types (``Text``, ``Json``, ``Ref``) are in :mod:`mycelia.entity.fieldtypes`, a
handle's working copy of its entity (:class:`~mycelia.entity.draft.Draft`) in
:mod:`mycelia.entity.draft`; this module turns the annotations into field specs and builds
the views and handles.

Invariants:

- A model class is never instantiated itself. Each one has two derived types, built once
  and sharing one descriptor per declared field: its :class:`View` (a frozen snapshot:
  setting anything raises; views compare equal by value) and its :class:`Handle` (bound
  to a live transaction: reads and writes go to the transaction's fork; any use after
  commit or rollback raises TransactionClosed). A field's descriptor asks the instance
  to read or write it, so what an instance may do is decided by its type, never by a
  flag inside it. Both derive from the model class, so ``isinstance(x, Album)`` holds.
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
from typing import Annotated, ClassVar, TypeVar, Union

from mycelia.entity.draft import Draft
from mycelia.entity.entity import Snapshot
from mycelia.entity.fieldtypes import JsonMarker, Ref, Text
from mycelia.entity.values import check_value
from mycelia.errors import InvalidArgument
from mycelia.proto import Clock, EntityId
from mycelia.proto.codec import NAME_PATTERN
from mycelia.proto.event import RESERVED_PREFIX
from mycelia.proto.query import Collation

__all__ = ["FieldSpec", "Handle", "Model", "View"]

M = TypeVar("M", bound="Model")
K = TypeVar("K", bound="Model")


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
    collation: Collation | None = None
    """The query collation class of the field's values (``None``: any, a Json field)."""


@typing.dataclass_transform(kw_only_default=True)
class Model:
    """Base of declarative entity classes; see the module docstring.

    The class keyword ``collection`` names the collection its entities live in; without
    it the collection is the class name in lower case (``class Note(Model)`` is
    ``"note"``), so renaming the class would move its data: name the collection whenever
    data outlives a refactoring. Names starting with ``_mycelia_`` are reserved.

    For type checkers a model is a keyword-only dataclass (``typing.dataclass_transform``):
    ``trx.create(Note, title=5)`` is a type error when ``title`` is a ``str``. To them a
    field without a default is required at create, so give optional fields a default
    (``label: str | None = None``, ``body: Text = Text()``); at run time a None-able field
    is optional anyway (absent means ``None``) and a Text field starts empty.
    """

    __collection__: ClassVar[str]
    _fields: ClassVar[dict[str, FieldSpec]]
    _model: ClassVar[type[Model]]
    """The declared model class (a View or Handle type points at the class it derives from)."""
    _derived: ClassVar[tuple[type[View], type[Handle]]]
    _view_plan: ClassVar[tuple[type[View], dict[str, _ViewField]]]
    __slots__ = ("__dict__",)

    if typing.TYPE_CHECKING:  # set on every view and handle (not fields of the model)

        @property
        def id(self) -> EntityId:
            """The entity's id (its genesis event's id)."""
            ...

        @property
        def head(self) -> Clock:
            """The entity's head when the view was made (a handle: its fork's head)."""
            ...

    def __init_subclass__(
        cls, collection: str | None = None, *, _internal: bool = False, **kwargs: object
    ) -> None:
        super().__init_subclass__(**kwargs)
        if _internal:  # View, Handle, and the types derived from each model
            return
        name = collection or cls.__name__.lower()
        if name.startswith(RESERVED_PREFIX):
            raise InvalidArgument(
                f"{cls.__name__}: the collection prefix {RESERVED_PREFIX!r} is reserved for "
                f"Mycelia's own records ({name!r}): choose another collection name"
            )
        if not NAME_PATTERN.match(name):
            raise InvalidArgument(
                f"{name!r} is not a valid collection name for {cls.__name__}: it starts with a "
                f"letter or '_' and goes on with letters, digits, '_', '.' or '-'"
            )
        cls.__collection__ = name
        cls._model = cls
        try:
            cls._fields = _declared_fields(cls)
        except NameError:
            # A forward reference to a class not defined yet (``Ref["Self"]``): resolve the
            # fields on first use instead, once the module has been executed.
            cls._fields = _LazyFields()  # type: ignore[assignment]

    def __init__(self) -> None:
        raise InvalidArgument(
            f"models are not constructed directly: use trx.create({type(self).__name__}, ...)"
        )

    @classmethod
    def _view(cls, snapshot: Snapshot) -> typing.Self:
        """A frozen view of ``snapshot`` (internal: contexts build views). Its fields are
        filled from the snapshot's values when first read (:meth:`View._read`): a live
        query builds a view per row, and most rows' fields are never all read."""
        view = object.__new__(_view_plan(cls._model)[0])
        state = view.__dict__
        state["id"] = snapshot.entity_id
        state["head"] = snapshot.head
        state[_VALUES] = snapshot.values
        return typing.cast("typing.Self", view)

    @classmethod
    def _handle(cls, draft: Draft) -> typing.Self:
        """A mutable handle on ``draft`` (internal: transactions build handles)."""
        handle = object.__new__(_derived(cls._model)[1])
        handle.__dict__["_draft"] = draft
        handle.__dict__["id"] = draft.entity.entity_id
        return typing.cast("typing.Self", handle)

    def _read(self, name: str) -> object:
        raise NotImplementedError  # pragma: no cover - a model class is never instantiated

    def _write(self, name: str, value: object) -> None:
        raise NotImplementedError  # pragma: no cover - a model class is never instantiated

    def _fields_repr(self) -> str:
        return ", ".join(f"{n}={self._read(n)!r}" for n in self._fields)

    __hash__ = None  # type: ignore[assignment]


class _Field:
    """One declared field, shared by its model's View and Handle types.

    It holds no value and makes no decision: reading or writing it asks the instance
    (:meth:`View._read` / :meth:`Handle._read`, and ``_write``), so the instance's type
    alone decides whether the field is frozen or goes to a transaction's fork.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Model | None, owner: type | None = None) -> object:
        return self if obj is None else obj._read(self.name)

    def __set__(self, obj: Model, value: object) -> None:
        obj._write(self.name, value)


class View(Model, _internal=True):
    """A frozen snapshot of one entity (``ctx.get``, ``ctx.fetch``, live queries).

    Its fields, ``id`` and ``head`` are fixed when it is made; setting anything raises
    InvalidArgument. A field is taken from the snapshot's values (which never change) when
    it is first read, and kept. Two views are equal when they are of the same model and
    hold the same id, head and field values.
    """

    __slots__ = ()

    def _read(self, name: str) -> object:
        state = self.__dict__
        value = state.get(name, _ABSENT)
        if value is _ABSENT:
            text, default, wrap = _view_plan(self._model)[1][name]
            raw = state[_VALUES].get(name, _ABSENT)
            if raw is _ABSENT:
                value = Text("") if text else default
            else:
                value = raw if wrap is None else wrap(raw)
            state[name] = value
        return value

    def _write(self, name: str, value: object) -> None:
        raise InvalidArgument(
            f"a {self._model.__name__} view is read-only: edit it with trx.edit()"
        )

    def __setattr__(self, name: str, value: object) -> None:
        self._write(name, value)

    def __delattr__(self, name: str) -> None:
        self._write(name, None)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, View):
            return NotImplemented
        mine, theirs = self.__dict__, other.__dict__
        if type(self) is not type(other) or mine["id"] != theirs["id"]:
            return False
        if mine["head"] != theirs["head"]:
            return False
        if mine[_VALUES] == theirs[_VALUES]:
            return True  # (the same values fill the same fields)
        return all(_same(self._read(name), other._read(name)) for name in self._fields)

    __hash__ = None  # a view may hold unhashable values (Json); equality is by value

    def __repr__(self) -> str:
        return f"{self._model.__name__}<View {self.id}>({self._fields_repr()})"


class Handle(Model, _internal=True):
    """A mutable handle on one entity, bound to a transaction (``trx.create``, ``trx.edit``).

    Its fields read and write the transaction's fork (checked on assignment; ``Text``
    fields edit in place); ``head`` is the fork's head. Setting an undeclared name raises
    InvalidArgument; any use after the transaction ends raises TransactionClosed.
    """

    __slots__ = ()

    @property
    def head(self) -> Clock:
        """The head of the transaction's copy."""
        draft: Draft = self.__dict__["_draft"]
        draft._check()
        return draft.entity.head

    def _read(self, name: str) -> object:
        draft: Draft = self.__dict__["_draft"]
        return draft.get(name)

    def _write(self, name: str, value: object) -> None:
        draft: Draft = self.__dict__["_draft"]
        draft.set(name, value)

    def __setattr__(self, name: str, value: object) -> None:
        if name not in self._fields:
            self.__dict__["_draft"]._check()
            raise InvalidArgument(f"{self._model.__name__} has no field {name!r}")
        object.__setattr__(self, name, value)  # the field's descriptor writes the fork

    def __repr__(self) -> str:
        return f"{self._model.__name__}<Mutable {self.id}>({self._fields_repr()})"


_ABSENT: typing.Final = object()
"""A field absent from a snapshot's values (``None`` is a value)."""


def _same(mine: object, theirs: object) -> bool:
    """Equal as a dict compares its values: the same object (a NaN too), or ``==``."""
    return mine is theirs or bool(mine == theirs)


_VALUES: typing.Final = "_values"
"""Where a view keeps its snapshot's values (its fields are filled from them when read)."""

_ViewField = tuple[bool, object, Callable[[object], object] | None]
"""How a view fills one field: (is text, default, wrap; ``None``: the value as stored)."""


def _view_plan(model: type[Model]) -> tuple[type[View], dict[str, _ViewField]]:
    """``model``'s View type and how a view fills each field, built on first use."""
    plan = model.__dict__.get("_view_plan")
    if plan is None:
        fields = {
            name: (
                spec.backend == "text",
                spec.default,
                None if spec.wrap is _identity else spec.wrap,
            )
            for name, spec in model._fields.items()
        }
        plan = (_derived(model)[0], fields)
        model._view_plan = plan
    return plan


def _derived(model: type[Model]) -> tuple[type[View], type[Handle]]:
    """``model``'s View and Handle types, built on first use (its fields must be known)."""
    derived = model.__dict__.get("_derived")
    if derived is None:
        shared = {name: _Field(name) for name in model._fields}
        derived = (_derive(model, View, shared), _derive(model, Handle, shared))
        model._derived = derived
    return derived


def _derive(model: type[Model], kind: type[K], fields: dict[str, _Field]) -> type[K]:
    """The type of ``model``'s instances of ``kind`` (View or Handle), with ``fields``."""

    def body(namespace: dict[str, object]) -> None:
        namespace.update(fields, __slots__=(), __module__=model.__module__)
        namespace["__qualname__"] = f"{model.__qualname__}.{kind.__name__}"

    name = f"{model.__name__}{kind.__name__}"
    derived = types.new_class(name, (model, kind), {"_internal": True}, body)
    return typing.cast("type[K]", derived)


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
    backend, check, wrap, collation = _kind(cls, name, hint)
    if _is_json(hint):
        optional = True  # JSON's null is a JSON value
    if backend == "text":
        has_default, default = True, Text(default if isinstance(default, str) else "")

    def checked(value: object) -> object:
        if value is None:
            if optional:
                return None
            raise InvalidArgument(f"{cls.__name__}.{name} cannot be None")
        return check(value)

    return FieldSpec(
        name, backend, checked, optional, default, has_default or optional, wrap, collation
    )


def _kind(
    cls: type[Model], name: str, hint: object
) -> tuple[str, Callable[[object], object], Callable[[object], object], Collation | None]:
    where = f"{cls.__name__}.{name}"
    if hint is Text:  # a Yrs document: any length (the LWW value limits are not its own)
        return "text", _typed(where, (str,), stored=False), lambda v: Text(str(v)), Collation.STRING
    if _is_json(hint):
        return "lww", _json_check(where), _identity, None
    if hint is Ref or typing.get_origin(hint) is Ref:
        wrap = _wrap_ref
        return "lww", _ref_check(where), wrap, Collation.BYTES
    plain: Mapping[object, tuple[tuple[type, ...], Collation]] = {
        str: ((str,), Collation.STRING),
        int: ((int,), Collation.NUMBER),
        float: ((float, int), Collation.NUMBER),
        bool: ((bool,), Collation.BOOL),
        bytes: ((bytes,), Collation.BYTES),
    }
    if hint in plain:
        allowed, collation = plain[hint]
        return "lww", _typed(where, allowed), _identity, collation
    raise InvalidArgument(f"{where}: {hint!r} is not a supported field type")


def _is_json(hint: object) -> bool:
    return typing.get_origin(hint) is Annotated and JsonMarker in typing.get_args(hint)


def _identity(value: object) -> object:
    return value


def _wrap_ref(value: object) -> object:
    return Ref(value) if isinstance(value, bytes) else value


def _typed(
    where: str, allowed: tuple[type, ...], *, stored: bool = True
) -> Callable[[object], object]:
    """A check that ``value`` is one of ``allowed`` and (``stored``: an LWW field's value)
    fits what a peer decodes."""

    def check(value: object) -> object:
        if isinstance(value, bool) and bool not in allowed:
            raise InvalidArgument(f"{where} takes {allowed[0].__name__}, not bool")
        if not isinstance(value, allowed):
            raise InvalidArgument(
                f"{where} takes {allowed[0].__name__}, not {type(value).__name__}"
            )
        if allowed == (float, int):
            value = float(value)  # type: ignore[arg-type]
        return _stored(where, value) if stored else value

    return check


def _json_check(where: str) -> Callable[[object], object]:
    def check(value: object) -> object:
        return _stored(where, value)

    return check


def _stored(where: str, value: object) -> object:
    """``value`` in canonical form; InvalidArgument naming the field if it cannot be
    stored."""
    try:
        return check_value(value)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{where}: {exc}") from None


def _ref_check(where: str) -> Callable[[object], object]:
    def check(value: object) -> object:
        if isinstance(value, Model):
            value = value.id
        if not isinstance(value, bytes) or len(value) != 32:
            raise InvalidArgument(f"{where} takes an entity id (or a model instance)")
        return bytes(value)

    return check
