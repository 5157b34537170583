"""The storage conformance suite, as library code (ARCHITECTURE.md §6, STYLE.md §16).

Every engine runs the same checks; so can a user's own engine::

    await check_engine(fresh, reopen=reopen)

``fresh()`` returns a new, opened, empty engine; ``reopen(engine)`` (durable engines only)
closes ``engine`` and returns a new engine over the same data. Each check opens its own
engine and closes it. :data:`CHECKS` names them one by one, so a test suite can run them
as separate tests; :func:`check_engine` runs them all. A failed check raises
AssertionError saying what the engine got wrong.

What the checks pin (the contract of :mod:`mycelia.storage.engine`): idempotent adds (a
re-added event is not new), events by id and by entity (parents first), ``get_state``
is None for an unknown entity, atomic batches (a batch failing mid-way leaves nothing),
feed offsets that strictly increase and never skip a committed batch (under concurrent
writers too), the feed wake-up, meta round trips and deletion, read-ahead that returns
only real ancestors, dump/load round trips, persistence across a reopen, errors after
``close``, and ``fetch`` returning exactly ``sort_rows`` over ``scan`` after updates and
tombstones (:mod:`mycelia.storage.testing_queries`).

:func:`agreement_machine` builds the differential hypothesis state machine
(:class:`EngineAgreement`, in :mod:`mycelia.storage.testing_agreement`) that drives several
engines in lockstep with random batches and random queries, and checks they agree after
every step. The module needs hypothesis.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

from mycelia.errors import StorageError
from mycelia.proto import Clock
from mycelia.proto.query import parse
from mycelia.retrieval import StoredState, WriteBatch
from mycelia.storage.engine import DumpRecord, EntityRecord, MetaRecord, StorageEngine
from mycelia.storage.testing_agreement import EngineAgreement, agreement_machine
from mycelia.storage.testing_data import (
    History,
    engine_content,
    event_key,
    genesis,
    state_key,
    state_of,
    update,
)
from mycelia.storage.testing_load import check_load_all_or_nothing
from mycelia.storage.testing_queries import check_fetch_on

__all__ = [
    "CHECKS",
    "Check",
    "EngineAgreement",
    "EngineSpec",
    "History",
    "agreement_machine",
    "check_engine",
    "engine_content",
    "genesis",
    "state_of",
    "update",
]

T = TypeVar("T")
Fresh = Callable[[], Awaitable[StorageEngine]]
Reopen = Callable[[StorageEngine], Awaitable[StorageEngine]]


@dataclass(frozen=True)
class EngineSpec:
    """How to get engines of one kind: fresh ones, and (if durable) a reopened one."""

    name: str
    fresh: Fresh
    reopen: Reopen | None = None


Check = Callable[[EngineSpec], Awaitable[None]]


async def _with_engine(spec: EngineSpec, body: Callable[[StorageEngine], Awaitable[None]]) -> None:
    engine = await spec.fresh()
    try:
        await body(engine)
    finally:
        await engine.close()


# ---------------------------------------------------------------- the checks


async def check_idempotent_add(spec: EngineSpec) -> None:
    """Re-adding an event reports it as not new; a partly known batch reports the rest."""

    async def body(engine: StorageEngine) -> None:
        h = History.make()
        first = await engine.write(WriteBatch(events=(h.g, h.a, h.a)))
        assert first.new_events == {h.g.id, h.a.id}, f"{spec.name}: first add not all new"
        again = await engine.write(WriteBatch(events=(h.g, h.a)))
        assert again.new_events == frozenset(), f"{spec.name}: re-added events reported new"
        mixed = await engine.write(WriteBatch(events=(h.a, h.b, h.c)))
        assert mixed.new_events == {h.b.id, h.c.id}, f"{spec.name}: wrong new set"
        assert first.offsets == again.offsets == (), f"{spec.name}: no state, no feed row"

    await _with_engine(spec, body)


async def check_events_by_id_and_entity(spec: EngineSpec) -> None:
    """Events come back byte-identical with their generation, by id and parents first."""

    async def body(engine: StorageEngine) -> None:
        h, other = History.make(n=1), History.make("others", n=2)
        await engine.write(WriteBatch(events=(*reversed(h.events), other.g)))
        unknown = genesis(n=99).id
        found = await engine.get_events([h.m.id, h.g.id, unknown])
        assert set(found) == {h.m.id, h.g.id}, f"{spec.name}: wrong ids found"
        assert event_key(found[h.m.id]) == event_key(h.m), f"{spec.name}: event changed in storage"
        assert await engine.event_stored(h.c.id), f"{spec.name}: stored event not stored"
        assert not await engine.event_stored(unknown), f"{spec.name}: unknown event stored"
        got = [event_key(e) for e in await engine.events_of(h.entity_id)]
        assert got == [event_key(e) for e in h.events], f"{spec.name}: events_of not parents first"
        assert await engine.events_of(genesis(n=98).entity_id) == [], f"{spec.name}: unknown"
        assert await engine.get_state(h.entity_id) is None, f"{spec.name}: state from nowhere"

    await _with_engine(spec, body)


async def check_states(spec: EngineSpec) -> None:
    """States round trip with their values; unknown ones are None; scan is per collection."""

    async def body(engine: StorageEngine) -> None:
        h, other = History.make(n=1), History.make("others", n=2)
        values = {"n": 2**62, "s": "é\0x", "b": b"\0", "f": -1.5, "z": None, "j": {"k": [1.0]}}
        first = (state_of([h.a], {"n": 1}), state_of([other.g]))
        await engine.write(WriteBatch((*h.events,), first))
        # Values arrive as any mapping (the applier hands over read-only views).
        view = StoredState(state_of([h.m, h.s]).state, MappingProxyType(values))
        await engine.write(WriteBatch((other.g,), (view,)))
        got = await engine.get_state(h.entity_id)
        assert got == state_of([h.m, h.s]).state, f"{spec.name}: state did not round trip"
        assert await engine.get_state(genesis(n=97).entity_id) is None, f"{spec.name}: unknown"
        states = await engine.get_states([h.entity_id, genesis(n=97).entity_id])
        assert set(states) == {h.entity_id}, f"{spec.name}: get_states"
        scanned = [state_key(s) for s in await engine.scan("items")]
        assert scanned == [state_key(view)], f"{spec.name}: scan of items: {scanned}"
        assert [s.state.entity_id for s in await engine.scan("others")] == [other.entity_id]
        assert await engine.scan("nothing") == [], f"{spec.name}: scan of an empty collection"

    await _with_engine(spec, body)


async def check_atomic_batches(spec: EngineSpec) -> None:
    """A batch that fails mid-way leaves nothing; the engine keeps working afterwards."""

    async def body(engine: StorageEngine) -> None:
        h = History.make()
        await engine.write(WriteBatch((h.g,), (state_of([h.g]),), (("kept", b"1"),)))
        before = await engine_content(engine)
        bad_values = state_of([h.a], {"x": object()})
        not_a_state = StoredState(object(), {})  # type: ignore[arg-type]
        for bad in (bad_values, not_a_state):
            batch = WriteBatch((h.a, h.b), (state_of([h.a]), bad), (("lost", b"1"),))
            try:
                await engine.write(batch)
            except StorageError:
                pass
            else:
                raise AssertionError(f"{spec.name}: a batch with a bad state was accepted")
            after = await engine_content(engine)
            assert after == before, f"{spec.name}: a failed batch left something behind"
        result = await engine.write(WriteBatch((h.a,), (state_of([h.a]),)))
        assert result.new_events == {h.a.id}, f"{spec.name}: engine broken after a failure"
        assert result.offsets == (2,), f"{spec.name}: a failed batch consumed offsets"

    await _with_engine(spec, body)


async def check_feed(spec: EngineSpec) -> None:
    """Offsets: one per state, strictly increasing, never skipped, even when concurrent."""

    async def body(engine: StorageEngine) -> None:
        assert await engine.last_offset() == 0, f"{spec.name}: a fresh feed is empty"
        assert await engine.read_since(0) == [], f"{spec.name}: a fresh feed is empty"
        histories = [History.make(n=i) for i in range(24)]
        first = await engine.write(WriteBatch((histories[0].g,), (state_of([histories[0].g]),) * 2))
        assert first.offsets == (1, 2), f"{spec.name}: offsets of the first batch"
        results = await asyncio.gather(
            *(engine.write(WriteBatch((h.g,), (state_of([h.g]),))) for h in histories[1:])
        )
        offsets = sorted(o for r in results for o in r.offsets)
        assert offsets == list(range(3, 3 + len(histories) - 1)), f"{spec.name}: {offsets}"
        rows = await engine.read_since(0, limit=1 << 20)
        assert [r.offset for r in rows] == list(range(1, len(histories) + 2)), spec.name
        by_offset = {o: h for h, r in zip(histories[1:], results, strict=True) for o in r.offsets}
        for row in rows[2:]:
            h = by_offset[row.offset]
            assert (row.entity_id, row.collection, row.head) == (
                h.entity_id,
                "items",
                Clock([h.g.id]),
            )
        page = await engine.read_since(5, limit=3)
        assert [r.offset for r in page] == [6, 7, 8], f"{spec.name}: read_since pagination"
        assert await engine.last_offset() == len(histories) + 1, f"{spec.name}: last_offset"
        assert await engine.read_since(len(histories) + 1) == [], f"{spec.name}: past the end"

    await _with_engine(spec, body)


async def check_wait_for_feed(spec: EngineSpec) -> None:
    """``wait_for_feed`` returns at once with news, wakes on a write, times out without."""

    async def body(engine: StorageEngine) -> None:
        h = History.make()
        assert not await engine.wait_for_feed(0, timeout=0.05), f"{spec.name}: news from nowhere"
        waiting = asyncio.ensure_future(engine.wait_for_feed(0, timeout=30))
        done, _ = await asyncio.wait([waiting], timeout=0.05)  # it is waiting, not done
        assert not done, f"{spec.name}: wait_for_feed returned with nothing new"
        await engine.write(WriteBatch((h.g,), (state_of([h.g]),)))
        async with asyncio.timeout(10):
            assert await waiting, f"{spec.name}: the waiter saw no news"
        assert await engine.wait_for_feed(0, timeout=0), f"{spec.name}: news not reported"

    await _with_engine(spec, body)


async def check_meta(spec: EngineSpec) -> None:
    """Meta records round trip, are overwritten, deleted by None, atomic with a batch."""

    async def body(engine: StorageEngine) -> None:
        assert await engine.get_meta("root") is None, f"{spec.name}: meta from nowhere"
        await engine.write(WriteBatch(meta=(("root", b"\x00" * 32), ("k", b"1"))))
        await engine.write(WriteBatch(meta=(("k", b"2"), ("gone", b"x"), ("gone", None))))
        assert await engine.get_meta("root") == b"\x00" * 32, f"{spec.name}: meta round trip"
        assert await engine.get_meta("k") == b"2", f"{spec.name}: meta not overwritten"
        assert await engine.get_meta("gone") is None, f"{spec.name}: None did not delete"
        await engine.write(WriteBatch(meta=(("root", None),)))
        assert await engine.get_meta("root") is None, f"{spec.name}: meta not deleted"

    await _with_engine(spec, body)


async def check_meta_prefix(spec: EngineSpec) -> None:
    """``scan_meta`` lists the records under a prefix in key (byte) order, and only those."""

    async def body(engine: StorageEngine) -> None:
        keys = ("outbox/00000000000000000010", "outbox/00000000000000000002", "outboxer", "o")
        await engine.write(WriteBatch(meta=tuple((k, k.encode()) for k in keys)))
        await engine.write(WriteBatch(meta=(("outbox/00000000000000000003", b"x"),)))
        await engine.write(WriteBatch(meta=(("outbox/00000000000000000003", None),)))
        got = await engine.scan_meta("outbox/")
        want = [(k, k.encode()) for k in sorted(keys[:2])]
        assert got == want, f"{spec.name}: scan_meta gave {got}"
        assert await engine.scan_meta("nothing/") == [], f"{spec.name}: scan_meta from nowhere"
        everything = await engine.scan_meta("")
        assert [k for k, _ in everything] == sorted(keys), f"{spec.name}: not in key order"

    await _with_engine(spec, body)


async def check_forget(spec: EngineSpec) -> None:
    """A forgotten entity is gone whole (events, state, scan and fetch rows), others stay;
    the same batch may write it anew, and forgetting an unknown entity is harmless."""

    async def body(engine: StorageEngine) -> None:
        h, other = History.make(n=1), History.make(n=2)
        await engine.write(WriteBatch((*h.events, *other.events), (state_of([h.m], {"k": 1}),)))
        await engine.write(WriteBatch(states=(state_of([other.m], {"k": 1}),)))
        before = await engine.last_offset()
        await engine.write(WriteBatch(forget=(h.entity_id, genesis(n=77).entity_id)))
        assert await engine.events_of(h.entity_id) == [], f"{spec.name}: events survived"
        assert not await engine.event_stored(h.a.id), f"{spec.name}: an event survived"
        assert await engine.get_events([h.m.id, h.g.id]) == {}, f"{spec.name}: get_events"
        assert await engine.get_state(h.entity_id) is None, f"{spec.name}: the state survived"
        scanned = [s.state.entity_id for s in await engine.scan("items")]
        assert scanned == [other.entity_id], f"{spec.name}: scan after forget: {scanned}"
        fetched = await engine.fetch("items", parse("k = 1"))
        assert [s.state.entity_id for s in fetched] == [other.entity_id], f"{spec.name}: fetch"
        assert len(await engine.events_of(other.entity_id)) == 6, f"{spec.name}: others lost"
        assert await engine.last_offset() == before, f"{spec.name}: forgetting wrote a feed row"
        again = WriteBatch((h.g, h.b), (state_of([h.b], {"k": 2}),), forget=(h.entity_id,))
        result = await engine.write(again)
        assert result.new_events == {h.g.id, h.b.id}, f"{spec.name}: re-added events not new"
        got = [event_key(e) for e in await engine.events_of(h.entity_id)]
        assert got == [event_key(h.g), event_key(h.b)], (
            f"{spec.name}: write after forget in one batch"
        )
        fetched = await engine.fetch("items", parse("k = 2"))
        assert [s.state.entity_id for s in fetched] == [h.entity_id], f"{spec.name}: reindexed"

    await _with_engine(spec, body)


async def check_read_ahead(spec: EngineSpec) -> None:
    """Read-ahead adds only real ancestors, at most ``ahead`` of them."""

    async def body(engine: StorageEngine) -> None:
        h = History.make()
        chain = [h.m]
        for i in range(40):  # (more than an in-memory engine keeps decoded: all are read)
            chain.append(update([chain[-1]], b"%d" % i))
        await engine.write(WriteBatch((*h.events, *chain[1:])))
        tip = chain[-1]
        every = {e.id for e in (*h.events, *chain)}
        ancestors = every - {tip.id, h.s.id}
        for ahead in (0, 1, 5, 1000):
            found = await engine.get_events([tip.id], ahead=ahead)
            assert tip.id in found, f"{spec.name}: asked id missing with ahead={ahead}"
            extra = set(found) - {tip.id}
            assert extra <= ancestors, f"{spec.name}: non-ancestors read ahead: {extra}"
            assert len(extra) <= ahead, f"{spec.name}: more than ahead={ahead} read ahead"
            for eid, event in found.items():
                assert event.id == eid, f"{spec.name}: read-ahead mislabelled an event"
        assert len(await engine.get_events([tip.id], ahead=1000)) == len(ancestors) + 1

    await _with_engine(spec, body)


async def check_dump_load(spec: EngineSpec) -> None:
    """``dump`` streams everything; ``load`` of that stream into a fresh engine agrees."""

    async def body(engine: StorageEngine) -> None:
        histories = [History.make("items" if i % 2 else "others", n=i) for i in range(5)]
        for h in histories:
            await engine.write(WriteBatch(tuple(h.events), (state_of([h.m, h.s], {"i": 1}),)))
        await engine.write(WriteBatch(meta=(("root", b"r"),)))
        records: list[DumpRecord] = [r async for r in engine.dump()]
        assert isinstance(records[0], MetaRecord), f"{spec.name}: meta comes first"
        ids = [r.entity_id for r in records if isinstance(r, EntityRecord)]
        assert ids == sorted(h.entity_id for h in histories), f"{spec.name}: entity order"
        target = await spec.fresh()
        try:
            assert await target.load(_aiter(records)) == 6 * len(histories)
            theirs, ours = await engine_content(target), await engine_content(engine)
            assert theirs[:-2] == ours[:-2], f"{spec.name}: load did not reproduce the dump"
        finally:
            await target.close()

    await _with_engine(spec, body)


async def check_reopen(spec: EngineSpec) -> None:
    """A reopened durable engine holds everything, and its feed continues."""
    if spec.reopen is None:
        return
    engine = await spec.fresh()
    try:
        h = History.make()
        await engine.write(WriteBatch(tuple(h.events), (state_of([h.m, h.s], {"v": "x"}),)))
        await engine.write(WriteBatch(meta=(("root", b"r"),)))
        before = await engine_content(engine)
        engine = await spec.reopen(engine)
        assert await engine_content(engine) == before, f"{spec.name}: reopen lost something"
        result = await engine.write(WriteBatch((), (state_of([h.m]),)))
        assert result.offsets == (2,), f"{spec.name}: the feed did not continue after reopen"
    finally:
        await engine.close()


async def check_closed(spec: EngineSpec) -> None:
    """Using a closed engine raises StorageError; closing twice is harmless."""
    engine = await spec.fresh()
    await engine.close()
    await engine.close()
    for use in (
        engine.get_state(genesis().entity_id),
        engine.write(WriteBatch(meta=(("k", b""),))),
    ):
        try:
            await use
        except StorageError:
            continue
        raise AssertionError(f"{spec.name}: a closed engine still answered")


async def check_fetch(spec: EngineSpec) -> None:
    """``fetch`` returns exactly ``sort_rows`` over ``scan``, after updates and tombstones
    and across a reopen (see :mod:`mycelia.storage.testing_queries`)."""
    await check_fetch_on(spec.fresh, spec.reopen, name=spec.name)


async def _aiter(items: Sequence[T]) -> Any:
    for item in items:
        yield item


CHECKS: dict[str, Check] = {
    "idempotent_add": check_idempotent_add,
    "events_by_id_and_entity": check_events_by_id_and_entity,
    "states": check_states,
    "atomic_batches": check_atomic_batches,
    "feed": check_feed,
    "wait_for_feed": check_wait_for_feed,
    "meta": check_meta,
    "meta_prefix": check_meta_prefix,
    "forget": check_forget,
    "read_ahead": check_read_ahead,
    "dump_load": check_dump_load,
    "load_all_or_nothing": check_load_all_or_nothing,
    "reopen": check_reopen,
    "closed": check_closed,
    "fetch": check_fetch,
}
"""Every check by name, in the order :func:`check_engine` runs them."""


async def check_engine(fresh: Fresh, *, reopen: Reopen | None = None, name: str = "engine") -> None:
    """Run every check of :data:`CHECKS` on engines from ``fresh`` (and ``reopen``)."""
    spec = EngineSpec(name, fresh, reopen)
    for check in CHECKS.values():
        await check(spec)
