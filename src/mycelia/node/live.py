"""Live queries: results kept current as commits happen (ARCHITECTURE.md §8).

``async with ctx.query(Album, "year > ?", 1985) as live:`` gives ``live.items`` (the current
result, in query order) and an async iterator of :class:`ChangeSet` s: the first carries
``initial``; later ones ``added``, ``updated`` and ``removed`` views. A commit that changes
nothing a query can see emits nothing. Sets the reader has not taken merge
(:mod:`mycelia.node.changes`), so an unread query holds O(result), not O(commits).

The :class:`Reactor` is the node's one change listener for live queries. Its **candidate
index** maps (collection, field) to the queries whose predicate or ORDER BY reads that
field, and each entity to the queries it belongs to, so a commit re-evaluates only the
queries it can affect: a query is touched by a change when the entity is one of its
members or a field it reads changed. A query with a LIMIT keeps its members' ranks
(:mod:`mycelia.node.ranks`) and applies a change it can place from them as any other: a
member that stays inside the last rank, or a new match that ranks before it (the last
member leaves) or fills a result short of the LIMIT. Only a change that makes room (a
full result's member leaves or falls past its last rank) or that policy hides makes the
query re-run against storage (the refill is emitted as ``added``). So a change costs
O(log LIMIT), not a query.

On an ephemeral node with a durable peer, every live query is mirrored on the server; on
each (re)connection it is re-subscribed with the heads held here, so it catches up and
drops what stopped matching while offline.

The query is checked against the model when it is made (:mod:`mycelia.entity.querycheck`:
QueryError for an unknown field or a value of the wrong type). Iterating a live query
outside its ``async with`` raises :class:`~mycelia.errors.UsageError` (it would wait for
ever); when the node closes, every open live query's iteration ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Coroutine, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Generic, TypeVar

from mycelia.entity import EntityChange, Snapshot
from mycelia.entity.model import Model
from mycelia.entity.querycheck import check_query
from mycelia.errors import InvalidArgument, MyceliaError, UsageError
from mycelia.node.changes import ChangeQueue, ChangeSet
from mycelia.node.policy import Credentials, PolicyAgent
from mycelia.node.ports import Follow, Standing, Watch
from mycelia.node.progress import Slow
from mycelia.node.ranks import Ranks
from mycelia.proto import EntityId, EntityState
from mycelia.proto.query import (
    And,
    Comparison,
    Op,
    Placeholder,
    Query,
    encode_key,
    order_key,
    parse,
)
from mycelia.proto.query.compile import compile_predicate
from mycelia.retrieval import StoredState

__all__ = ["ChangeSet", "LiveParts", "LiveQuery", "Reactor"]

M = TypeVar("M", bound=Model)


@dataclass(frozen=True, slots=True)
class LiveParts:
    """What a live query works with (the node wires them)."""

    watch: Watch
    """The node's candidate index (the reactor)."""
    follow: Follow
    """The durable peer, which mirrors the query (the upstream)."""
    rows: Callable[[str, Query], Awaitable[list[StoredState]]]
    """The stored rows matching a bound query, in its order (this node's storage)."""
    policy: PolicyAgent
    spawn: Callable[[Coroutine[object, object, None]], None]
    """Runs a task the node keeps (LIMIT refreshes)."""
    query_ids: Callable[[], int]
    """A fresh query id (ids come from the node, never from a global counter)."""
    check_open: Callable[[], None]
    """Raises NodeClosed once the node is closed."""
    slow: Callable[[str], Slow] | None = None
    """Progress for a first result that takes long (a client's large initial sync)."""
    opened: dict[LiveQuery[Any], None] = field(default_factory=dict)
    """The live queries open now (the node ends them when it closes)."""


