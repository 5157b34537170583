"""The PostgreSQL engine's schema, statements and row codecs (ARCHITECTURE.md §6, §8).

Pure data and functions; :mod:`mycelia.storage.postgres` (whose docstring describes the
schema) runs them. Invariants:

- Migration *n* (1-based, :data:`MIGRATIONS`) brings the schema from version n-1 to n;
  :data:`SCHEMA_VERSION` is the newest. Version 2 added ``field_keys``, whose data step
  (indexing every stored state) the engine runs in the migration's transaction; version 3
  added ``node_keys`` (node keys kept per node name, for servers that keep nothing on disk).
- Every value reaches the server as a query parameter, never inside SQL text; the
  statements only take the schema name, quoted as an identifier.
- :func:`state_rows` encodes a whole batch before any I/O, so a bad state fails alone.
- :func:`sorted_states` is ``sort_rows`` over candidate rows; :func:`matching` filters rows
  that already come in the query's order; :func:`merge_rows` merges the *long* entries
  (value keys over :data:`MAX_INDEXED_KEY`, stored as NULL) into a walk, in its order.
"""

from __future__ import annotations

import base64
import json
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, TypeVar

from mycelia.entity import stored_merge
from mycelia.errors import DecodeError, StorageCorrupt, StorageError
from mycelia.proto import AdmittedEvent, Clock, EntityId, EntityState, Event, EventId
from mycelia.proto.ids import shared_event_id
from mycelia.proto.query import After, Query, encode_key, evaluate, invert_key, sort_rows
from mycelia.retrieval import StoredState, WriteBatch
from mycelia.storage.engine import STORED_LIMITS, decode_values, encode_values
from mycelia.storage.plan import IndexPlan, index_entries
from mycelia.storage.postgres_arrays import Bytea, Texts

__all__ = [
    "FIELD_KEYS_VERSION",
    "MAX_INDEXED_KEY",
    "MIGRATIONS",
    "QUERIES",
    "SCHEMA_VERSION",
    "StateRow",
    "admitted",
    "clock",
    "decode_state",
    "from_position",
    "jsonable",
    "key_columns",
    "long_rows",
    "matching",
    "merge_rows",
    "sorted_states",
    "state_row",
    "state_rows",
]

