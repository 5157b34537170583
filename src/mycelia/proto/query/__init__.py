"""``mycelia.proto.query``: the query language, its one semantics and its key encoding.

Pure and synchronous (ARCHITECTURE.md §2, §8): text in, AST out; rows in, booleans and
order out. This docstring is the contract every storage engine's pushdown mirrors exactly;
``tests/proto/query/cases.json`` pins it and every engine runs that file.

Language (see :mod:`~mycelia.proto.query.parser` for the grammar)::

    year > ? AND (artist = 'Prince' OR meta.author."full name" IN ('a', 'b'))
        AND NOT tags IS NULL ORDER BY year DESC, name LIMIT 20

comparisons ``= != <> < <= > >=`` (field vs literal, literal vs field, field vs field),
``[NOT] IN (...)``, ``IS [NOT] NULL``, ``NOT`` > ``AND`` > ``OR``, parentheses; literals
``NULL TRUE FALSE``, integers (64-bit), decimals and exponents (``-2.5``, ``-1.5E-2``),
``'strings'`` (``''`` or ``\\'`` for a quote; ``\\\\ \\n \\t \\r \\uXXXX \\UXXXXXXXX``),
bytes ``X'00ff'``; ``?`` wherever a literal or the LIMIT may stand; dotted paths, each
segment an identifier or a ``"double-quoted"`` name. Keywords are case-insensitive and
reserved (quote a field named ``"order"``). Inputs over 64 KiB or nesting deeper than 64
raise :class:`~mycelia.errors.QueryError` with a 1-based ``column``, like any syntax error.

Values: None, bool, int, float, str, bytes (subclasses such as ids compare as bytes),
lists and objects (``str`` keys). A missing field, or a path that meets a missing key or a
non-object (paths never index lists), is null. A float NaN is null everywhere.

Collation (ORDER BY and :func:`encode_key`), a total order:
null < false < true < numbers < strings < bytes < lists < objects. Numbers by exact value
across int and float (``1 == 1.0``, ``2**53 + 1 > 2.0**53``, ``-0.0 == 0.0``, -inf < finite <
+inf); strings by code point (= UTF-8 byte order); bytes lexicographically; lists element
by element, then shorter first; objects as their (key, value) pairs sorted by key, compared
pair by pair (key, then value), then fewer pairs first.

Predicates (two-valued logic, never an error for any stored value):

- A comparison with a null side is false: ``x != 5`` is false for null ``x``, and
  ``NOT (x = 5)`` is true for it. ``x = NULL`` is always false: use ``IS NULL``.
- ``=`` is true iff both sides are in the same class and collate equal (``9 = '9'`` and
  ``1 = TRUE`` are false; ``[1] = [1.0]`` is true). ``!=`` is true iff both are non-null and
  ``=`` is false (so it is true across classes).
- ``< <= > >=`` are true only between two bools, two numbers, two strings or two bytes,
  following the collation; across classes, or on lists and objects, they are false.
- ``x IN (a, b)`` is ``x = a OR x = b`` (false for an empty list); ``x NOT IN (...)`` is
  exactly ``NOT (x IN (...))``, so true for a null ``x``. ``IS NULL`` is true for null,
  missing and NaN.

Order: ORDER BY sorts by the collation, nulls first in ASC and last in DESC, then by entity
id ascending; LIMIT applies after ordering. Without ORDER BY rows come in id order.
:func:`order_key` is the row's byte key (DESC columns byte-inverted), :func:`sort_rows` the
reference executor, an :class:`After` a keyset position in that order (paging).
"""

from mycelia.proto.query.evaluate import evaluate, holds
from mycelia.proto.query.execute import After, sort_rows
from mycelia.proto.query.keys import encode_key, invert_key, order_key, sort_key
from mycelia.proto.query.lexer import MAX_QUERY_LENGTH
from mycelia.proto.query.parser import MAX_DEPTH, parse
from mycelia.proto.query.query import MATCH_ALL, Query
from mycelia.proto.query.syntax import (
    And,
    Comparison,
    Const,
    FieldComparison,
    In,
    IsNull,
    Not,
    Op,
    Or,
    OrderKey,
    Placeholder,
    Predicate,
)
from mycelia.proto.query.values import Collation, Scalar, class_of, compare_values, resolve_path

__all__ = [
    "MATCH_ALL",
    "MAX_DEPTH",
    "MAX_QUERY_LENGTH",
    "After",
    "And",
    "Collation",
    "Comparison",
    "Const",
    "FieldComparison",
    "In",
    "IsNull",
    "Not",
    "Op",
    "Or",
    "OrderKey",
    "Placeholder",
    "Predicate",
    "Query",
    "Scalar",
    "class_of",
    "compare_values",
    "encode_key",
    "evaluate",
    "holds",
    "invert_key",
    "order_key",
    "parse",
    "resolve_path",
    "sort_key",
    "sort_rows",
]
