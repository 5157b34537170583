"""What the durable peer keeps current for each mirrored live query (ARCHITECTURE.md §8).

A client holds rows its durable peer no longer tells it about: one read once with
``ctx.get``, one another query kept current until it left that query, one that fell out
of a LIMIT before a reconnect. Such a row can be stale, and a live query that read its
result from every row held here could show it, with its old values, for good (its peer
never sends what it does not know the client shows). So while a query is mirrored, its
result is read from the rows its peer keeps current for it, and this module tracks them.

They are what the peer holds in its ``ServedQuery.sent`` for the query: every delta it
sends for the query says whether the entity is in it (``matches``); a subscription's
answer adds the named entities it said nothing about (the client holds their head, and
they still match). A commit of the client's own that creates an entity the query holds
comes back as a ``matches=True`` delta with no data (mycelia.node.served).

A subscription names the heads of the query's members and of the other rows here it
selects (:func:`named_heads`), so the peer keeps those current too, or says they left.

Invariants:

- :meth:`KeptRows.of` is ``None`` unless the query's answer of the current session is
  whole: offline, or while a subscription is answered, a query reads every row held here
  (offline-first: it shows what it has).
- The ids are noted before the deltas that carry them are applied, so a LIMIT refill that
  one of those changes starts ranks among them.
- What a subscription's answer and the updates say is taken in the order the connection
  read them, not in the order they are applied (an answer's pages are applied while
  updates are). The peer sends a subscription's response before the subscription stands
  (mycelia.node.serving), so an update read before the response is the subscription's it
  replaces, which says nothing of what is kept now, and one read after it is held until
  the answer is taken. (Taken as applied, an update saying an entity had arrived, applied
  before an answer page that had read it as absent, was undone by that page, and the
  query hid the entity for good: the simulator found it, seeds 6 and 7.)
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field

from mycelia.node.deltas import query_rows
from mycelia.node.ports import Standing
from mycelia.proto import Clock, EntityId
from mycelia.proto.peering import Delta, KnownEntity
from mycelia.storage import StorageEngine

__all__ = ["KeptRows", "named_heads"]


async def named_heads(
    storage: StorageEngine, live: Standing, afresh: Collection[EntityId]
) -> list[KnownEntity]:
    """The heads a subscription of ``live`` names: of its members, then of the other rows
    here its query selects, as stored (a resident is ahead of storage only inside an
    applier run; making each resident to read its head cost a reconnecting client 26 µs a
    member). The peer keeps the rows named current, or says they left: one held from an
    earlier read and not named stayed stale here for good. One asked for ``afresh`` is
    named with no head: the peer sends its state whole, or says it left."""
    members = live.member_ids()
    heads = {e: Clock() for e in members}  # (members first: past the cap, rows wait)
    for row in await query_rows(storage, live.collection, live.query):
        heads[row.state.entity_id] = row.state.state.head
    unread = [e for e in members if not heads[e]]
    for entity_id, state in (await storage.get_states(unread) if unread else {}).items():
        heads[entity_id] = state.state.head
    return [
        KnownEntity(entity_id, () if entity_id in afresh else head.ids)
        for entity_id, head in heads.items()
        if head
    ]


@dataclass(slots=True)
class _Answering:
    """A subscription of a query being answered."""

    responded: Callable[[], bool]
    """Whether its final response has arrived (what the connection reads, in order)."""
    after: int | None = None
    """The arrival index of the first update read after its response."""
    held: list[Sequence[Delta]] = field(default_factory=list)
    """Its own updates applied before its answer's last pages (taken after them)."""


class KeptRows:
    """Per mirrored query id, the entities its durable peer keeps current for it."""

    def __init__(self) -> None:
        self._kept: dict[int, set[EntityId]] = {}
        self._answered: dict[int, int] = {}
        """Per query, the session whose subscription's answer made its set whole."""
        self._answering: dict[int, _Answering] = {}
        self.received = 0
        """Updates read from the session's connection so far (their arrival indexes)."""

    def new_session(self) -> None:
        """A session starts: its updates are counted from zero."""
        self.received = 0
        self._answering.clear()

    def read(self) -> None:
        """An update was read from the connection (call it in the order they are read)."""
        for answering in self._answering.values():
            if answering.after is None and answering.responded():
                answering.after = self.received
        self.received += 1

    def start(self, query_id: int, responded: Callable[[], bool]) -> None:
        """A subscription of the query was sent: its set starts empty. ``responded`` says
        whether its final response has been read."""
        self._kept[query_id] = set()
        self._answered.pop(query_id, None)
        self._answering[query_id] = _Answering(responded)

    def page(self, query_id: int, deltas: Iterable[Delta]) -> None:
        """Take a page of the query's subscription answer: what it says matches is kept."""
        kept = self._kept.get(query_id)
        if kept is not None:
            kept.update(d.entity_id for d in deltas if d.matches)

    def answered(
        self, query_id: int, session: int, named: Iterable[EntityId], said: Collection[EntityId]
    ) -> None:
        """The answer is whole: the ``named`` heads it said nothing of (not in ``said``)
        are held here as the peer holds them, and still match; then the subscription's
        own updates applied meanwhile are taken, in order."""
        kept = self._kept.get(query_id)
        answering = self._answering.pop(query_id, None)
        if kept is None or answering is None:
            return
        kept.update(e for e in named if e not in said)
        for deltas in answering.held:
            _take(kept, deltas)
        self._answered[query_id] = session

    def note(
        self, query_id: int, deltas: Sequence[Delta], arrival: int
    ) -> tuple[set[EntityId], set[EntityId]]:
        """Take what an update for the query says (``arrival``: its index among the
        updates read); returns the ids the peer now keeps and did not, and those it no
        longer keeps. While the query's subscription is answered, an update read before
        its response is the subscription it replaces (the answer says what is kept now),
        and one read after it is held until the answer is taken."""
        answering = self._answering.get(query_id)
        if answering is not None:
            if answering.after is not None and arrival >= answering.after:
                answering.held.append(deltas)
            return set(), set()
        kept = self._kept.get(query_id)
        return _take(kept, deltas) if kept is not None else (set(), set())

    def of(self, query_id: int, session: int | None) -> set[EntityId] | None:
        """The entities the peer keeps current for the query in ``session`` (``None``: not
        known whole, see the module docstring)."""
        if session is None or self._answered.get(query_id) != session:
            return None
        return self._kept.get(query_id)

    def forget(self, query_id: int) -> None:
        """The query is no longer mirrored."""
        self._kept.pop(query_id, None)
        self._answered.pop(query_id, None)
        self._answering.pop(query_id, None)


def _take(kept: set[EntityId], deltas: Iterable[Delta]) -> tuple[set[EntityId], set[EntityId]]:
    """Take what ``deltas`` say into ``kept``; returns the ids gained and lost."""
    gained: set[EntityId] = set()
    lost: set[EntityId] = set()
    for delta in deltas:
        entity_id = delta.entity_id
        if delta.matches and entity_id not in kept:
            kept.add(entity_id)
            gained.add(entity_id)
        elif not delta.matches and entity_id in kept:
            kept.discard(entity_id)
            lost.add(entity_id)
    return gained, lost
