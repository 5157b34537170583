"""The query tokenizer: text in, a list of :class:`Token` out (ending with ``END``).

Invariants:

- It raises nothing but :class:`~mycelia.errors.QueryError`, whose ``column`` (1-based, in
  code points) points at the offending character; input longer than
  :data:`MAX_QUERY_LENGTH` is refused before any work.
- Keywords are case-insensitive whole words (``notes`` and ``order_id`` are fields) and are
  reserved: a field named like one must be double-quoted (``"order"``).
- Literals are decoded here and are already valid query literals: integers within 64 bits,
  finite floats, strings (``'..'`` with ``''`` or backslash escapes), bytes (``X'00ff'``).
  A ``-`` is only ever the sign of a number (there is no arithmetic).
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass
from typing import Final

from mycelia.errors import QueryError
from mycelia.proto.query.values import INT_MAX, INT_MIN, Scalar

__all__ = ["KEYWORDS", "MAX_QUERY_LENGTH", "Kind", "Token", "tokenize"]

MAX_QUERY_LENGTH: Final = 64 * 1024
"""Longest query text accepted, in characters."""

KEYWORDS: Final = frozenset(
    {"AND", "OR", "NOT", "IN", "IS", "NULL", "TRUE", "FALSE", "ORDER", "BY", "ASC", "DESC", "LIMIT"}
)
"""Reserved words (matched case-insensitively)."""

_SPACE: Final = frozenset(" \t\n\r\f\v")
_WORD: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER: Final = re.compile(r"-?([0-9]+)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_NUMBER_TAIL: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.")
_HEX: Final = frozenset("0123456789abcdefABCDEF")
_SIMPLE_ESCAPES: Final = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t", "r": "\r"}
_PUNCTUATION: Final = {"(": "LPAREN", ")": "RPAREN", ",": "COMMA", ".": "DOT", "?": "PLACEHOLDER"}


class Kind(enum.Enum):
    """What a token is."""

    WORD = "field name"
    QUOTED = "quoted field name"
    KEYWORD = "keyword"
    LITERAL = "value"
    PLACEHOLDER = "'?'"
    OP = "operator"
    LPAREN = "'('"
    RPAREN = "')'"
    COMMA = "','"
    DOT = "'.'"
    END = "end of query"


@dataclass(frozen=True, slots=True)
class Token:
    """One token: its kind, 1-based column and source text.

    ``name`` is the field name (``WORD``/``QUOTED``), the upper-cased keyword or the canonical
    operator symbol (``<>`` is ``!=``); ``value`` is the decoded literal of a ``LITERAL``.
    """

    kind: Kind
    column: int
    text: str = ""
    name: str = ""
    value: Scalar = None

    def describe(self) -> str:
        """The token for an error message."""
        if self.kind is Kind.END:
            return "the end of the query"
        text = self.text if len(self.text) <= 24 else self.text[:21] + "..."
        return repr(text)


def tokenize(text: str) -> list[Token]:
    """The tokens of ``text``, ending with one ``END`` token; raises QueryError."""
    if len(text) > MAX_QUERY_LENGTH:
        raise QueryError(
            f"query is longer than {MAX_QUERY_LENGTH} characters", column=MAX_QUERY_LENGTH + 1
        )
    tokens = []
    pos = 0
    while True:
        while pos < len(text) and text[pos] in _SPACE:
            pos += 1
        if pos == len(text):
            tokens.append(Token(Kind.END, pos + 1))
            return tokens
        token, pos = _next_token(text, pos)
        tokens.append(token)


def _next_token(text: str, pos: int) -> tuple[Token, int]:
    char = text[pos]
    if char in _PUNCTUATION:
        return Token(Kind[_PUNCTUATION[char]], pos + 1, char), pos + 1
    if char in "=!<>":
        return _operator(text, pos)
    if char == "'":
        value, end = _read_quoted(text, pos)
        return Token(Kind.LITERAL, pos + 1, text[pos:end], value=value), end
    if char == '"':
        name, end = _read_quoted(text, pos)
        return Token(Kind.QUOTED, pos + 1, text[pos:end], name=name), end
    if char.isascii() and (char.isdigit() or char == "-"):
        return _number(text, pos)
    match = _WORD.match(text, pos)
    if match is None:
        raise QueryError(f"unexpected character {char!r}", column=pos + 1)
    word, end = match.group(), match.end()
    if word in ("x", "X") and text.startswith("'", end):
        return _bytes_literal(text, pos)
    if word.upper() in KEYWORDS:
        return Token(Kind.KEYWORD, pos + 1, word, name=word.upper()), end
    return Token(Kind.WORD, pos + 1, word, name=word), end


def _operator(text: str, pos: int) -> tuple[Token, int]:
    pair = text[pos : pos + 2]
    if pair in ("!=", "<>", "<=", ">="):
        return Token(Kind.OP, pos + 1, pair, name="!=" if pair == "<>" else pair), pos + 2
    if text[pos] == "!":
        raise QueryError("'!' must be followed by '='", column=pos + 1)
    return Token(Kind.OP, pos + 1, text[pos], name=text[pos]), pos + 1


def _number(text: str, pos: int) -> tuple[Token, int]:
    match = _NUMBER.match(text, pos)
    if match is None:
        raise QueryError("'-' must be followed by a number", column=pos + 1)
    end = match.end()
    if end < len(text) and text[end] in _NUMBER_TAIL:
        raise QueryError("malformed number", column=pos + 1)
    source = match.group()
    value: int | float
    if match.group(2) is None and match.group(3) is None:
        # Bound the digits before int() (which refuses > 4300 digits with ValueError).
        value = int(source) if len(match.group(1)) <= 20 else INT_MAX + 1
        if not INT_MIN <= value <= INT_MAX:
            raise QueryError("integer is outside the 64-bit range", column=pos + 1)
    else:
        value = float(source)
        if not math.isfinite(value):
            raise QueryError("number is too large for a float", column=pos + 1)
    return Token(Kind.LITERAL, pos + 1, source, value=value), end


def _bytes_literal(text: str, pos: int) -> tuple[Token, int]:
    close = text.find("'", pos + 2)
    if close < 0:
        raise QueryError("unterminated bytes literal", column=pos + 1)
    digits = text[pos + 2 : close]
    for offset, char in enumerate(digits):
        if char not in _HEX:
            raise QueryError("bytes literals hold hex digits only", column=pos + 3 + offset)
    if len(digits) % 2:
        raise QueryError("bytes literal has an odd number of hex digits", column=pos + 1)
    value = bytes.fromhex(digits)
    return Token(Kind.LITERAL, pos + 1, text[pos : close + 1], value=value), close + 1


def _read_quoted(text: str, pos: int) -> tuple[str, int]:
    """Decode the quoted text opening at ``text[pos]``: its content and the index after it.

    The quote is doubled or backslash-escaped inside; other escapes are ``\\\\ \\' \\" \\n \\t
    \\r \\uXXXX \\UXXXXXXXX``.
    """
    quote = text[pos]
    out: list[str] = []
    i = pos + 1
    while i < len(text):
        char = text[i]
        if char == quote:
            if text.startswith(quote, i + 1):
                out.append(quote)
                i += 2
                continue
            return "".join(out), i + 1
        if char == "\\":
            decoded, i = _escape(text, i)
            out.append(decoded)
            continue
        out.append(char)
        i += 1
    what = "string" if quote == "'" else "quoted field name"
    raise QueryError(f"unterminated {what}", column=pos + 1)


def _escape(text: str, pos: int) -> tuple[str, int]:
    code = text[pos + 1 : pos + 2]
    if not code:
        raise QueryError("unterminated escape at the end of the query", column=pos + 1)
    if code in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[code], pos + 2
    width = {"u": 4, "U": 8}.get(code)
    if width is None:
        raise QueryError(f"unknown escape '\\{code}'", column=pos + 1)
    digits = text[pos + 2 : pos + 2 + width]
    if len(digits) != width or not _HEX.issuperset(digits):
        raise QueryError(f"'\\{code}' needs {width} hex digits", column=pos + 1)
    point = int(digits, 16)
    if point > 0x10FFFF:
        raise QueryError("escape is beyond the last code point U+10FFFF", column=pos + 1)
    return chr(point), pos + 2 + width
