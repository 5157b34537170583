"""Contexts: a node seen with one set of credentials (ARCHITECTURE.md §11).

Everything an application does goes through a context: transactions, ``get``,
``history``, ``fetch`` and live ``query``. Reads are filtered by the policy agent's
``can_read`` for the context's credentials.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from mycelia.entity import Snapshot
from mycelia.entity.model import Model
from mycelia.errors import ConnectionClosed, EntityNotFound, RequestTimeout
from mycelia.node.deltas import query_rows
from mycelia.node.live import LiveQuery
from mycelia.node.policy import Credentials
from mycelia.node.transaction import Transaction
from mycelia.proto import AdmittedEvent, EntityId
from mycelia.proto.peering import (
    DeltasResponse,
    FetchRequest,
    GetRequest,
    KnownEntity,
)
from mycelia.proto.query import parse

if TYPE_CHECKING:
    from mycelia.node.node import Node

__all__ = ["Context"]

M = TypeVar("M", bound=Model)


class Context:
    """The node as one caller sees it."""

    def __init__(self, node: Node, credentials: Credentials) -> None:
        self._node = node
        self.credentials = credentials

    @property
    def node(self) -> Node:
        """The node this context reads and writes."""
        return self._node

    def transaction(self) -> Transaction:
        """A new transaction (use ``async with``: commit on exit, rollback on error)."""
        return Transaction(self._node, self.credentials)

    async def get(self, model: type[M], entity_id: EntityId) -> M:
        """A frozen view of the entity.

        On an ephemeral node with a connected durable peer, its current state is asked
        for first and merged. Raises EntityNotFound if it is unknown, not a ``model``, or
        not readable.
        """
        upstream = self._node.upstream
        if upstream is not None and upstream.peer is not None and upstream.peer.ready:
            held = await self._node.applier.load(entity_id)
            known = (KnownEntity(entity_id, held.head.ids),) if held and held.exists else ()
            try:
                response = await upstream.request(lambda rid: GetRequest(rid, (entity_id,), known))
            except (ConnectionClosed, RequestTimeout):
                pass  # offline: answer from what is here
            else:
                assert isinstance(response, DeltasResponse)
                await upstream.apply_deltas(response.deltas)
        entity = await self._node.applier.load(entity_id)
        if entity is None or not entity.exists or entity.collection != model.__collection__:
            raise EntityNotFound(f"no {model.__name__} with id {entity_id} here")
        snapshot = entity.snapshot()
        if snapshot.deleted or not self._node.policy.can_read(self.credentials, snapshot):
            raise EntityNotFound(f"no {model.__name__} with id {entity_id} here")
        return model._view(snapshot)

    async def fetch(self, model: type[M], query: str, *args: object) -> list[M]:
        """A one-shot query: the matching entities' views, in query order.

        On an ephemeral node with a connected durable peer, the peer is asked first (with
        the heads held here, so only what is missing travels) and the answer applied.
        Raises QueryError for a bad query and InvalidArgument for bad arguments.
        """
        bound = parse(query).bind(*args)
        collection = model.__collection__
        upstream = self._node.upstream
        if upstream is not None and upstream.peer is not None and upstream.peer.ready:
            known = [
                KnownEntity(stored.state.entity_id, stored.state.state.head.ids)
                for stored in await query_rows(self._node.storage, collection, bound)
            ]
            try:
                response = await upstream.request(
                    lambda rid: FetchRequest(rid, collection, query, args, tuple(known))
                )
            except (ConnectionClosed, RequestTimeout):
                pass  # offline: answer from what is here
            else:
                assert isinstance(response, DeltasResponse)
                await upstream.apply_deltas(response.deltas)
        views = []
        for stored in await query_rows(self._node.storage, collection, bound):
            state = stored.state
            snapshot = Snapshot(state.entity_id, state.collection, state.state.head, stored.values)
            if self._node.policy.can_read(self.credentials, snapshot):
                views.append(model._view(snapshot))
        return views

    def query(self, model: type[M], query: str, *args: object) -> LiveQuery[M]:
        """A live query: ``async with ctx.query(Album, "year > ?", 1985) as live: ...``."""
        return LiveQuery(self, model, query, args)

    async def history(self, model: type[M], entity_id: EntityId) -> list[AdmittedEvent]:
        """The entity's stored events, parents first (by generation, then id)."""
        await self.get(model, entity_id)  # existence, collection and read checks
        return await self._node.storage.events_of(entity_id)
