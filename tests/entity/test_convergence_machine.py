"""The convergence state machine (ARCHITECTURE.md §12).

Several nodes make concurrent edits to several fields (LWW and Text) of several entities
and exchange history in arbitrary orders: shuffled, duplicated, split into batches,
children before parents. After every step, any two nodes that hold the same events of an
entity hold identical heads, identical values, byte-identical LWW state buffers and equal
text — and byte-identical text state buffers too (Yrs encodes a document's blocks per
client, so the same set of updates encodes the same way; this machine checks it).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine
from typing import Any, TypeVar

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mycelia import Model, Node, Text
from mycelia.proto import AdmittedEvent, EntityId
from mycelia.storage import MemoryStorage

NODES = 3
T = TypeVar("T")


class Note(Model, collection="notes"):
    title: str | None = None
    rank: int | None = None
    body: Text = Text()


class Convergence(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.nodes: list[Node] = self.run(self._open())
        self.entities: list[EntityId] = []

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    async def _open(self) -> list[Node]:
        first = await Node.open(MemoryStorage(), durable=True)
        await first.create_system()
        nodes = [first]
        for _ in range(NODES - 1):
            node = await Node.open(MemoryStorage(), durable=True)
            await node.join_system(await first.system_events())
            nodes.append(node)
        return nodes

    def teardown(self) -> None:
        self.loop.close()

    @rule(at=st.integers(0, NODES - 1), title=st.text(max_size=3), body=st.text(max_size=5))
    def create(self, at: int, title: str, body: str) -> None:
        async def go() -> EntityId:
            async with self.nodes[at].context().transaction() as trx:
                return trx.create(Note, title=title, body=body).id

        self.entities.append(self.run(go()))

    @precondition(lambda self: self.entities)
    @rule(
        at=st.integers(0, NODES - 1),
        pick=st.integers(0, 100),
        title=st.none() | st.text(max_size=3),
        rank=st.none() | st.integers(-3, 3),
        insert=st.tuples(st.integers(0, 20), st.text(max_size=3)),
        delete=st.tuples(st.integers(0, 20), st.integers(0, 3)),
    )
    def edit(
        self,
        at: int,
        pick: int,
        title: str | None,
        rank: int | None,
        insert: tuple[int, str],
        delete: tuple[int, int],
    ) -> None:
        entity = self.entities[pick % len(self.entities)]
        node = self.nodes[at]

        async def go() -> None:
            if await node.storage.get_state(entity) is None:
                return  # this node has not heard of the entity yet
            async with node.context().transaction() as trx:
                note = await trx.edit(Note, entity)
                note.title = title
                note.rank = rank
                text = str(note.body)
                i = min(insert[0], len(text))
                note.body.insert(i, insert[1])  # an empty insert makes a delete-only edit
                start = min(delete[0], len(text))
                note.body.delete(start, min(delete[1], len(text) + len(insert[1]) - start))

        self.run(go())

    @rule(
        src=st.integers(0, NODES - 1),
        dst=st.integers(0, NODES - 1),
        seed=st.integers(0, 2**32),
        batches=st.integers(1, 4),
        duplicates=st.booleans(),
        keep=st.floats(0.3, 1.0),
    )
    def sync(
        self, src: int, dst: int, seed: int, batches: int, duplicates: bool, keep: float
    ) -> None:
        """Send (part of) source's history to target, shuffled, duplicated, in batches."""
        rng = random.Random(seed)

        async def go() -> None:
            events: list[AdmittedEvent] = []
            for entity in self.entities:
                events.extend(await self.nodes[src].storage.events_of(entity))
            events = [e for e in events if rng.random() < keep]
            if duplicates:
                events += rng.sample(events, len(events) // 2)
            rng.shuffle(events)
            for i in range(batches):
                await self.nodes[dst].ingest(events[i::batches])

        self.run(go())

    @rule(seed=st.integers(0, 2**32))
    def gossip(self, seed: int) -> None:
        """Every node sends everything to every other, in a random pair order."""
        rng = random.Random(seed)
        pairs = [(a, b) for a in range(NODES) for b in range(NODES) if a != b]
        rng.shuffle(pairs)
        for a, b in pairs:
            self.sync(a, b, rng.getrandbits(32), rng.randint(1, 3), rng.random() < 0.5, 1.0)

    @invariant()
    def replicas_with_the_same_events_agree(self) -> None:
        async def check() -> None:
            for entity in self.entities:
                seen: dict[frozenset[object], tuple[object, ...]] = {}
                for node in self.nodes:
                    events = frozenset(e.id for e in await node.storage.events_of(entity))
                    state = await node.storage.get_state(entity)
                    if state is None:
                        assert not events, "events stored without a state"
                        continue
                    assert set(state.state.head) <= events, "a head references a missing event"
                    fingerprint = (
                        state.state.head,
                        state.state.buffer("lww"),
                        state.state.buffer("text"),
                    )
                    view = await node.context().get(Note, entity)
                    summary = (*fingerprint, view.title, view.rank, str(view.body))
                    if events in seen:
                        assert seen[events] == summary, "replicas with the same events differ"
                    seen[events] = summary
                    assert view.head == state.state.head

        self.run(check())

    @invariant()
    def heads_are_antichains(self) -> None:
        async def check() -> None:
            for node in self.nodes:
                for entity in self.entities:
                    state = await node.storage.get_state(entity)
                    if state is None or len(state.state.head) < 2:
                        continue
                    events = {e.id: e for e in await node.storage.events_of(entity)}
                    for tip in state.state.head:
                        stack, seen = list(events[tip].parent), set()
                        while stack:
                            eid = stack.pop()
                            assert eid not in state.state.head, "a head tip is another's ancestor"
                            if eid not in seen and eid in events:
                                seen.add(eid)
                                stack.extend(events[eid].parent)

        self.run(check())

    def full_sync(self) -> None:
        for source in range(NODES):
            for target in range(NODES):
                self.sync(source, target, 0, 1, False, 1.0)


# The profile decides how hard to look: dev (60 programs), ci (200), each 20 steps.
Convergence.TestCase.settings = settings(
    max_examples=settings().max_examples, stateful_step_count=20, deadline=None
)
TestConvergence = Convergence.TestCase


class ConvergenceToTheEnd(Convergence):
    """Same machine; at teardown everyone exchanges everything and must be identical."""

    def teardown(self) -> None:
        self.full_sync()
        self.full_sync()

        async def check() -> None:
            for entity in self.entities:
                states = {
                    (s.state.head, s.state.buffers)
                    for node in self.nodes
                    if (s := await node.storage.get_state(entity)) is not None
                }
                assert len(states) == 1, "replicas differ after a full exchange"

        self.run(check())
        super().teardown()


ConvergenceToTheEnd.TestCase.settings = settings(
    max_examples=max(30, settings().max_examples // 2), stateful_step_count=20, deadline=None
)
TestConvergenceToTheEnd = ConvergenceToTheEnd.TestCase
