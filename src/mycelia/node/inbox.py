"""The inbox of a node's upstream: updates its durable peer pushed, read from the
connection and not applied yet, and how they are taken off it a step at a time
(:meth:`mycelia.node.upstream.Upstream.on_update`)."""

from __future__ import annotations

from collections.abc import Sequence

from mycelia.node.session import Pushed
from mycelia.proto import EntityId
from mycelia.proto.peering import SubscriptionEnded, SubscriptionUpdate
from mycelia.storage import StorageEngine

__all__ = ["Inboxed", "next_step", "unplaced"]


Inboxed = SubscriptionUpdate | SubscriptionEnded | Pushed
"""What waits in the inbox: an update read from the connection is still its frame."""


def next_step(inbox: list[Inboxed]) -> list[SubscriptionUpdate | SubscriptionEnded]:
    """Take the next step off ``inbox``: the end of a subscription alone; an update that
    carries a state alone (its base is a head this node holds after the updates before
    it); else the run of updates that carry events only, applied together (in order:
    parents before children). The updates it looks at are decoded now, as they are about
    to be applied (see :class:`~mycelia.node.session.Pushed`); raises the DecodeError of a
    malformed one, taking nothing off the inbox."""
    step = [_decoded(inbox, 0)]
    if _events_only(step[0]):
        while len(step) < len(inbox) and _events_only(update := _decoded(inbox, len(step))):
            step.append(update)
    del inbox[: len(step)]
    return step


def _decoded(inbox: list[Inboxed], at: int) -> SubscriptionUpdate | SubscriptionEnded:
    """The update at ``at``, decoded in its place if it is still its frame."""
    update = inbox[at]
    if isinstance(update, Pushed):
        update = inbox[at] = update.decode()
    return update


def _events_only(update: SubscriptionUpdate | SubscriptionEnded) -> bool:
    return isinstance(update, SubscriptionUpdate) and all(d.state is None for d in update.deltas)


async def unplaced(
    storage: StorageEngine, updates: Sequence[SubscriptionUpdate]
) -> dict[int, set[EntityId]]:
    """Per query, the entities of a refused step to ask for whole: those it sent a state
    of, or events not stored here now (not every entity of the step); all of them if
    that finds none, so that no refusal goes unanswered."""
    sent = {e.id for u in updates for d in u.deltas for e in d.events}
    stored = await storage.get_events(sent) if sent else {}
    asked: dict[int, set[EntityId]] = {}
    every: dict[int, set[EntityId]] = {}
    for update in updates:
        for delta in update.deltas:
            every.setdefault(update.query_id, set()).add(delta.entity_id)
            if delta.state is not None or any(e.id not in stored for e in delta.events):
                asked.setdefault(update.query_id, set()).add(delta.entity_id)
    return asked or every
