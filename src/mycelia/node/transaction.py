"""Transactions: forked copies, repeatable reads, all-or-nothing commit (ARCHITECTURE.md §5).

``async with ctx.transaction() as trx:`` commits on normal exit and rolls back on an
exception. A transaction works on forks of the entities it touches, taken when it first
touches them, so it reads the same values until it commits. Commit builds one event per
changed entity (a created entity's genesis is minted at ``create()`` so its id is known at
once; later edits become one update on it), runs every policy check on every event, and
only then makes everything durable in one atomic write; a denial or error persists nothing.
Using a transaction, or a handle from it, after commit or rollback raises
:class:`~mycelia.errors.TransactionClosed`.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from mycelia.entity import DELETED, Entity, Snapshot
from mycelia.entity.backends import TextBackend
from mycelia.entity.model import Draft, Model
from mycelia.entity.values import encode_value
from mycelia.errors import EntityNotFound, InvalidArgument, SystemNotReady, TransactionClosed
from mycelia.node.policy import Credentials, check_not_reserved
from mycelia.proto import AdmittedEvent, EntityId, Event
from mycelia.proto.event import NONCE_LENGTH

if TYPE_CHECKING:
    from mycelia.node.node import Node

__all__ = ["Transaction"]

M = TypeVar("M", bound=Model)


class Transaction:
    """A unit of local change; see the module docstring."""

    def __init__(self, node: Node, credentials: Credentials) -> None:
        self._node = node
        self._credentials = credentials
        self._drafts: dict[EntityId, Draft] = {}
        self._created: dict[EntityId, Event] = {}
        self._open = True

    async def __aenter__(self) -> Transaction:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._open:
            return
        if exc_type is None:
            await self.commit()
        else:
            await self.rollback()

    def _alive(self) -> bool:
        return self._open

    def _check_open(self) -> None:
        if not self._open:
            raise TransactionClosed("this transaction has been committed or rolled back")

    def create(self, model: type[M], **values: object) -> M:
        """Create an entity; returns a mutable handle whose ``id`` is final already.

        Raises InvalidArgument for unknown fields, missing required fields or bad values,
        and SystemNotReady if the node has no system root yet.
        """
        self._check_open()
        root = self._node.system_root
        if root is None:
            raise SystemNotReady("create_system() or join_system() before creating entities")
        unknown = set(values) - set(model._fields)
        if unknown:
            raise InvalidArgument(f"{model.__name__} has no field(s) {sorted(unknown)}")
        # Values are staged on a draft first (checked as they are set); its operations
        # become the genesis, whose id is the entity's.
        blank = Entity.empty(root, model.__collection__)
        blank.prepare_text(self._node.text_ids)
        draft = Draft(model, blank, blank.snapshot(), self._alive)
        for name, spec in model._fields.items():
            if name in values:
                draft.set(name, values[name])
            elif spec.backend == "lww" and spec.has_default and spec.default is not None:
                draft.set(name, spec.default)
            elif spec.backend == "lww" and not spec.has_default:
                raise InvalidArgument(f"{model.__name__}.{name} is required")
        genesis = Event.genesis(
            collection=model.__collection__,
            system=root,
            operations=draft.entity.take_operations(),
            nonce=self._node.entropy(NONCE_LENGTH),
            limits=self._node.limits,
        )
        entity = draft.entity.with_id(genesis.entity_id)
        entity.apply(AdmittedEvent(genesis, 1))
        entity.set_head({genesis.id: 1})
        draft.entity = entity
        draft.base = Entity.empty(genesis.entity_id, model.__collection__).snapshot()
        self._created[genesis.entity_id] = genesis
        self._drafts[genesis.entity_id] = draft
        return model._handle(draft)

    async def edit(self, model: type[M], entity_id: EntityId) -> M:
        """A mutable handle on an existing entity (forked now: repeatable reads).

        Raises EntityNotFound if the entity is unknown here or is not a ``model``.
        """
        self._check_open()
        draft = self._drafts.get(entity_id)
        if draft is None:
            entity = await self._node.applier.load(entity_id)
            if (
                entity is None
                or not entity.exists
                or entity.collection != model.__collection__
                or entity.snapshot().deleted
            ):
                raise EntityNotFound(f"no {model.__name__} with id {entity_id} here")
            fork = entity.fork(text_ids=self._node.text_ids)
            draft = Draft(model, fork, entity.snapshot(), self._alive)
            self._drafts[entity_id] = draft
        return model._handle(draft)

    async def delete(self, model: type[M], entity_id: EntityId) -> None:
        """Delete the entity (a tombstone other replicas converge on; it stays deleted).

        Raises EntityNotFound if it is unknown here, not a ``model``, or already deleted.
        """
        handle = await self.edit(model, entity_id)
        draft = self._drafts[handle.id]
        draft.entity.lww().set(DELETED, encode_value(True))

    async def commit(self) -> None:
        """Make every change durable at once (or nothing, on any error).

        Policy is checked on every event, against the entity before and after, before
        anything is written; a denial raises PolicyDenied and persists nothing.
        """
        self._check_open()
        self._open = False
        events: list[Event] = []
        for entity_id, draft in self._drafts.items():
            mine = self._events_of(entity_id, draft)
            if mine:
                check_not_reserved(draft.entity.collection)
                events.extend(mine)
        if events:
            policy, credentials = self._node.policy, self._credentials

            def check(before: Snapshot, after: Snapshot, event: AdmittedEvent) -> None:
                policy.check_event(credentials, before, after, event)

            await self._node.commit_local(events, check=check)
        # Only now: after a failure part of the edits may be published somewhere (a server
        # took them) without the resident document holding them, so the id is not reused.
        self._release_text_ids()

    async def rollback(self) -> None:
        """Discard every change."""
        self._check_open()
        self._open = False
        self._release_text_ids()
        self._drafts.clear()

    def _release_text_ids(self) -> None:
        """Give the forks' Yrs client ids back (their edits are published or discarded)."""
        for draft in self._drafts.values():
            if draft.entity.has_backend(TextBackend.name):
                self._node.text_ids.release(draft.entity.text().client_id)

    def _events_of(self, entity_id: EntityId, draft: Draft) -> list[Event]:
        """This draft's events: its genesis (if created here), then one update of its edits."""
        out = []
        genesis = self._created.get(entity_id)
        if genesis is not None:
            out.append(genesis)
        operations = draft.entity.take_operations()
        if operations:
            out.append(
                Event.update(
                    entity_id=entity_id,
                    collection=draft.entity.collection,
                    parent=draft.entity.head,
                    operations=operations,
                    limits=self._node.limits,
                )
            )
        return out
