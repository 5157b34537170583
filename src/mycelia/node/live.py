"""Live queries: results kept current as commits happen (ARCHITECTURE.md §8).

``async with ctx.query(Album, "year > ?", 1985) as live:`` gives ``live.items`` (the current
result, in query order) and an async iterator of :class:`ChangeSet` s: the first carries
``initial``; later ones ``added``, ``updated`` and ``removed`` views. A commit that changes
nothing a query can see emits nothing. Sets the reader has not taken merge
(:mod:`mycelia.node.changes`), so an unread query holds O(result), not O(commits).

The node's one change listener for live queries is :class:`~mycelia.node.reactor.Reactor`:
its candidate index routes each commit to the queries it can concern. A query with a
LIMIT keeps its members' ranks (:mod:`mycelia.node.ranks`) and applies a change it can
place from them as any other; only a change that makes room (a full result's member
leaves or falls past its last rank) or that policy hides makes the query re-run against
storage (the refill is emitted as ``added``). So a change costs O(log LIMIT), not a
query.

On an ephemeral node with a durable peer, every live query is mirrored on the server; on
each (re)connection it is re-subscribed with the heads held here, so it catches up and
drops what stopped matching while offline. While mirrored, its result is read only from
the rows the server keeps current for it (:mod:`mycelia.node.kept`): another row held
here may be stale.

The query is checked against the model when it is made (:mod:`mycelia.entity.querycheck`:
QueryError for an unknown field or a value of the wrong type). Iterating a live query
outside its ``async with`` raises :class:`~mycelia.errors.UsageError` (it would wait for
ever); when the node closes, every open live query's iteration ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, Generic, TypeVar

from mycelia.entity import EntityChange, Snapshot
from mycelia.entity.model import Model
from mycelia.entity.querycheck import check_query
from mycelia.errors import MyceliaError, UsageError
from mycelia.node.changes import ChangeQueue, ChangeSet
from mycelia.node.policy import Credentials, PolicyAgent
from mycelia.node.ports import Follow, Watch
from mycelia.node.progress import Slow
from mycelia.node.ranks import Ranks
from mycelia.proto import EntityId, EntityState
from mycelia.proto.query import Query, order_key, parse
from mycelia.proto.query.compile import compile_predicate
from mycelia.retrieval import StoredState

__all__ = ["ChangeSet", "LiveParts", "LiveQuery"]

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
        next load: policy hid some of the rows storage ranked, or a change came that only
        storage can place)."""
        self._changes: ChangeQueue[M] = ChangeQueue()
        self._refresh_lock = asyncio.Lock()
        self._open = False
        self._entered = False
        self._buffer: list[EntityChange] | None = None
        """Changes that arrive while the result is read from storage (applied after it)."""
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
        self._apply_buffered()  # emits only what the initial result does not show yet
        return self

    async def _start(self) -> list[M]:
        await self._parts.follow.follow(self)  # what the peer sends now is buffered
        self._raise_refusal()
        return await self._load()

    def _raise_refusal(self) -> None:
        """Raise why the durable peer refused to mirror this query, if it just did (it
        ended the query: opening or changing it raises that, rather than leave a result
        that looks current and never changes)."""
        if not self._open and self._error is not None:
            raise self._error

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

        Raises QueryError (as ``ctx.query`` does) and leaves the query as it was; raises
        the durable peer's refusal to mirror the new query, which ends it."""
        self._parts.check_open()
        self.query = _checked(self.model, text, args)
        self._predicate = compile_predicate(self.query.predicate)
        self.text, self.args = text, args
        self._parts.watch.reindex(self)
        await self._parts.follow.resubscribe(self)
        self._raise_refusal()
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
        rows = await self._rows()
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

    async def _rows(self) -> list[StoredState]:
        """The stored rows of the result. While the query is mirrored, only those its
        durable peer keeps current for it (:mod:`mycelia.node.kept`): another row held
        here may be stale, and it would be shown for good. A LIMIT is filled from them,
        asking storage for four times as many rows each time it falls short."""
        collection, query = self.model.__collection__, self.query
        rows = await self._parts.rows(collection, query)
        kept = self._parts.follow.kept(self)
        if kept is None:
            return rows
        fresh = [row for row in rows if row.state.entity_id in kept]
        limit = query.limit
        if not isinstance(limit, int):
            return fresh
        asked = limit
        while len(fresh) < limit and len(rows) == asked:  # (storage may hold more)
            asked *= 4
            rows = await self._parts.rows(collection, replace(query, limit=asked))
            fresh = [row for row in rows if row.state.entity_id in kept]
        return fresh[:limit]

    def kept_changed(self, gained: Collection[EntityId], lost: Collection[EntityId]) -> None:
        """The durable peer keeps ``gained`` current for this query now and ``lost`` no
        longer (their deltas applied): the result is read again if that can change it (a
        row it keeps that is not shown: the client held it at the head sent, so applying
        made no change; a member it no longer keeps)."""
        if self._buffer is not None or not self._open:
            return  # (a result being loaded reads what the peer keeps)
        members = self._members
        if any(e not in members for e in gained) or any(e in members for e in lost):
            self._schedule_refresh()

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
                # Storage ranks this one and the batch's rest: until the refresh reads it,
                # the ranks place no later change either.
                self._ranks = None
                self._schedule_refresh()
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
            if ranks is None or selected != matches:
                return False  # not ranked here, or a row policy hides
            key = order_key(after.values, self.query.order_by) if matches else None
            placed = ranks.place(entity_id, key)
            if placed is None:
                return False
            matches, pushed = placed
            if pushed is not None:
                self._leave(pushed, out)
        if matches:
            view = self._admit(after, views)
            if previous is not None:
                # A member whose head moved (one that did not returned above): views at
                # different heads are never equal, so nothing to compare.
                out.updated.append(view)
            else:
                previous = _take(out.removed, entity_id)  # pushed out earlier in the batch
                if previous is None:
                    out.added.append(view)
                elif view != previous:  # back as it was shown: nothing to emit
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
        """Re-run the query against storage and emit the difference (a LIMIT refill,
        update_query, a change in the rows the durable peer keeps current). Changes
        committed while storage is read are applied after the read, to what it gave: applied
        meanwhile, the older read replaced them, and the result showed a row that had left,
        at its old value, for good."""
        async with self._refresh_lock:
            before = dict(self._members)
            self._buffer = []
            try:
                await self._load()
            except BaseException:
                self._apply_buffered()  # the result shown stays: kept current
                raise
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
            self._apply_buffered()

    def _apply_buffered(self) -> None:
        """Stop buffering, and apply the changes that came while storage was read."""
        buffered, self._buffer = self._buffer, None
        if buffered:
            self.apply(buffered)


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