StateRow = tuple[bytes, str, bytes, bytes, str, bytes, dict[str, bytes]]
"""(entity, collection, state, values msgpack, values JSON, head, index entries)."""
_V1: Final = """
CREATE TABLE {s}.events (id bytea PRIMARY KEY, entity_id bytea NOT NULL,
    generation bigint NOT NULL, parents bytea NOT NULL, body bytea NOT NULL);
CREATE INDEX events_by_entity ON {s}.events (entity_id, generation, id);
CREATE TABLE {s}.states (entity_id bytea PRIMARY KEY, collection text NOT NULL,
    state bytea NOT NULL, values_raw bytea NOT NULL, "values" jsonb NOT NULL);
CREATE INDEX states_by_collection ON {s}.states (collection, entity_id);
CREATE TABLE {s}.feed ("offset" bigint PRIMARY KEY, entity_id bytea NOT NULL,
    collection text NOT NULL, head bytea NOT NULL);
CREATE TABLE {s}.feed_clock (id int PRIMARY KEY CHECK (id = 1), last bigint NOT NULL);
INSERT INTO {s}.feed_clock VALUES (1, 0);
CREATE TABLE {s}.meta (key text PRIMARY KEY, value bytea NOT NULL)
"""
_V2: Final = """
CREATE TABLE {s}.field_keys (entity_id bytea NOT NULL, field bytea NOT NULL,
    collection text NOT NULL, key bytea, PRIMARY KEY (entity_id, field));
CREATE INDEX field_keys_by_key ON {s}.field_keys (collection, field, key, entity_id)
"""
_V3: Final = """
CREATE TABLE IF NOT EXISTS {s}.node_keys (name text PRIMARY KEY, key bytea NOT NULL)
"""
_V4_HEAD: Final = "ALTER TABLE {s}.states ADD COLUMN IF NOT EXISTS head bytea"
_V4_WRITE: Final = """CREATE OR REPLACE FUNCTION {s}.write_batch(
    e_ids bytea[], e_ents bytea[], e_gens bigint[], e_parents bytea[], e_bodies bytea[],
    s_ents bytea[], s_cols text[], s_states bytea[], s_raws bytea[], s_vals text[],
    s_heads bytea[], s_bases bytea[],
    k_ents bytea[], k_fields bytea[], k_cols text[], k_keys bytea[],
    channel text, writer text, OUT new_ids bytea[], OUT last bigint)
LANGUAGE plpgsql AS $write$
DECLARE
    placed bigint;
BEGIN
    WITH added AS (INSERT INTO {s}.events (id, entity_id, generation, parents, body)
            SELECT * FROM unnest(e_ids, e_ents, e_gens, e_parents, e_bodies)
            ON CONFLICT (id) DO NOTHING RETURNING id)
    SELECT array_agg(id) INTO new_ids FROM added;
    WITH t AS (SELECT * FROM unnest(s_ents, s_cols, s_states, s_raws, s_vals, s_heads, s_bases)
            AS t(e, c, st, r, j, h, b)),
        updated AS (UPDATE {s}.states AS s SET state = t.st, values_raw = t.r,
                "values" = t.j::jsonb, head = t.h
            FROM t WHERE s.entity_id = t.e AND t.b <> '' AND s.head = t.b RETURNING 1),
        inserted AS (INSERT INTO {s}.states (entity_id, collection, state, values_raw,
                "values", head)
            SELECT e, c, st, r, j::jsonb, h FROM t WHERE t.b = ''
            ON CONFLICT (entity_id) DO NOTHING RETURNING 1)
    SELECT (SELECT count(*) FROM updated) + (SELECT count(*) FROM inserted) INTO placed;
    IF placed <> cardinality(s_ents) THEN
        RAISE EXCEPTION USING ERRCODE = 'MYC01', MESSAGE = 'a stored head moved';
    END IF;
    DELETE FROM {s}.field_keys WHERE entity_id = ANY(s_ents);
    INSERT INTO {s}.field_keys (entity_id, field, collection, key)
        SELECT * FROM unnest(k_ents, k_fields, k_cols, k_keys);
    UPDATE {s}.feed_clock SET last = feed_clock.last + cardinality(s_ents) WHERE id = 1
        RETURNING feed_clock.last INTO last;
    INSERT INTO {s}.feed ("offset", entity_id, collection, head)
        SELECT last - cardinality(s_ents) + r.n, r.e, r.c, r.h
        FROM unnest(s_ents, s_cols, s_heads) WITH ORDINALITY AS r(e, c, h, n);
    PERFORM pg_notify(channel, last::text || ' ' || writer);
END
$write$"""
_V5_WRITE: Final = _V4_WRITE.replace(
    "    UPDATE {s}.feed_clock SET last",
    """    PERFORM pg_advisory_xact_lock(7174499, (SELECT tableoid::int FROM {s}.feed_clock));
    UPDATE {s}.feed_clock SET last""",
)
"""``write_batch`` queueing for the feed lock (the ``feed_lock`` statement) just before
the feed clock's row."""
_V6: Final = (
    "COMMENT ON COLUMN {s}.states.state IS 'EntityState.to_stored(): a text buffer may be "
    "its parts (schema version 6)'"
)
MIGRATIONS: Final = (
    tuple(_V1.split(";")),
    tuple(_V2.split(";")),
    (_V3,),
    (_V4_HEAD, _V4_WRITE),
    (_V5_WRITE,),
    (_V6,),
)
"""Migration *n* (1-based) brings the schema from version n-1 to n: its statements, in
order. Version 4 added the states' ``head`` column (NULL until the state is written again)
and ``write_batch``, a whole write in one statement (see ``write_batch`` below); version 5
has ``write_batch`` queue for the feed lock (``feed_lock`` below); version 6 lets a text
state's buffer be stored as its parts (:meth:`~mycelia.proto.EntityState.to_stored`), which
an older engine cannot read: the version makes it refuse the database instead."""
HEAD_MOVED: Final = "MYC01"
"""The SQLSTATE ``write_batch`` raises when a stored head is not the batch's base."""
SCHEMA_VERSION: Final = len(MIGRATIONS)
FIELD_KEYS_VERSION: Final = 2
"""The migration that added ``field_keys`` (the engine then indexes every stored state)."""

