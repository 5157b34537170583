"""Transactions: forked copies, repeatable reads, all-or-nothing commit (ARCHITECTURE.md §5).

``async with ctx.transaction() as trx:`` commits on normal exit and rolls back on an
exception. A transaction works on forks of the entities it touches, taken when it first
touches them (``edit`` reads through to the durable peer like ``get``), so it reads the
same values until it commits. Commit builds one event per changed entity (a created
entity's genesis is minted at ``create()`` so its id is known at once; later edits become
one update on it), runs every policy check on every event, and only then makes everything
durable here in one atomic write; a denial or error persists nothing. Using a
transaction, or a handle from it, after commit or rollback raises
:class:`~mycelia.errors.TransactionClosed`.

Local first (ARCHITECTURE.md §7): on an ephemeral node the commit is visible here at once
and owed to the durable peer, which confirms or refuses it later. How long ``commit``
waits is the transaction's ``wait``:

- ``"peer"`` (the default): until the durable peer confirmed it, or — when no durable peer
  is reachable, or it becomes unreachable meanwhile — until it is owed; a refusal raises
  (the commit has been reverted here by then);
- ``"local"``: until it is durable here and owed (many can then be in flight at once).

``await trx.confirmed()`` waits, in either mode, until the durable peer holds the commit,
and raises its refusal.

Misuse fails fast: a transaction dropped while still open (neither ``async with`` nor
``commit()``/``rollback()``) warns with a :class:`ResourceWarning` when it is collected,
as an unclosed file does, since its changes are lost; an entity id given as ``str`` is an
:class:`~mycelia.errors.InvalidArgument` naming ``EntityId.from_base64``; any use once
the node is closed raises :class:`~mycelia.errors.NodeClosed`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Literal, ParamSpec, TypeVar, cast

from mycelia.entity import DELETED, Entity, ForkBase, Snapshot
from mycelia.entity.backends import ClientIds, TextBackend
from mycelia.entity.draft import Draft
from mycelia.entity.model import Model
from mycelia.entity.snapshots import absent
from mycelia.entity.values import encode_value
from mycelia.errors import (
    EntityNotFound,
    InvalidArgument,
    NodeClosed,
    SystemNotReady,
    TransactionClosed,
    TransactionError,
)
from mycelia.node.policy import Credentials, PolicyAgent, check_not_reserved
from mycelia.node.ports import Commit, Commits, Reads
from mycelia.proto import AdmittedEvent, EntityId, Event, Limits
from mycelia.proto.event import NONCE_LENGTH

__all__ = ["WAITS", "Transaction", "TransactionParts", "Wait", "check_entity_id"]

M = TypeVar("M", bound=Model)
P = ParamSpec("P")

Wait = Literal["peer", "local"]
WAITS: Final = ("peer", "local")


@dataclass(frozen=True, slots=True)
class TransactionParts:
    """What a transaction works with (the node wires them)."""

    reads: Reads
    commits: Commits
    policy: PolicyAgent
    system_root: Callable[[], EntityId | None]
    limits: Limits
    text_ids: ClientIds
    entropy: Callable[[int], bytes]
    durable: bool
    """Whether the node is durable (it creates a system) or a client (it joins one)."""
    check_open: Callable[[], None]
    """Raises NodeClosed once the node is closed."""


def check_entity_id(model: type[Model], entity_id: object) -> EntityId:
    """``entity_id`` as an :class:`EntityId`; InvalidArgument for a ``str`` (naming
    ``EntityId.from_base64``) or anything else that is not 32 bytes."""
    if isinstance(entity_id, EntityId):
        return entity_id
    if isinstance(entity_id, str):
        raise InvalidArgument(
            f"{model.__name__} ids are EntityId values, not str: parse the text form with "
            f"EntityId.from_base64({entity_id!r})"
        )
    if isinstance(entity_id, bytes) and len(entity_id) == 32:
        return EntityId(entity_id)
    raise InvalidArgument(
        f"{model.__name__} ids are EntityId values (a view's .id), not {type(entity_id).__name__}"
    )


class Transaction:
    """A unit of local change; see the module docstring."""

    __slots__ = (  # (and __weakref__: a caller may hold one weakly, as before)
        "__weakref__",
        "_bases",
        "_commit",
        "_created",
        "_credentials",
        "_drafts",
        "_open",
        "_parts",
        "_wait",
    )

    def __init__(self, parts: TransactionParts, credentials: Credentials, *, wait: Wait) -> None:
        if wait not in WAITS:
            raise InvalidArgument(f"wait must be one of {WAITS}, not {wait!r}")
        self._parts = parts
        self._credentials = credentials
        self._wait = wait
        self._drafts: dict[EntityId, Draft] = {}
        self._bases: dict[EntityId, ForkBase] = {}
        self._created: dict[EntityId, Event] = {}
        self._open = True
        self._commit: Commit | None = None

    def __del__(self) -> None:
        if getattr(self, "_open", False) and not self._node_closed():
            touched = len(self._drafts)
            lost = f": its changes to {touched} entities are lost" if touched else ""
            warnings.warn(
                f"a Transaction was dropped without being committed or rolled back{lost}; "
                f"use 'async with ctx.transaction() as trx:' or 'await trx.commit()'",
                ResourceWarning,
                source=self,
                stacklevel=2,
            )

    def _node_closed(self) -> bool:
        """Whether the node is closed (then NodeClosed said it all: no warning)."""
        try:
            self._parts.check_open()
        except NodeClosed:
            return True
        return False

    async def __aenter__(self) -> Transaction:
        try:
            self._parts.check_open()
        except BaseException:
            self._open = False  # never usable: nothing to warn about
            raise
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
        self._parts.check_open()
        if not self._open:
            raise TransactionClosed("this transaction has been committed or rolled back")

    def create(self, model: Callable[P, M], /, *args: P.args, **values: P.kwargs) -> M:
        """Create an entity; returns a mutable handle whose ``id`` is final already.

        Field values are keyword arguments, typed for type checkers (``trx.create(Note,
        title=5)`` is a mypy error when ``title`` is a ``str``). Raises InvalidArgument for
        unknown fields, missing required fields or bad values, and SystemNotReady if the
        node has no system root yet.
        """
        self._check_open()
        if args:
            raise InvalidArgument("trx.create takes field values by keyword only")
        return self._create(cast("type[M]", model), values)

    def _create(self, model: type[M], values: dict[str, object]) -> M:
        root = self._parts.system_root()
        if root is None:
            raise SystemNotReady(
                "this node has no system root yet: create_system() or join_system() first"
                if self._parts.durable
                else "this client has not joined a system yet: connect once to a server to "
                "join its system (or, to work offline from the very first run, "
                "join_system() with the system's root events shipped with the app)"
            )
        unknown = set(values) - set(model._fields)
        if unknown:
            raise InvalidArgument(f"{model.__name__} has no field(s) {sorted(unknown)}")
        # Values are staged on a draft first (checked as they are set); its operations
        # become the genesis, whose id is the entity's.
        blank = Entity.empty(root, model.__collection__)
        blank.prepare_text(self._parts.text_ids)
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
            nonce=self._parts.entropy(NONCE_LENGTH),
            limits=self._parts.limits,
        )
        entity = draft.entity.with_id(genesis.entity_id)
        entity.apply(AdmittedEvent(genesis, 1))
        entity.set_head({genesis.id: 1})
        draft.entity = entity
        draft.base = absent(genesis.entity_id, model.__collection__)
        self._created[genesis.entity_id] = genesis
        self._drafts[genesis.entity_id] = draft
        return model._handle(draft)

    async def edit(self, model: type[M], entity_id: EntityId) -> M:
        """A mutable handle on an existing entity (forked now: repeatable reads).

        Reads through like ``ctx.get``: a connected ephemeral node asks its durable peer
        first, unless the entity is held and kept current by a live query. Raises
        EntityNotFound if the entity is unknown (here, and on the peer when connected),
        deleted, or not a ``model``; ConnectionClosed if the connection dropped while the
        peer was asked (its answer is lost: try again).
        """
        self._check_open()
        entity_id = check_entity_id(model, entity_id)
        draft = self._drafts.get(entity_id)
        if draft is None:
            entity = await self._parts.reads.entity(entity_id)
            if (
                entity is None
                or not entity.exists
                or entity.collection != model.__collection__
                or entity.snapshot().deleted
            ):
                raise EntityNotFound(self._not_found(model, entity_id))
            self._bases[entity_id] = self._parts.commits.base(entity)
            fork = entity.fork(text_ids=self._parts.text_ids)
            draft = Draft(model, fork, entity.snapshot(), self._alive)
            self._drafts[entity_id] = draft
        return model._handle(draft)

    def _not_found(self, model: type[Model], entity_id: EntityId) -> str:
        where = (
            "here or on the durable peer"
            if self._parts.reads.connected()
            else "here (this node does not hold it, and no durable peer is connected to ask)"
        )
        return f"no {model.__name__} with id {entity_id} {where}"

    async def delete(self, model: type[M], entity_id: EntityId) -> None:
        """Delete the entity (a tombstone other replicas converge on; it stays deleted).

        Raises EntityNotFound if it is unknown here, not a ``model``, or already deleted.
        """
        handle = await self.edit(model, entity_id)
        draft = self._drafts[handle.id]
        draft.entity.lww().set(DELETED, encode_value(True))

    async def commit(self) -> None:
        """Make every change durable here at once (or nothing, on any error), then wait as
        the transaction's ``wait`` says (see the module docstring).

        Policy is checked on every event, against the entity before and after, before
        anything is written; a denial raises PolicyDenied and persists nothing. With
        ``wait="peer"``, the durable peer's refusal raises too (PolicyDenied, or
        CommitReverted when this commit was built on a refused one).
        """
        self._check_open()
        self._open = False
        events: list[Event] = []
        for entity_id, draft in self._drafts.items():
            mine = self._events_of(entity_id, draft)
            if mine:
                check_not_reserved(draft.entity.collection)
                events.extend(mine)
        try:
            if events:
                policy, credentials = self._parts.policy, self._credentials

                def check(before: Snapshot, after: Snapshot, event: AdmittedEvent) -> None:
                    policy.check_event(credentials, before, after, event)

                self._commit = await self._parts.commits.commit(
                    events, bases=self._bases, check=check
                )
        finally:
            # The resident documents now hold every item the forks made (or none of them):
            # their client ids may serve the next forks.
            self._release_text_ids()
            # Drafts point back here (their ``alive``): dropping them breaks the cycle, so
            # the forks are freed at once instead of by the garbage collector. A handle
            # kept for its confirmation (an editor keeps thousands) holds nothing else.
            self._drafts.clear()
            self._bases.clear()
            self._created.clear()
        if self._commit is not None and self._wait == "peer":
            await self._commit.settled()

    async def confirmed(self) -> None:
        """Wait until the durable peer holds this transaction's commit (at once on a
        durable node, or if it changed nothing); raises the peer's refusal.

        Raises TransactionError before the transaction has committed.
        """
        if self._open:
            raise TransactionError("commit the transaction before waiting for its confirmation")
        if self._commit is not None:
            await self._commit.confirmed()

    async def rollback(self) -> None:
        """Discard every change."""
        if not self._open:
            raise TransactionClosed("this transaction has been committed or rolled back")
        self._open = False
        self._release_text_ids()
        self._drafts.clear()

    def _release_text_ids(self) -> None:
        """Give the forks' Yrs client ids back (their edits are published or discarded)."""
        for draft in self._drafts.values():
            if draft.entity.has_backend(TextBackend.name):
                self._parts.text_ids.release(draft.entity.text().client_id)

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
                    limits=self._parts.limits,
                )
            )
        return out
