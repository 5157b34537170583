"""What a user's model declares, and valid values and edits for it (seeded, no hypothesis).

Both the hypothesis strategies (:mod:`mycelia.testing.strategies`) and the seeded
simulator (:mod:`mycelia.testing.simulator`) draw from the same description of a model:

- :func:`field_kinds` reads a :class:`~mycelia.Model`'s declared fields (the same
  annotations :class:`~mycelia.entity.model.FieldSpec` is built from) and classifies each
  as one of :data:`KINDS`, with whether it takes ``None`` and whether a create must give it.
- :func:`random_value` / :func:`random_values` / :func:`random_edit` draw from a
  :class:`random.Random`, so a seed fixes every value; everything they return passes the
  model's own checks (a create or an edit built from them never raises InvalidArgument).
- Edit steps (:class:`SetField`, :class:`TextInsert`, :class:`TextDelete`) are frozen values
  whose ``repr`` is valid Python, so a failing simulation prints a script that replays it.
  :func:`apply_edit` clamps text positions to the current text, so any step applies to any
  entity of the model (which is what lets a shrinker drop steps freely).
"""

from __future__ import annotations

import random
import typing
from dataclasses import dataclass
from typing import Final

from mycelia.entity.fieldtypes import Json, Ref, Text
from mycelia.entity.model import Model
from mycelia.errors import InvalidArgument

__all__ = [
    "KINDS",
    "EditStep",
    "FieldKind",
    "SetField",
    "TextDelete",
    "TextInsert",
    "apply_edit",
    "field_kinds",
    "random_edit",
    "random_value",
    "random_values",
]

KINDS: Final = ("text", "str", "int", "float", "bool", "bytes", "json", "ref")
"""Every field kind a model can declare (ARCHITECTURE.md §11)."""

_PLAIN: Final[dict[object, str]] = {
    str: "str",
    int: "int",
    float: "float",
    bool: "bool",
    bytes: "bytes",
}
_ALPHABET: Final = "ab é日🙂\n"
_INTS: Final = (0, 1, -1, 2, 7, -3, 2**63 - 1, -(2**63))
_FLOATS: Final = (0.0, -0.0, 1.5, -2.25, 1e300, float("inf"), float("-inf"))


@dataclass(frozen=True, slots=True)
class FieldKind:
    """One declared field: its name, kind (one of :data:`KINDS`) and None-ability."""

    name: str
    kind: str
    optional: bool
    """Whether the field accepts ``None``."""
    required: bool
    """Whether ``trx.create`` must be given a value for it."""


_CACHE: dict[type[Model], tuple[FieldKind, ...]] = {}


def field_kinds(model: type[Model]) -> tuple[FieldKind, ...]:
    """The declared fields of ``model``, in declaration order (cached per model).

    Raises InvalidArgument if a field's annotation is not one of the supported kinds (the
    model class itself would have refused it).
    """
    kinds = _CACHE.get(model)
    if kinds is None:
        kinds = _CACHE[model] = _field_kinds(model)
    return kinds


def _field_kinds(model: type[Model]) -> tuple[FieldKind, ...]:
    hints = typing.get_type_hints(model, include_extras=True)
    out = []
    for name, spec in model._fields.items():
        hint = hints[name]
        args = typing.get_args(hint)
        if typing.get_origin(hint) in (typing.Union, type(int | None)) and type(None) in args:
            (hint,) = [a for a in args if a is not type(None)]
        kind = _kind_of(model, name, hint)
        required = spec.backend == "lww" and not spec.has_default
        out.append(FieldKind(name, kind, spec.optional, required))
    return tuple(out)


def _kind_of(model: type[Model], name: str, hint: object) -> str:
    if hint is Text:
        return "text"
    if hint == Json:
        return "json"
    if hint is Ref or typing.get_origin(hint) is Ref:
        return "ref"
    kind = _PLAIN.get(hint)
    if kind is None:
        raise InvalidArgument(f"{model.__name__}.{name}: {hint!r} is not a supported field type")
    return kind


