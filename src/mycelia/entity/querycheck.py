"""Queries checked against a model: every field named, every value of the field's type.

A query's language (:mod:`mycelia.proto.query`) knows no schema: a missing field is null,
and a comparison across collation classes is false. That is the right semantics for what
arrives from the wire (a peer's raw query has no model), but for an application it turns a
typo into silently wrong results (``titel = 't'`` matches nothing, ``nosuch IS NULL``
everything, ``ORDER BY nosuch`` orders nothing, ``seq > '5'`` on an int field nothing).
So ``ctx.fetch`` and ``ctx.query`` run :func:`check_query` on the parsed query first.

Rules (each refusal is a :class:`~mycelia.errors.QueryError` naming the field):

- every path in WHERE and ORDER BY starts with a field the model declares (the message
  lists the model's fields and suggests the closest one);
- a dotted path (``meta.author``) goes into a Json field only: other fields have no
  sub-fields;
- a literal or argument compared with a field is of the field's collation class (numbers
  for int and float fields, strings for str and Text, bools, bytes for bytes and Ref);
  ``NULL`` (``None``) is allowed, and any value goes with a Json field;
- two fields compared with each other are of the same class;
- a string literal or argument holds at most ``max_string_length`` bytes of UTF-8 (the
  durable peer refuses a longer one: a live query would show only local results, and a
  fetch fail with the peer's PayloadTooLarge).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator

from mycelia.entity.model import FieldSpec, Model
from mycelia.entity.values import oversized
from mycelia.errors import InvalidArgument, QueryError
from mycelia.proto.limits import DEFAULT_LIMITS
from mycelia.proto.query import (
    And,
    Collation,
    Comparison,
    FieldComparison,
    In,
    IsNull,
    Not,
    Or,
    Placeholder,
    Predicate,
    Query,
    class_of,
)

__all__ = ["check_query"]

_HOLDS = {
    Collation.BOOL: "bools",
    Collation.NUMBER: "numbers",
    Collation.STRING: "strings",
    Collation.BYTES: "bytes (ids)",
}


def check_query(model: type[Model], query: Query, args: tuple[object, ...] = ()) -> None:
    """Raise QueryError if ``query`` (parsed, not bound) does not fit ``model``.

    ``args`` are the query's arguments, checked where their ``?`` stands.
    """
    for item in _comparisons(query.predicate):
        _check_node(model, item, args)
    for key in query.order_by:
        _field(model, key.path, "ORDER BY")


def _comparisons(predicate: Predicate) -> Iterator[Predicate]:
    if isinstance(predicate, And | Or):
        for item in predicate.items:
            yield from _comparisons(item)
    elif isinstance(predicate, Not):
        yield from _comparisons(predicate.item)
    else:
        yield predicate


def _check_node(model: type[Model], node: Predicate, args: tuple[object, ...]) -> None:
    if isinstance(node, IsNull):
        _field(model, node.path, "WHERE")
    elif isinstance(node, Comparison):
        spec = _field(model, node.path, "WHERE")
        _check_value(model, node.path, spec, node.value, args)
    elif isinstance(node, In):
        spec = _field(model, node.path, "WHERE")
        for value in node.values:
            _check_value(model, node.path, spec, value, args)
    elif isinstance(node, FieldComparison):
        left = _field(model, node.left_path, "WHERE")
        right = _field(model, node.right_path, "WHERE")
        if (
            _exact(node.left_path, left)
            and _exact(node.right_path, right)
            and left.collation is not right.collation
        ):
            raise QueryError(
                f"{model.__name__}.{left.name} holds {_holds(left)} and "
                f"{model.__name__}.{right.name} {_holds(right)}: "
                f"comparing them never matches"
            )


def _holds(spec: FieldSpec) -> str:
    return "any JSON value" if spec.collation is None else _HOLDS[spec.collation]


def _field(model: type[Model], path: tuple[str, ...], where: str) -> FieldSpec:
    """The declared field ``path`` starts with (a dotted path only into a Json field)."""
    fields = model._fields
    name = path[0]
    spec = fields.get(name)
    if spec is None:
        close = difflib.get_close_matches(name, list(fields), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        known = ", ".join(fields) or "none"
        raise QueryError(
            f"{model.__name__} has no field {name!r} (in {where}){hint}; its fields are: {known}"
        )
    if len(path) > 1 and spec.collation is not None:
        raise QueryError(
            f"{model.__name__}.{name} holds {_holds(spec)}, which have no sub-field "
            f"{'.'.join(path[1:])!r} (in {where}): only a Json field has dotted paths"
        )
    return spec


def _exact(path: tuple[str, ...], spec: FieldSpec) -> bool:
    """Whether the path reads the field itself and the field has one class."""
    return len(path) == 1 and spec.collation is not None


def _check_value(
    model: type[Model],
    path: tuple[str, ...],
    spec: FieldSpec,
    value: object,
    args: tuple[object, ...],
) -> None:
    what = "the literal"
    if isinstance(value, Placeholder):
        if value.index >= len(args):
            return  # binding reports the missing argument
        what, value = f"argument {value.index + 1}", args[value.index]
    if isinstance(value, str):
        _check_size(value, what)
    if value is None or not _exact(path, spec):
        return
    try:
        collation = class_of(value)
    except InvalidArgument:
        return  # binding reports a value that is no query value
    if collation is not spec.collation:
        raise QueryError(
            f"{model.__name__}.{spec.name} holds {_holds(spec)}, so {what} "
            f"{value!r} (a {type(value).__name__}) never matches it"
        )


def _check_size(value: str, what: str) -> None:
    """Refuse a string longer than a peer decodes: the query could not reach the server."""
    size = oversized(value)
    if size is not None:
        raise QueryError(
            f"{what} has {size:,} bytes of UTF-8, and a query's string may hold at most "
            f"{DEFAULT_LIMITS.max_string_length:,} (what a server decodes): compare a "
            "shorter value"
        )
