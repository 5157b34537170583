"""The engine's array parameters (storage/postgres_arrays.py) read back as PostgreSQL's own
arrays, element for element: bytes, text (any Unicode), bigints at both ends, NULLs and
empty arrays."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mycelia.storage.postgres_arrays import Bigints, Bytea, Texts, register

pytestmark = pytest.mark.postgres

texts = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"))


@settings(max_examples=50, deadline=None)
@given(
    blobs=st.lists(st.binary() | st.none(), max_size=5),
    words=st.lists(texts | st.none(), max_size=5),
    numbers=st.lists(st.integers(-(2**63), 2**63 - 1) | st.none(), max_size=5),
)
def test_wrapped_columns_read_back_as_the_lists_they_wrap(
    pg_dsn: str, blobs: list[bytes | None], words: list[str | None], numbers: list[int | None]
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        register(conn)
        row = conn.execute(
            "SELECT %b::bytea[], %b::text[], %b::bigint[], %s::text[]",
            (Bytea(blobs), Texts(words), Bigints(numbers), Texts(words)),
        ).fetchone()
        plain = conn.execute(
            "SELECT %b::bytea[], %b::text[], %b::bigint[]", (blobs, words, numbers)
        ).fetchone()
    assert row is not None
    assert row == (blobs, words, numbers, words)
    assert row[:3] == plain  # the same arrays psycopg's own dumper sends


def test_a_wrapped_column_unnests_like_a_plain_one(pg_dsn: str) -> None:
    query = "SELECT * FROM unnest(%b::bytea[], %b::text[], %b::bigint[]) AS t(b, w, n)"
    columns: list[Any] = [[b"a", None, b""], ["x", "ü€😀", None], [1, -(2**63), None]]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        register(conn)
        wrapped = conn.execute(query, [Bytea(columns[0]), Texts(columns[1]), Bigints(columns[2])])
        plain = conn.execute(query, columns)
        assert wrapped.fetchall() == plain.fetchall()
