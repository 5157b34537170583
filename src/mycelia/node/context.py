"""Contexts: a node seen with one set of credentials (ARCHITECTURE.md §11).

Everything an application does goes through a context: transactions, ``get``,
``history``, ``fetch`` and live ``query``. Reads are filtered by the policy agent's
``can_read`` for the context's credentials. On an ephemeral node with a connected durable
peer, ``get`` and ``fetch`` (and ``trx.edit``) read through: the peer is asked first, with
the heads held here so only what is missing travels, unless a live query keeps the entity
current already.

Queries are checked against the model first (:mod:`mycelia.entity.querycheck`): a field
the model does not declare, or a value of the wrong type for its field, raises
:class:`~mycelia.errors.QueryError` instead of silently matching nothing (or
everything). Once the node is closed every call raises :class:`~mycelia.errors.NodeClosed`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from mycelia.entity import Snapshot
from mycelia.entity.model import Model
from mycelia.entity.querycheck import check_query
from mycelia.errors import EntityNotFound
from mycelia.node.live import LiveParts, LiveQuery
from mycelia.node.policy import Credentials
from mycelia.node.transaction import Transaction, TransactionParts, Wait, check_entity_id
from mycelia.proto import AdmittedEvent, EntityId
from mycelia.proto.query import parse

__all__ = ["Context", "ContextParts"]

M = TypeVar("M", bound=Model)


@dataclass(frozen=True, slots=True)
class ContextParts:
    """What a context works with (the node wires them)."""

    transactions: TransactionParts
    live: LiveParts
    history: Callable[[EntityId], Awaitable[list[AdmittedEvent]]]
    """The entity's stored events, parents first."""


class Context:
    """The node as one caller sees it."""

    def __init__(self, parts: ContextParts, credentials: Credentials) -> None:
        self._parts = parts
        self.credentials = credentials

    def transaction(self, *, wait: Wait = "peer") -> Transaction:
        """A new transaction (use ``async with``: commit on exit, rollback on error).

        ``wait="peer"`` (default) returns from the commit once the durable peer confirmed
        it (or once it is owed, when none is reachable); ``wait="local"`` as soon as it is
        durable here. See :mod:`mycelia.node.transaction`.
        """
        self._parts.transactions.check_open()
        return Transaction(self._parts.transactions, self.credentials, wait=wait)

    async def get(self, model: type[M], entity_id: EntityId) -> M:
        """A frozen view of the entity.

        Raises EntityNotFound if it is unknown (here, and on the durable peer when
        connected), not a ``model``, deleted, or not readable with these credentials;
        InvalidArgument if ``entity_id`` is not an EntityId (a ``str`` one: parse it with
        ``EntityId.from_base64``); ConnectionClosed if the connection dropped while the
        durable peer was asked (its answer is lost: try again).
        """
        parts = self._parts.transactions
        parts.check_open()
        entity_id = check_entity_id(model, entity_id)
        entity = await parts.reads.entity(entity_id)
        snapshot = None if entity is None or not entity.exists else entity.snapshot()
        if (
            snapshot is None
            or snapshot.collection != model.__collection__
            or snapshot.deleted
            or not parts.policy.can_read(self.credentials, snapshot)
        ):
            where = (
                "here or on the durable peer"
                if parts.reads.connected()
                else "here (and no durable peer is connected to ask)"
            )
            raise EntityNotFound(f"no {model.__name__} with id {entity_id} {where}")
        return model._view(snapshot)

    async def fetch(self, model: type[M], query: str, *args: object) -> list[M]:
        """A one-shot query: the matching entities' views, in query order.

        Raises QueryError for a bad query, one naming a field ``model`` does not declare,
        or a value of the wrong type for its field; InvalidArgument for bad arguments;
        ConnectionClosed if the connection dropped while the durable peer was asked.
        """
        parts = self._parts.transactions
        parts.check_open()
        parsed = parse(query)
        bound = parsed.bind(*args)
        check_query(model, parsed, args)
        rows = await parts.reads.rows(model.__collection__, bound, query, args)
        views = []
        for stored in rows:
            state = stored.state
            snapshot = Snapshot(state.entity_id, state.collection, state.state.head, stored.values)
            if parts.policy.can_read(self.credentials, snapshot):
                views.append(model._view(snapshot))
        return views

    def query(self, model: type[M], query: str, *args: object) -> LiveQuery[M]:
        """A live query: ``async with ctx.query(Album, "year > ?", 1985) as live: ...``.

        Raises QueryError as :meth:`fetch` does; iterating it outside ``async with``
        raises UsageError.
        """
        self._parts.transactions.check_open()
        return LiveQuery(self._parts.live, self.credentials, model, query, args)

    async def history(self, model: type[M], entity_id: EntityId) -> list[AdmittedEvent]:
        """The entity's stored events, parents first (by generation, then id)."""
        await self.get(model, entity_id)  # existence, collection and read checks
        return await self._parts.history(entity_id)