def random_value(field: FieldKind, rng: random.Random) -> object:
    """A valid value for ``field`` (``None`` sometimes, when the field takes it)."""
    if field.optional and field.kind != "text" and rng.random() < 0.15:
        return None
    return _RANDOM[field.kind](rng)


def random_values(model: type[Model], rng: random.Random) -> dict[str, typing.Any]:
    """Values for ``trx.create(model, **values)``: every required field, some optional ones
    (typed ``Any``: the values fit the model at run time, as the type checker cannot see)."""
    values: dict[str, typing.Any] = {}
    for field in field_kinds(model):
        if field.required or rng.random() < 0.6:
            values[field.name] = random_value(field, rng)
    return values


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 4)))


def _json(rng: random.Random, depth: int = 0) -> object:
    roll = rng.randint(0, 6 if depth < 2 else 3)
    if roll == 0:
        return None
    if roll == 1:
        return rng.random() < 0.5
    if roll == 2:
        return rng.choice(_INTS[:6])
    if roll == 3:
        return _text(rng)
    if roll == 4:
        return [_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {_text(rng): _json(rng, depth + 1) for _ in range(rng.randint(0, 3))}


_RANDOM: Final[dict[str, typing.Callable[[random.Random], object]]] = {
    "text": _text,
    "str": _text,
    "int": lambda rng: rng.choice(_INTS) if rng.random() < 0.3 else rng.randint(-9, 9),
    "float": lambda rng: rng.choice(_FLOATS) if rng.random() < 0.5 else rng.randint(-99, 99) / 4,
    "bool": lambda rng: rng.random() < 0.5,
    "bytes": lambda rng: rng.randbytes(rng.randint(0, 4)),
    "json": _json,
    "ref": lambda rng: rng.randbytes(32),  # an id (a Ref may name an entity not seen yet)
}


@dataclass(frozen=True, slots=True)
class SetField:
    """Set a field (a text field is replaced whole)."""

    name: str
    value: object


@dataclass(frozen=True, slots=True)
class TextInsert:
    """Insert ``text`` into a text field at ``index`` (clamped to the current length)."""

    name: str
    index: int
    text: str


@dataclass(frozen=True, slots=True)
class TextDelete:
    """Delete up to ``length`` characters of a text field from ``index`` (clamped)."""

    name: str
    index: int
    length: int


EditStep = SetField | TextInsert | TextDelete
"""One change to one field of an entity (see :func:`apply_edit`)."""


def random_edit(model: type[Model], rng: random.Random) -> EditStep:
    """One edit step on a random field of ``model``.

    Raises InvalidArgument if the model declares no fields.
    """
    fields = field_kinds(model)
    if not fields:
        raise InvalidArgument(f"{model.__name__} declares no fields to edit")
    field = rng.choice(fields)
    if field.kind == "text":
        roll = rng.random()
        if roll < 0.5:
            return TextInsert(field.name, rng.randint(0, 12), _text(rng) or "x")
        if roll < 0.85:
            return TextDelete(field.name, rng.randint(0, 12), rng.randint(1, 3))
    return SetField(field.name, random_value(field, rng))


def apply_edit(handle: Model, step: EditStep) -> None:
    """Apply ``step`` to a mutable handle (from ``trx.create`` or ``trx.edit``).

    Text positions are clamped to the text as the transaction sees it; raises
    InvalidArgument if the value does not suit the field (never for generated steps).
    """
    if isinstance(step, SetField):
        setattr(handle, step.name, step.value)
        return
    text = getattr(handle, step.name)
    if not isinstance(text, Text):
        raise InvalidArgument(f"{type(handle).__name__}.{step.name} is not a text field")
    index = min(max(step.index, 0), len(text))
    if isinstance(step, TextInsert):
        text.insert(index, step.text)
    else:
        length = min(max(step.length, 0), len(text) - index)
        if length:
            text.delete(index, length)