class LiveQuery(Generic[M]):
    """A query whose result follows every commit; see the module docstring."""

    def __init__(
        self,
        parts: LiveParts,
        credentials: Credentials,
        model: type[M],
        text: str,
        args: tuple[object, ...],
    ) -> None:
        self._parts = parts
        self._credentials = credentials
        self.model = model
        self.query = _checked(model, text, args)
        self._predicate = compile_predicate(self.query.predicate)
        self.text, self.args = text, args
        self.query_id = parts.query_ids()
        self._members: dict[EntityId, M] = {}
        self._keys: dict[EntityId, bytes] = {}
        self._ranks: Ranks | None = None
        """A LIMIT query's members in rank order (``None``: no LIMIT, or unknown until the
        next load: policy hid some of the rows storage ranked)."""
        self._changes: ChangeQueue[M] = ChangeQueue()
        self._refresh_lock = asyncio.Lock()
        self._open = False
        self._entered = False
        self._buffer: list[EntityChange] | None = None
        """Changes that arrive while the initial result loads (applied after it)."""
        self._refreshing = 0
        self._settled = asyncio.Event()
        self._settled.set()
        self._error: MyceliaError | None = None
        """Why the durable peer ended the subscription (raised once the iteration ends)."""

    @property
    def items(self) -> list[M]:
        """The current result, in query order."""
        ordered = sorted(self._members, key=lambda e: (self._keys[e], bytes(e)))
        return [self._members[e] for e in ordered]

    @property
    def collection(self) -> str:
        """The collection the query reads."""
        return self.model.__collection__

    def member_ids(self) -> list[EntityId]:
        """The entities in the result now."""
        return list(self._members)

    async def __aenter__(self) -> LiveQuery[M]:
        self._parts.check_open()
        self._open = self._entered = True
        self._parts.opened[self] = None
        self._buffer = []
        self._parts.watch.add(self)
        slow = self._parts.slow
        if slow is None:
            initial = await self._start()
        else:
            async with slow(f"first result of {self.collection} {self.text!r}"):
                initial = await self._start()
        self._changes.start(initial)
        buffered, self._buffer = self._buffer, None
        if buffered:
            self.apply(buffered)  # emits only what the initial result does not show yet
        return self

    async def _start(self) -> list[M]:
        await self._parts.follow.follow(self)  # what the peer sends now is buffered
        return await self._load()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop following changes (and unsubscribe on the server)."""
        if not self._open:
            return
        self.end()
        await self._parts.follow.unfollow(self)

    def end(self, error: MyceliaError | None = None) -> None:
        """Stop following changes here at once (the node is closing, or the durable peer
        ended the subscription: ``error`` says why): the iteration ends after the change
        sets already queued, raising ``error`` if one is given."""
        if not self._open:
            return
        self._open = False
        self._error = error
        self._parts.opened.pop(self, None)
        for entity_id in self._members:
            self._parts.watch.untrack(entity_id, self)
        self._parts.watch.remove(self)
        self._changes.end()

    async def update_query(self, text: str, *args: object) -> None:
        """Change the query in place: the next change set moves the result to the new one.

        Raises QueryError (as ``ctx.query`` does) and leaves the query as it was."""
        self._parts.check_open()
        self.query = _checked(self.model, text, args)
        self._predicate = compile_predicate(self.query.predicate)
        self.text, self.args = text, args
        self._parts.watch.reindex(self)
        await self._parts.follow.resubscribe(self)
        await self.refresh()

    def __aiter__(self) -> AsyncIterator[ChangeSet[M]]:
        if not self._entered:
            raise UsageError(
                "iterate a live query inside 'async with ctx.query(...) as live:' "
                "(outside it, no change would ever arrive)"
            )
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[ChangeSet[M]]:
        while (changes := await self._changes.get()) is not None:
            yield changes
        if self._error is not None:
            raise self._error

    # -- maintenance ---------------------------------------------------------------------

    async def _load(self) -> list[M]:
        rows = await self._parts.rows(self.model.__collection__, self.query)
        for entity_id in self._members:
            self._parts.watch.untrack(entity_id, self)
        self._members.clear()
        self._keys.clear()
        for stored in rows:
            snapshot = _snapshot_of(stored.state, stored.values)
            if self._parts.policy.can_read(self._credentials, snapshot):
                self._admit(snapshot)
        limit, exact = self.query.limit, len(self._members) == len(rows)  # policy hid none
        ranked = self._keys.items()
        self._ranks = Ranks(limit, ranked) if isinstance(limit, int) and exact else None
        return self.items

    def _admit(self, snapshot: Snapshot, views: dict[object, object] | None = None) -> M:
        key = (self.model, snapshot.entity_id)
        if views is not None and key in views:
            view: M = views[key]  # type: ignore[assignment]  # keyed by this model class
        else:
            view = self.model._view(snapshot)
            if views is not None:
                views[key] = view
        if snapshot.entity_id not in self._members:
            self._parts.watch.track(snapshot.entity_id, self)
        self._members[snapshot.entity_id] = view
        self._keys[snapshot.entity_id] = order_key(snapshot.values, self.query.order_by)
        return view

    def matches(self, snapshot: Snapshot) -> bool:
        """Whether a (changed) entity belongs in the result (LIMIT aside)."""
        return self._selects(snapshot) and self._parts.policy.can_read(self._credentials, snapshot)

    def _selects(self, snapshot: Snapshot) -> bool:
        """Whether the query's predicate selects a (changed) entity (policy aside)."""
        return (
            snapshot.exists
            and snapshot.collection == self.model.__collection__
            and not snapshot.deleted
            and self._predicate(snapshot.values)
        )

    def member(self, entity_id: EntityId) -> bool:
        """Whether the entity is in the current result."""
        return entity_id in self._members

    def apply(self, changes: list[EntityChange], views: dict[object, object] | None = None) -> None:
        """React to committed changes (called by the reactor for candidate queries only).

        ``views`` shares the views built for one batch of changes between queries.
        """
        if self._buffer is not None:
            self._buffer.extend(changes)
            return
        out: ChangeSet[M] = ChangeSet()
        for change in changes:
            if not self._apply_one(change, views, out):
                self._schedule_refresh()  # storage ranks this one (and the batch's rest)
                break
        if out:
            self._changes.put(out)

    def _apply_one(
        self, change: EntityChange, views: dict[object, object] | None, out: ChangeSet[M]
    ) -> bool:
        """Apply one change to the result, noting it in ``out``; ``False`` (nothing
        applied) when only storage can say what a LIMIT result becomes."""
        after, entity_id = change.after, change.after.entity_id
        previous = self._members.get(entity_id)
        if previous is not None and previous.head == after.head:
            return True  # already shown at this head (e.g. seen by the initial load)
        selected = self._selects(after)
        matches = selected and self._parts.policy.can_read(self._credentials, after)
        ranks = self._ranks
        if self.query.limit is not None:
            if ranks is None or self._refreshing or selected != matches:
                return False  # not ranked here, a refresh to come, or a row policy hides
            key = order_key(after.values, self.query.order_by) if matches else None
            placed = ranks.place(entity_id, key)
            if placed is None:
                return False
            matches, pushed = placed
            if pushed is not None:
                self._leave(pushed, out)
        if matches:
            view = self._admit(after, views)
            if previous is None:
                previous = _take(out.removed, entity_id)  # pushed out earlier in the batch
                if previous is None:
                    out.added.append(view)
            if previous is not None and view != previous:  # a no-op delta emits nothing
                out.updated.append(view)
        elif previous is not None:
            self._leave(entity_id, out)
        return True

    def _leave(self, entity_id: EntityId, out: ChangeSet[M]) -> None:
        """A member leaves the result (noted in ``out``, unless it came in this batch)."""
        view = self._members.pop(entity_id)
        self._keys.pop(entity_id)
        self._parts.watch.untrack(entity_id, self)
        if _take(out.added, entity_id) is not None:
            return  # it came in this batch: never shown
        _take(out.updated, entity_id)
        out.removed.append(view)

    def _schedule_refresh(self) -> None:
        self._refreshing += 1
        self._settled.clear()
        self._parts.spawn(self._scheduled_refresh())

    async def _scheduled_refresh(self) -> None:
        try:
            await self.refresh()
        finally:
            self._refreshing -= 1
            if not self._refreshing:
                self._settled.set()

    async def wait_settled(self) -> None:
        """Wait until every change seen so far is reflected in :attr:`items`."""
        await self._settled.wait()

    def changes_nowait(self) -> list[ChangeSet[M]]:
        """The change sets queued so far, without waiting (the iterator's non-blocking twin)."""
        return self._changes.take_all()

    async def refresh(self) -> None:
        """Re-run the query against storage and emit the difference (LIMIT, update_query)."""
        async with self._refresh_lock:
            before = dict(self._members)
            await self._load()
            out: ChangeSet[M] = ChangeSet()
            for entity_id, view in self._members.items():
                old = before.pop(entity_id, None)
                if old is None:
                    out.added.append(view)
                elif old != view:
                    out.updated.append(view)
            out.removed.extend(before.values())
            for entity_id in before:
                self._parts.watch.untrack(entity_id, self)
            if out:
                self._changes.put(out)