_STATEMENTS: Final = {
    "insert_events": """INSERT INTO {s}.events (id, entity_id, generation, parents, body)
        SELECT * FROM unnest(%b::bytea[], %b::bytea[], %b::bigint[], %b::bytea[], %b::bytea[])
        ON CONFLICT (id) DO NOTHING RETURNING id""",
    "insert_new_states": """INSERT INTO {s}.states (entity_id, collection, state, values_raw,
            "values", head)
        SELECT e, c, st, r, j::jsonb, h FROM unnest(%b::bytea[], %s::text[], %b::bytea[],
            %b::bytea[], %s::text[], %b::bytea[]) AS t(e, c, st, r, j, h)
        ON CONFLICT (entity_id) DO NOTHING RETURNING entity_id""",
    "lock_states": """SELECT entity_id, state FROM {s}.states WHERE entity_id = ANY(%b::bytea[])
        ORDER BY entity_id FOR UPDATE""",
    "node_key_put": """INSERT INTO {s}.node_keys (name, key) VALUES (%s, %b)
        ON CONFLICT (name) DO NOTHING""",
    "node_key": "SELECT key FROM {s}.node_keys WHERE name = %s",
    "upsert_states": """INSERT INTO {s}.states (entity_id, collection, state, values_raw,
            "values", head)
        SELECT e, c, st, r, j::jsonb, h FROM unnest(%b::bytea[], %s::text[], %b::bytea[],
            %b::bytea[], %s::text[], %b::bytea[]) AS t(e, c, st, r, j, h)
        ON CONFLICT (entity_id) DO UPDATE SET state = excluded.state,
            values_raw = excluded.values_raw, "values" = excluded."values",
            head = excluded.head""",
    "write_batch": """SELECT new_ids, last FROM {s}.write_batch(%b::bytea[], %b::bytea[],
            %b::bigint[], %b::bytea[], %b::bytea[], %b::bytea[], %s::text[], %b::bytea[],
            %b::bytea[], %s::text[], %b::bytea[], %b::bytea[], %b::bytea[], %b::bytea[],
            %s::text[], %b::bytea[], %s, %s)""",
    "append_feed": """WITH clock AS (
            UPDATE {s}.feed_clock SET last = last + cardinality(%(e)b::bytea[]) WHERE id = 1
            RETURNING last),
        added AS (INSERT INTO {s}.feed ("offset", entity_id, collection, head)
            SELECT clock.last - cardinality(%(e)b::bytea[]) + r.n, r.e, r.c, r.h
            FROM clock, unnest(%(e)b::bytea[], %(c)s::text[], %(h)b::bytea[])
                WITH ORDINALITY AS r(e, c, h, n))
        SELECT last, pg_notify(%(channel)s, last::text || ' ' || %(writer)s) FROM clock""",
    "delete_keys": "DELETE FROM {s}.field_keys WHERE entity_id = ANY(%b::bytea[])",
    "insert_keys": """INSERT INTO {s}.field_keys (entity_id, field, collection, key)
        SELECT * FROM unnest(%b::bytea[], %b::bytea[], %s::text[], %b::bytea[])""",
    "all_values": "SELECT entity_id, collection, values_raw FROM {s}.states",
    "put_meta": """INSERT INTO {s}.meta (key, value) SELECT * FROM unnest(%s::text[], %b::bytea[])
        ON CONFLICT (key) DO UPDATE SET value = excluded.value""",
    "delete_meta": "DELETE FROM {s}.meta WHERE key = ANY(%s::text[])",
    "forget": """WITH e AS (DELETE FROM {s}.events WHERE entity_id = ANY(%(ids)b::bytea[])),
            k AS (DELETE FROM {s}.field_keys WHERE entity_id = ANY(%(ids)b::bytea[]))
        DELETE FROM {s}.states WHERE entity_id = ANY(%(ids)b::bytea[])""",
    "scan_meta": """SELECT key, value FROM {s}.meta
        WHERE left(key, length(%(prefix)s)) = %(prefix)s ORDER BY key COLLATE "C" """,
    "events": "SELECT id, generation, body FROM {s}.events WHERE id = ANY(%b::bytea[])",
    "ahead": """WITH RECURSIVE walk(id) AS (
            SELECT unnest(%(ids)b::bytea[])
          UNION
            SELECT substring(e.parents FROM i * 32 + 1 FOR 32)
            FROM walk JOIN {s}.events e ON e.id = walk.id,
                generate_series(0, length(e.parents) / 32 - 1) AS i)
        SELECT e.id, e.generation, e.body
        FROM (SELECT id FROM walk LIMIT %(n)s) w JOIN {s}.events e ON e.id = w.id""",
    "stored": "SELECT 1 FROM {s}.events WHERE id = %b",
    "recent": """SELECT id, generation, body FROM {s}.events
        WHERE entity_id = %(entity)b AND generation >= %(floor)s
        ORDER BY generation DESC, id LIMIT %(n)s""",
    "events_of": """SELECT id, generation, body FROM {s}.events WHERE entity_id = %b
        ORDER BY generation, id""",
    "state": "SELECT state FROM {s}.states WHERE entity_id = %b",
    "states": "SELECT state FROM {s}.states WHERE entity_id = ANY(%b::bytea[])",
    "stored_state": "SELECT state, values_raw FROM {s}.states WHERE entity_id = %b",
    "scan": """SELECT state, values_raw FROM {s}.states WHERE collection = %s
        ORDER BY entity_id""",
    "rows": """SELECT entity_id, NULL::bytea, state, values_raw FROM {s}.states
        WHERE collection = %s""",
    "rows_after": """SELECT entity_id, NULL::bytea, state, values_raw FROM {s}.states
        WHERE collection = %s AND entity_id > %s ORDER BY entity_id""",
    "feed": """SELECT "offset", entity_id, collection, head FROM {s}.feed
        WHERE "offset" > %s ORDER BY "offset" LIMIT %s""",
    # The batch's rows, then each event their heads name once (rows of one entity in a
    # run share most of their heads: joined per row, a 1,000-row batch over a few busy
    # entities fetched and decoded 30,000 events, 170 MiB, for about 1,000 distinct).
    "feed_heads": """WITH f AS (SELECT "offset", entity_id, collection, head FROM {s}.feed
            WHERE "offset" > %s ORDER BY "offset" LIMIT %s),
        ids AS (SELECT DISTINCT substring(f.head FROM i * 32 + 1 FOR 32) AS id
            FROM f, generate_series(0, length(f.head) / 32 - 1) AS i
            WHERE %s::text[] IS NULL OR f.collection = ANY(%s::text[]))
        SELECT "offset", entity_id, collection, head, NULL::bytea, NULL::bigint, NULL::bytea
        FROM f
        UNION ALL
        SELECT NULL, NULL, NULL, NULL, e.id, e.generation, e.body
        FROM ids JOIN {s}.events e ON e.id = ids.id
        ORDER BY 1""",
    "last": "SELECT last FROM {s}.feed_clock",
    "lock_clock": "SELECT last FROM {s}.feed_clock WHERE id = 1 FOR UPDATE",
    # The lock a writer takes just before the feed clock's row, held to its commit:
    # writers queue for it one by one. Waiting on the row itself, every waiter wakes at
    # each commit and all but one wait again (24 writers, three servers' pools, cost
    # PostgreSQL twice the CPU per commit of 8; queued, less than 8 did). Its key is the
    # schema's feed clock table (its oid, in a class of its own: 7174499 is "myc").
    "feed_lock": """SELECT pg_advisory_xact_lock(7174499,
        (SELECT tableoid::int FROM {s}.feed_clock))""",
    "meta": "SELECT value FROM {s}.meta WHERE key = %s",
    "all_meta": "SELECT key, value FROM {s}.meta ORDER BY key",
    "entities": """SELECT entity_id FROM (
            (SELECT DISTINCT entity_id FROM {s}.events WHERE entity_id > %(after)b
                ORDER BY entity_id LIMIT %(n)s)
          UNION
            (SELECT entity_id FROM {s}.states WHERE entity_id > %(after)b
                ORDER BY entity_id LIMIT %(n)s)) u ORDER BY entity_id LIMIT %(n)s""",
}
_CANDIDATES: Final = """SELECT s.entity_id, i.key, s.state, s.values_raw
    FROM {s}.field_keys i JOIN {s}.states s ON s.entity_id = i.entity_id
    WHERE i.collection = %s AND i.field = %b AND """
