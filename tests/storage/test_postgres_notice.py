"""The feed's NOTIFY payload (storage/postgres_notice.py): a write's rows when they fit,
and nothing but a wake-up otherwise or when it does not parse."""

from __future__ import annotations

import os

from hypothesis import given
from hypothesis import strategies as st

from mycelia.proto import Clock, EntityId, EventId
from mycelia.storage.engine import FeedEntry
from mycelia.storage.postgres_notice import NOTICE_BYTES, notice, parse_notice

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.\-]{0,20}", fullmatch=True)
ids = st.binary(min_size=32, max_size=32)
rows = st.lists(st.tuples(ids, names, st.lists(ids, min_size=1, max_size=3, unique=True)))


@given(last=st.integers(0, 2**63 - 1), rows=rows)
def test_a_payload_says_the_rows_of_its_write_ending_at_its_offset(
    last: int, rows: list[tuple[bytes, str, list[bytes]]]
) -> None:
    written = [(e, c, b"".join(sorted(h))) for e, c, h in rows]
    said = parse_notice(f"{last} {notice('w1', written)}")
    assert said is not None
    assert (said.last, said.writer) == (last, "w1")
    expected = tuple(
        FeedEntry(last - len(rows) + 1 + i, EntityId(e), c, Clock(EventId(x) for x in h))
        for i, (e, c, h) in enumerate(rows)
    )
    assert said.rows == (expected or None)


def test_a_write_too_big_to_say_notifies_its_offset_alone() -> None:
    many = [(os.urandom(32), "cards", os.urandom(32)) for _ in range(100)]
    payload = f"{2**63 - 1} {notice('w1', many)}"
    assert len(payload) <= NOTICE_BYTES
    said = parse_notice(payload)
    assert said is not None
    assert (said.last, said.writer, said.rows) == (2**63 - 1, "w1", None)


def test_a_payload_that_does_not_parse_gives_no_rows() -> None:
    entity, head = "A" * 43 + "=", "B" * 43 + "="
    assert parse_notice("x w1") is None, "no offset: only a wake-up"
    older = parse_notice("7 w0")  # an engine that says no rows
    assert older is not None
    assert (older.last, older.writer, older.rows) == (7, "w0", None)
    for bad in (
        f"cards/{entity}",  # a field short
        f"no spaces!/{entity}/{head}",  # not a name
        f"cards/{entity[:-4]}/{head}",  # not an id
        f"cards/{entity}/{head[:-4]}",  # a head that is no run of ids
        f"cards/{entity}/",  # an empty head
        f"cards/{entity}/{head};",  # an empty row
        f"cards/{entity}/%%%",  # not base64
    ):
        said = parse_notice(f"7 w1 {bad}")
        assert said is not None
        assert said.rows is None, bad
        assert (said.last, said.writer) == (7, "w1")
