"""The canonical query text: what ``Query.to_text`` prints and the wire carries.

Invariants:

- ``parse(format_query(...))`` gives back an equal ``Query`` (typed literals included): the
  printer adds exactly the parentheses the precedence (NOT > AND > OR) and the AST's nesting
  need, and prints every literal in a form the lexer decodes to the same value.
- The form is canonical: upper-case keywords, ``!=`` (never ``<>``), single spaces, a field
  segment bare when it is a non-keyword identifier and double-quoted otherwise, floats as
  ``repr`` (always with a ``.`` or an exponent, so they stay floats), bytes as ``X'..'``
  lower-case hex, the ``TRUE`` predicate omitted, ``ASC`` omitted.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from mycelia.proto.query.lexer import KEYWORDS
from mycelia.proto.query.syntax import (
    And,
    Comparison,
    Const,
    FieldComparison,
    In,
    IsNull,
    Not,
    Or,
    OrderKey,
    Placeholder,
    Predicate,
)
from mycelia.proto.query.values import Scalar

__all__ = ["format_literal", "format_path", "format_predicate", "format_query"]

_BARE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_ESCAPES: Final = {"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def format_query(
    predicate: Predicate, order_by: Sequence[OrderKey], limit: int | Placeholder | None
) -> str:
    """The canonical text of a query made of these parts."""
    parts = []
    if predicate != Const(True):
        parts.append(format_predicate(predicate))
    if order_by:
        columns = (format_path(key.path) + (" DESC" if key.descending else "") for key in order_by)
        parts.append("ORDER BY " + ", ".join(columns))
    if limit is not None:
        parts.append("LIMIT " + ("?" if isinstance(limit, Placeholder) else str(limit)))
    return " ".join(parts)


def format_predicate(predicate: Predicate) -> str:
    """The canonical text of one predicate."""
    if isinstance(predicate, Or):
        return " OR ".join(_grouped(item, (Or,)) for item in predicate.items)
    if isinstance(predicate, And):
        return " AND ".join(_grouped(item, (Or, And)) for item in predicate.items)
    if isinstance(predicate, Not):
        return "NOT " + _grouped(predicate.item, (Or, And))
    if isinstance(predicate, Const):
        return "TRUE" if predicate.value else "FALSE"
    if isinstance(predicate, Comparison):
        path, value = format_path(predicate.path), format_literal(predicate.value)
        return f"{path} {predicate.op.value} {value}"
    if isinstance(predicate, FieldComparison):
        left, right = format_path(predicate.left_path), format_path(predicate.right_path)
        return f"{left} {predicate.op.value} {right}"
    if isinstance(predicate, In):
        values = ", ".join(format_literal(value) for value in predicate.values)
        keyword = "NOT IN" if predicate.negated else "IN"
        return f"{format_path(predicate.path)} {keyword} ({values})"
    assert isinstance(predicate, IsNull)
    keyword = "IS NOT NULL" if predicate.negated else "IS NULL"
    return f"{format_path(predicate.path)} {keyword}"


def _grouped(predicate: Predicate, kinds: tuple[type, ...]) -> str:
    text = format_predicate(predicate)
    return f"({text})" if isinstance(predicate, kinds) else text


def format_path(path: Sequence[str]) -> str:
    """A dotted path, each segment bare or double-quoted."""
    return ".".join(
        segment
        if _BARE.match(segment) and segment.upper() not in KEYWORDS
        else _quote(segment, '"')
        for segment in path
    )


def format_literal(value: Scalar | Placeholder) -> str:
    """One literal (or ``?``) as the lexer reads it back."""
    if isinstance(value, Placeholder):
        return "?"
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return _quote(value, "'")
    return f"X'{value.hex()}'"


def _quote(text: str, quote: str) -> str:
    out = [quote]
    for char in text:
        point = ord(char)
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif char == quote:
            out.append("\\" + quote)
        elif point < 0x20 or point == 0x7F or 0xD800 <= point <= 0xDFFF:
            # Control characters would hide in logs; lone surrogates cannot be UTF-8.
            out.append(f"\\u{point:04x}")
        else:
            out.append(char)
    out.append(quote)
    return "".join(out)