_SPANS: Final = {
    "points": "i.key = ANY(%b::bytea[])",
    "range": "i.key >= %b AND i.key < %b",
    "long": "i.key IS NULL",
}
_ORDERS: Final = {
    "": "",
    "asc": " ORDER BY i.key, i.entity_id",
    "desc": " ORDER BY i.key DESC, i.entity_id",
}
_FROM: Final = {
    "asc": " AND (i.key, i.entity_id) > (%b, %b)",
    "desc": " AND (i.key < %b OR (i.key = %b AND i.entity_id > %b))",
}
QUERIES: Final = (
    _STATEMENTS
    | {
        f"{span}_{order}": _CANDIDATES + where + by
        for span, where in _SPANS.items()
        for order, by in _ORDERS.items()
    }
    | {
        f"{span}_{order}_from": _CANDIDATES + _SPANS[span] + start + _ORDERS[order]
        for span in ("points", "range")
        for order, start in _FROM.items()
    }
)
"""Every statement by name, ``{s}`` standing for the schema; ``points_*``, ``range_*`` and
``long_*`` read ``fetch`` candidates (entity id, key, state, values msgpack) unordered,
``asc`` or ``desc``; ``*_from`` ones from a keyset position on (its value key and id,
the key twice for ``desc``: :func:`from_position`)."""
MAX_INDEXED_KEY: Final = 1024
"""Longest value key stored in ``field_keys.key`` (a btree entry must fit a third of a
page); longer ones are stored as NULL — a *long* entry, read and merged in by ``fetch``."""

