"""The feed's NOTIFY payload (storage/postgres_notice.py): a write's rows when they fit,
and nothing but a wake-up otherwise or when it does not parse."""

from __future__ import annotations

import os

from hypothesis import given
from hypothesis import strategies as st

from mycelia.proto import Clock, EntityId, EventId
from mycelia.storage.engine import FeedEntry
from mycelia.storage.postgres_notice import NOTICE_BYTES, notice, parse_notice
from mycelia.storage.testing import History

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


def test_a_payload_says_the_events_its_rows_heads_name_when_they_fit() -> None:
    h = History.make()
    rows = [(bytes(h.entity_id), "items", bytes(h.c.id))]
    said = parse_notice(f"9 {notice('w1', rows, [h.a, h.c])}")  # a is no head: left out
    assert said is not None
    assert said.rows is not None
    assert [(e.id, e.generation, e.to_bytes()) for e in said.events] == [
        (h.c.id, h.c.generation, h.c.to_bytes())
    ]
    own = parse_notice(f"9 {notice('w1', rows, [h.a, h.c])}", own="w1")
    assert own is not None
    assert (own.rows, own.events) == (said.rows, ()), "its own write's events: not decoded"
    one_row = len(notice("w1", rows)) - len("w1 ") + 1  # with its separator
    room = NOTICE_BYTES - 20 - len("w1 ") - 1
    full = [(os.urandom(32), "items", bytes(h.c.id)) for _ in range(room // one_row)]
    payload = f"{2**63 - 1} {notice('w1', full, [h.c])}"  # the rows fill it: no event fits
    assert len(payload) <= NOTICE_BYTES
    only_rows = parse_notice(payload)
    assert only_rows is not None
    assert only_rows.rows is not None
    assert len(only_rows.rows) == len(full)
    assert only_rows.events == ()


def test_events_that_do_not_decode_are_dropped_and_the_rows_kept() -> None:
    h = History.make()
    rows = [(bytes(h.entity_id), "items", bytes(h.c.id))]
    good = notice("w1", rows, [h.c])
    body = good.rsplit("/", 1)[1]
    for bad in (f"0/{body}", f"x/{body}", "3/AAAA", f"3/{body[:-8]}"):
        said = parse_notice(f"9 {good.rsplit(' ', 1)[0]} {bad}")
        assert said is not None
        assert said.rows is not None, bad
        assert said.events == (), bad
