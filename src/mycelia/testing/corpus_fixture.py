"""The adversarial corpus's fixture: a seeded node holding two notes, and what one corpus
item is (the items themselves: :mod:`mycelia.testing.corpus_items`).

Invariant: opening the fixture twice with the same seed gives the same node, events and
ids, so the items built from it are the same bytes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final

from mycelia.entity.fieldtypes import Text
from mycelia.entity.model import Model
from mycelia.node import Node
from mycelia.proto import EntityId, Event
from mycelia.storage import MemoryStorage

__all__ = [
    "FIXTURE_SEED",
    "CorpusItem",
    "CorpusNote",
    "Fixture",
    "Row",
    "open_fixture",
    "seeded_node",
]

FIXTURE_SEED: Final = "mycelia-corpus/fixture/1"

Row = tuple[str, str, bytes, str]
"""(name, description, frame, expected outcome)."""


class CorpusNote(Model, collection="corpus_notes"):
    """The fixture's model."""

    text: str
    body: Text


@dataclass(frozen=True)
class Fixture:
    """A node the corpus targets, and the events it holds."""

    node: Node
    root: EntityId
    a: tuple[Event, ...]
    """Note A: its genesis, then one edit."""
    b: tuple[Event, ...]
    """Note B: its genesis."""


@dataclass(frozen=True)
class CorpusItem:
    """One hostile input and the outcomes it may get (see :mod:`mycelia.testing.corpus`)."""

    name: str
    category: str
    description: str
    frames: tuple[bytes, ...]
    expect: tuple[str, ...]
    phase: str = "ready"
    """``raw``: sent before any handshake; ``ready``: after a completed handshake."""
    handshake_root: bytes | None = None
    """The system root the client announces (``None``: the fixture's)."""


async def seeded_node(seed: str) -> Node:
    """A durable node with its own system, all its entropy drawn from ``seed``."""
    node = await Node.open(MemoryStorage(), durable=True, rng=random.Random(seed))
    await node.create_system()
    return node


async def open_fixture(seed: str = FIXTURE_SEED) -> Fixture:
    """A node holding note A (created, then edited) and note B, from fixed entropy."""
    node = await seeded_node(seed)
    async with node.context().transaction() as trx:
        a = trx.create(CorpusNote, text="a", body="alpha")
        b = trx.create(CorpusNote, text="b", body="beta")
    async with node.context().transaction() as trx:
        (await trx.edit(CorpusNote, a.id)).text = "a2"
    events = [tuple(e.event for e in await node.storage.events_of(x.id)) for x in (a, b)]
    assert node.system_root is not None
    return Fixture(node, node.system_root, events[0], events[1])
