"""What a durable peer's answer means for an ephemeral node's owed commit, and which owed
commits a refusal takes out (the commit pipeline's verdicts, :mod:`mycelia.node.commits`).

Rules:

- Only an answer that says the peer will **never** take the commit is a refusal
  (:data:`REFUSALS`, read by :func:`refusal_in`); anything else means "not now"
  (:data:`LATER`): the commit stays owed and is pushed again. Reverting loses the user's
  work, pushing again costs nothing, so only what is certain reverts.
- A refusal takes out the refused commit and every owed commit built on it, by event
  parents, transitively (:func:`doomed_by`); those get
  :class:`~mycelia.errors.CommitReverted`, caused by the refusal they descend from.
- Readers of rejections each get every one published while they read
  (:class:`Rejections`).
- The revert reads from the durable peer its states of the entities the doomed commits
  touched (:func:`peer_states`) and which of this node's other owed events on them it
  holds already (:func:`not_held`: the rest are replayed on top).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Final

from mycelia.errors import (
    CommitReverted,
    DecodeError,
    InvalidArgument,
    LineageError,
    MyceliaError,
    PendingLimit,
    PolicyDenied,
    RemoteError,
    SystemError_,
    error_class,
)
from mycelia.node.outbox import Owed
from mycelia.node.ports import MakeRequest, Session
from mycelia.proto import AdmittedEvent, EntityId, EntityState, EventId
from mycelia.proto.peering import DeltasResponse, EventsResponse, GetEventsRequest, GetRequest

__all__ = [
    "LATER",
    "REFUSALS",
    "REJECTIONS_KEPT",
    "Later",
    "Rejection",
    "Rejections",
    "doomed_by",
    "not_held",
    "peer_states",
    "refusal_in",
]

REFUSALS: Final = (PolicyDenied, DecodeError, SystemError_, LineageError, InvalidArgument)
"""What a durable peer's answer must name for a commit to count as refused (and be
reverted): errors that say it will never take the commit. Anything else — a storage
failure there, an internal error, an error kind this node does not know, and
``EventNotFound`` (a parent the peer lacks: either refused too, which this node finds
itself from the commits' parents, or not yet received from another server of a cluster)
— means "not now": the commit stays owed and a later session pushes it again."""


def refusal_in(exc: RemoteError) -> MyceliaError | None:
    """The refusal ``exc`` names, or None if it only says "not now" (see REFUSALS).

    A peer's error arrives by its stable code as an instance of the class the code names
    (:func:`mycelia.errors.remote`); a code this node does not know is read as its nearest
    known ancestor, so a new kind of decode error still refuses, and an unknown family
    (the root code) says "not now".
    """
    if not isinstance(exc, REFUSALS) or isinstance(exc, PendingLimit):
        return None  # (PendingLimit: the peer is busy holding events for others)
    try:
        return error_class(exc.code)(f"the durable peer refused: {exc}")
    except TypeError:
        return exc


class Later:
    """The verdict "not now" (see :data:`REFUSALS`)."""


LATER: Final = Later()


@dataclass(frozen=True, slots=True)
class Rejection:
    """A local commit that was reverted: the durable peer refused it, or one it built on."""

    events: tuple[EventId, ...]
    entities: tuple[EntityId, ...]
    error: MyceliaError
    """The peer's refusal, or CommitReverted (its ``__cause__`` is that refusal)."""


REJECTIONS_KEPT: Final = 1024
"""Rejection records a slow reader of a stream may fall behind by (then dropped)."""


class Rejections:
    """Every :class:`Rejection` published, to each stream open at the time (a reader
    that falls :data:`REJECTIONS_KEPT` behind loses the oldest)."""

    def __init__(self) -> None:
        self._readers: list[asyncio.Queue[Rejection]] = []

    def stream(self) -> AsyncIterator[Rejection]:
        """Every rejection from now on, as an async iterator."""
        queue: asyncio.Queue[Rejection] = asyncio.Queue(REJECTIONS_KEPT)
        self._readers.append(queue)

        async def stream() -> AsyncIterator[Rejection]:
            try:
                while True:
                    yield await queue.get()
            finally:
                self._readers.remove(queue)

        return stream()

    def publish(self, rejection: Rejection) -> None:
        """Hand ``rejection`` to every open stream."""
        for queue in self._readers:
            if queue.full():
                queue.get_nowait()  # a reader that does not keep up loses the oldest
            queue.put_nowait(rejection)


def doomed_by(
    owed: Mapping[int, Owed], refused: Mapping[int, MyceliaError]
) -> dict[int, MyceliaError]:
    """The refused commits and every owed commit built on one, with their errors
    (``owed`` in commit order, by sequence number).

    A commit built on a refused one gets CommitReverted (caused by the refusal it descends
    from), even when the peer refused it too: its parent was unknown there.
    """
    doomed: dict[int, MyceliaError] = {}
    origin: dict[int, int] = {}
    cause: dict[EventId, int] = {}
    for seq, commit in owed.items():  # in commit order: parents come first
        hit = next((cause[p] for e in commit.events for p in e.parent if p in cause), None)
        if hit is not None:
            first = origin[seq] = origin[hit]
            doomed[seq] = _reverted(seq, first, doomed[first])
        elif seq in refused:
            origin[seq] = seq
            doomed[seq] = refused[seq]
        else:
            continue
        cause.update((e.id, seq) for e in commit.events)
    return doomed


def _reverted(seq: int, origin: int, refusal: MyceliaError) -> CommitReverted:
    error = CommitReverted(
        f"local commit {seq} was reverted: it was built on local commit {origin}, "
        f"which the durable peer refused ({refusal})"
    )
    error.__cause__ = refusal
    return error


async def peer_states(
    session: Session, entities: list[EntityId], *, step: int
) -> dict[EntityId, EntityState | None]:
    """The durable peer's state of each of ``entities`` (``None``: it has none), asked
    ``step`` entities a request."""
    states: dict[EntityId, EntityState | None] = dict.fromkeys(entities)
    for start in range(0, len(entities), step):
        ids = tuple(entities[start : start + step])
        response = await session.request(_get(ids), expect=DeltasResponse)
        for delta in response.deltas:
            if delta.entity_id in states and delta.state is not None:
                states[delta.entity_id] = delta.state
    return states


async def not_held(
    session: Session, events: list[AdmittedEvent], *, step: int
) -> list[AdmittedEvent]:
    """Those of ``events`` the durable peer does not hold, asked ``step`` events a request."""
    held: set[EventId] = set()
    for start in range(0, len(events), step):
        ids = tuple(e.id for e in events[start : start + step])
        response = await session.request(_get_events(ids), expect=EventsResponse)
        held.update(e.id for e in response.events)
    return [e for e in events if e.id not in held]


def _get(ids: tuple[EntityId, ...]) -> MakeRequest:
    return lambda rid: GetRequest(rid, ids, ())


def _get_events(ids: tuple[EventId, ...]) -> MakeRequest:
    return lambda rid: GetEventsRequest(rid, ids, 0)