def _take(views: list[M], entity_id: EntityId) -> M | None:
    """Take the view of ``entity_id`` out of ``views`` (``None`` if there is none)."""
    for at, view in enumerate(views):
        if view.id == entity_id:
            return views.pop(at)
    return None


def _checked(model: type[Model], text: str, args: tuple[object, ...]) -> Query:
    """``text`` parsed, bound to ``args`` and checked against ``model``."""
    parsed = parse(text)
    bound = parsed.bind(*args)
    check_query(model, parsed, args)
    return bound


def _snapshot_of(state: EntityState, values: Mapping[str, object]) -> Snapshot:
    return Snapshot(state.entity_id, state.collection, state.state.head, values)


class Reactor:
    """The node's live queries and their candidate index; one change listener for all.

    A query that pins a field to a value (``group = ? AND ...``) is indexed under that
    (field, value): a change can only concern it if the entity is a member or now has that
    value. Other queries are indexed under every field they read. Members are indexed by
    entity. A create concerns the pinned queries of its values and every unpinned query.
    Wire :meth:`on_change` as a change listener of the node. (Queries are kept in
    insertion-ordered dicts, not sets, so the order they hear of a change in is the order
    they were opened in, in every run.)
    """

    def __init__(self) -> None:
        self._by_field: dict[tuple[str, str], _Queries] = {}
        self._pinned: dict[tuple[str, str, bytes], _Queries] = {}
        self._pinned_fields: dict[str, dict[str, None]] = {}
        self._unpinned: dict[str, _Queries] = {}
        self._by_entity: dict[EntityId, _Queries] = {}
        self._queries: dict[Standing, str] = {}
        """Every live query registered, with its collection."""
        self._collections: dict[str, int] = {}
        """Live queries registered per collection."""

    def count(self) -> int:
        """Live queries registered."""
        return len(self._queries)

    def collections(self) -> Collection[str]:
        """The collections live queries read now (a view: it changes as queries come and
        go)."""
        return self._collections.keys()

    def tracked(self, entity_id: EntityId) -> bool:
        """Whether some live query holds ``entity_id`` (so its subscription keeps it fresh)."""
        return entity_id in self._by_entity

    def track(self, entity_id: EntityId, live: Standing) -> None:
        """Note that ``entity_id`` is a member of ``live`` (it is a candidate for it)."""
        self._by_entity.setdefault(entity_id, {})[live] = None

    def untrack(self, entity_id: EntityId, live: Standing) -> None:
        """Note that ``entity_id`` left ``live``."""
        queries = self._by_entity.get(entity_id)
        if queries is not None:
            queries.pop(live, None)
            if not queries:
                del self._by_entity[entity_id]

    def add(self, live: Standing) -> None:
        """Register a live query."""
        collection = live.collection
        if live not in self._queries:
            self._queries[live] = collection
            self._collections[collection] = self._collections.get(collection, 0) + 1
        pin = _pinned(live.query)
        if pin is not None:
            name, key = pin
            self._pinned.setdefault((collection, name, key), {})[live] = None
            self._pinned_fields.setdefault(collection, {})[name] = None
            return
        self._unpinned.setdefault(collection, {})[live] = None
        for name in live.query.fields():
            self._by_field.setdefault((collection, name), {})[live] = None

    def remove(self, live: Standing) -> None:
        """Forget a live query."""
        collection = self._queries.pop(live, None)
        if collection is not None:
            left = self._collections[collection] - 1
            if left:
                self._collections[collection] = left
            else:
                del self._collections[collection]
        _discard(self._by_field, live)
        _discard(self._pinned, live)
        _discard(self._unpinned, live)

    def reindex(self, live: Standing) -> None:
        """Refresh a query's index entries after its query changed."""
        self.remove(live)
        self.add(live)

    def _candidates(self, change: EntityChange) -> _Queries:
        collection = change.after.collection
        candidates = dict(self._by_entity.get(change.after.entity_id, {}))
        values = change.after.values
        for name in self._pinned_fields.get(collection, {}):
            if name in values:
                try:
                    key = encode_key(values[name])
                except InvalidArgument:
                    continue
                candidates.update(self._pinned.get((collection, name, key), {}))
        if not change.before.exists:
            candidates.update(self._unpinned.get(collection, {}))
        else:
            for name in sorted(change.changed):
                candidates.update(self._by_field.get((collection, name), {}))
        return candidates

    def on_change(self, changes: list[EntityChange]) -> None:
        """Route committed changes to the live queries they can concern."""
        touched: dict[Standing, list[EntityChange]] = {}
        for change in _per_entity(changes):
            for live in self._candidates(change):
                touched.setdefault(live, []).append(change)
        views: dict[object, object] = {}  # one view per (model, entity) for this batch
        for live, mine in touched.items():
            live.apply(mine, views)