_Row = TypeVar("_Row", bound=Sequence[Any])


def jsonable(value: object) -> object:
    """The JSONB projection of a value (see :mod:`mycelia.storage.postgres`)."""
    if isinstance(value, str):
        return value.replace("\0", "\ufffd")
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode()}
    if isinstance(value, float) and not math.isfinite(value):
        return {"$float": str(value)}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k).replace("\0", "\ufffd"): jsonable(v) for k, v in value.items()}
    return value


def admitted(row: Sequence[Any]) -> AdmittedEvent:
    """Decode an (id, generation, body) row, re-hashing it; raises StorageCorrupt."""
    event_id, generation, body = row
    try:
        event = Event.from_bytes(body, limits=STORED_LIMITS, expect_id=EventId._trusted(event_id))
    except DecodeError as exc:
        raise StorageCorrupt(f"stored event {bytes(event_id).hex()} is damaged: {exc}") from exc
    return AdmittedEvent(event, generation)


def decode_state(raw: bytes) -> EntityState:
    """Decode a stored state; raises StorageCorrupt."""
    try:
        return EntityState.from_bytes(raw, limits=STORED_LIMITS, merge=stored_merge)
    except DecodeError as exc:
        raise StorageCorrupt(f"a stored state is damaged: {exc}") from exc


def long_rows(rows: Sequence[Sequence[Any]], plan: IndexPlan) -> list[tuple[Any, ...]]:
    """The long entries' (entity id, key, state, values msgpack) rows whose value key
    (recomputed from the values) the plan covers, key filled in, in walk order."""
    found = []
    for entity_id, _, state, raw in rows:
        key = encode_key(decode_values(raw).get(plan.field))
        if plan.covers(key):
            found.append((entity_id, key, state, raw))
    return sorted(found, key=lambda row: plan.walk_key(row[1], bytes(row[0])))


