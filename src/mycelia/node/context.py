"""Contexts: a node seen with one set of credentials (ARCHITECTURE.md §11).

Everything an application does goes through a context: transactions, ``get``,
``history``, ``fetch`` and live ``query``. Reads are filtered by the policy agent's
``can_read`` for the context's credentials.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from mycelia.entity.model import Model
from mycelia.errors import EntityNotFound
from mycelia.node.policy import Credentials
from mycelia.node.transaction import Transaction
from mycelia.proto import AdmittedEvent, EntityId

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

        Raises EntityNotFound if it is unknown here, not a ``model``, or not readable.
        """
        entity = await self._node.applier.load(entity_id)
        if entity is None or not entity.exists or entity.collection != model.__collection__:
            raise EntityNotFound(f"no {model.__name__} with id {entity_id} here")
        snapshot = entity.snapshot()
        if not self._node.policy.can_read(self.credentials, snapshot):
            raise EntityNotFound(f"no {model.__name__} with id {entity_id} here")
        return model._view(snapshot)

    async def history(self, model: type[M], entity_id: EntityId) -> list[AdmittedEvent]:
        """The entity's stored events, parents first (by generation, then id)."""
        await self.get(model, entity_id)  # existence, collection and read checks
        return await self._node.storage.events_of(entity_id)