_Queries = dict[Standing, None]
"""Live queries as an insertion-ordered set."""

K = TypeVar("K")


def _per_entity(changes: list[EntityChange]) -> list[EntityChange]:
    """One change per entity: several in one batch (a genesis, then an update released for
    it) become one, from the first ``before`` to the last ``after``, so a query that only
    learns of the entity from the first is not left holding a stale view."""
    merged: dict[EntityId, EntityChange] = {}
    for change in changes:
        entity_id = change.after.entity_id
        earlier = merged.get(entity_id)
        merged[entity_id] = (
            change
            if earlier is None
            else EntityChange(
                earlier.before,
                change.after,
                earlier.events + change.events,
                earlier.changed | change.changed,
            )
        )
    return list(merged.values())


def _discard(index: dict[K, _Queries], live: Standing) -> None:
    for key, queries in list(index.items()):
        queries.pop(live, None)
        if not queries:
            del index[key]


def _pinned(query: Query) -> tuple[str, bytes] | None:
    """A (field, value key) the query requires with ``field = value`` at its top level."""
    predicate = query.predicate
    items = predicate.items if isinstance(predicate, And) else (predicate,)
    for item in items:
        if (
            isinstance(item, Comparison)
            and item.op is Op.EQ
            and len(item.path) == 1
            and not isinstance(item.value, Placeholder)
        ):
            return item.path[0], encode_key(item.value)
    return None