def merge_rows(
    rows: Sequence[Sequence[Any]], pending: deque[tuple[Any, ...]], plan: IndexPlan
) -> list[Sequence[Any]]:
    """``rows`` (in walk order) with the ``pending`` rows that come before each of them,
    taken off ``pending``; the result is in walk order."""
    merged: list[Sequence[Any]] = []
    for row in rows:
        order = plan.walk_key(row[1], bytes(row[0]))
        while pending and plan.walk_key(pending[0][1], bytes(pending[0][0])) < order:
            merged.append(pending.popleft())
        merged.append(row)
    return merged


def rows_after(rows: Iterable[_Row], after: bytes | None) -> list[_Row]:
    """The (entity id, ...) rows whose id sorts after ``after`` (all of them without it)."""
    return list(rows) if after is None else [row for row in rows if bytes(row[0]) > after]


def from_position(plan: IndexPlan, after: After) -> tuple[bytes, ...]:
    """The parameters a ``*_from`` statement of an ordered ``plan`` takes for ``after``
    (whose key is the walk's, so a descending plan's is inverted)."""
    if plan.descending:
        key = invert_key(after.key)
        return key, key, after.entity_id
    return after.key, after.entity_id


def sorted_states(
    rows: Sequence[Sequence[Any]], query: Query, after: After | None = None
) -> list[StoredState]:
    """``sort_rows`` over (entity id, key, state, values msgpack) rows (those after the
    position ``after``), states decoded last."""
    states = {EntityId._trusted(bytes(e)): st for e, _, st, _ in rows}
    values = ((EntityId._trusted(bytes(e)), decode_values(raw)) for e, _, _, raw in rows)
    ordered = sort_rows(values, query, after=after)  # (values decoded as ranked, then let go)
    return [StoredState(decode_state(states[e]), v) for e, v in ordered]


def matching(rows: Sequence[Sequence[Any]], query: Query, wanted: int) -> list[StoredState]:
    """The first ``wanted`` rows (entity id, key, state, values msgpack) matching ``query``."""
    found = []
    for _, _, state, raw in rows:
        values = decode_values(raw)
        if evaluate(query.predicate, values):
            found.append(StoredState(decode_state(state), values))
            if len(found) == wanted:
                break
    return found


def clock(head: bytes) -> Clock:
    """A clock from its concatenated 32-byte ids."""
    return Clock(shared_event_id(head[i : i + 32]) for i in range(0, len(head), 32))


def key_columns(
    states: Sequence[tuple[bytes, str, Mapping[str, bytes]]],
) -> tuple[Bytea, Bytea, Texts, Bytea]:
    """``insert_keys`` parameters from (entity, collection, index entries) per state."""
    columns = (Bytea(), Bytea(), Texts(), Bytea())
    for entity, collection, entries in states:
        for field, key in entries.items():
            columns[0].append(bytes(entity))
            columns[1].append(field.encode("utf-8", "surrogatepass"))
            columns[2].append(collection)
            columns[3].append(key if key and len(key) <= MAX_INDEXED_KEY else None)
    return columns


def state_rows(batch: WriteBatch) -> list[StateRow]:
    """(entity, collection, state, values msgpack, values JSON, head, index entries) per
    state; raises StorageError if a state cannot be stored."""
    return [state_row(stored) for stored in batch.states]


def state_row(stored: StoredState) -> StateRow:
    """One state's row (see :func:`state_rows`); raises StorageError if it cannot be stored."""
    state = stored.state
    if not isinstance(state, EntityState):
        raise StorageError("a write batch holds something that is not a state")
    raw = encode_values(stored.values)
    projection = json.dumps(jsonable(stored.values), ensure_ascii=False, allow_nan=False)
    head = b"".join(state.state.head.ids)
    entity = bytes(state.entity_id)
    entries = index_entries(stored.values, longest=MAX_INDEXED_KEY)
    return (entity, state.collection, state.to_stored(), raw, projection, head, entries)
