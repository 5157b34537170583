"""The engine-agreement machine: engines driven in lockstep must agree (ARCHITECTURE.md §6).

:class:`EngineAgreement` writes random batches (new entities, updates on any events,
re-sent events, states with random values, meta records, forgotten entities, batches that
must fail) to every engine of its ``specs``, reopens the durable ones and fetches random
queries. After every step each write must have had the same outcome everywhere, each
fetch must equal ``sort_rows`` over that engine's scan and the other engines' fetch, and
all engines must hold the same content. :func:`agreement_machine` builds one for given
engines; :mod:`mycelia.storage.testing` re-exports both. The module needs hypothesis.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, ClassVar, TypeVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mycelia.errors import StorageError
from mycelia.proto import AdmittedEvent, EntityId
from mycelia.proto.query import After, Query
from mycelia.retrieval import WriteBatch
from mycelia.storage.engine import StorageEngine
from mycelia.storage.testing_data import engine_content, genesis, state_of, update
from mycelia.storage.testing_queries import fetch_matches_scan, fetch_queries

if TYPE_CHECKING:
    from mycelia.storage.testing import EngineSpec

__all__ = ["EngineAgreement", "agreement_machine"]

T = TypeVar("T")

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=4)
    | st.binary(max_size=4)
)
_VALUES = st.dictionaries(
    st.sampled_from(["a", "b", "c"]),
    st.recursive(
        _SCALARS,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
        ),
        max_leaves=6,
    ),
    max_size=3,
)
_COLLECTIONS = st.sampled_from(["items", "others"])
_AFTER = st.binary(min_size=32, max_size=32).map(EntityId)  # ids are hashes: any split


class EngineAgreement(RuleBasedStateMachine):
    """Drives the engines of ``specs`` in lockstep; they must agree after every step.

    Rules write random batches (new entities, updates on any events, re-sent events,
    states with random values, meta records, forgotten entities, batches that must fail) to
    every engine,
    reopen the durable ones and fetch random queries; every write must have the same
    outcome everywhere, every fetch must equal ``sort_rows`` over that engine's scan and
    the other engines' fetch, and all engines must hold the same content
    (:func:`engine_content`). Build a concrete machine
    with :func:`agreement_machine`.
    """

    specs: ClassVar[tuple[EngineSpec, ...]] = ()

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.engines: list[StorageEngine] = [self.run(spec.fresh()) for spec in self.specs]
        self.events: dict[EntityId, list[AdmittedEvent]] = {}
        self.made = 0

    def run(self, work: Awaitable[T]) -> T:
        """Run ``work`` on the machine's own event loop."""
        return self.loop.run_until_complete(work)

    def write_all(self, batch: WriteBatch) -> None:
        """Write ``batch`` to every engine; the outcomes must be identical."""
        outcomes: list[object] = []
        for engine in self.engines:
            try:
                result = self.run(engine.write(batch))
                outcomes.append((result.new_events, result.offsets))
            except StorageError:
                outcomes.append("failed")
        assert all(o == outcomes[0] for o in outcomes), f"write outcomes differ: {outcomes}"

    @rule(collection=_COLLECTIONS, states=st.integers(0, 1), values=_VALUES)
    def create(self, collection: str, states: int, values: dict[str, object]) -> None:
        self.made += 1
        g = genesis(collection, self.made)
        self.events[g.entity_id] = [g]
        self.write_all(WriteBatch((g,), (state_of([g], values),) * states))

    @precondition(lambda self: bool(self.events))
    @rule(data=st.data(), values=_VALUES, resend=st.integers(0, 3))
    def extend(self, data: st.DataObject, values: dict[str, object], resend: int) -> None:
        known = self.events[data.draw(st.sampled_from(sorted(self.events)))]
        parents = data.draw(st.lists(st.sampled_from(known), min_size=1, max_size=2))
        self.made += 1
        event = update(parents, b"%d" % self.made)
        old = data.draw(st.lists(st.sampled_from(known), max_size=resend))
        known.append(event)
        heads = data.draw(st.lists(st.sampled_from(known), min_size=1, max_size=2))
        self.write_all(WriteBatch((*old, event), (state_of(heads, values),)))

    @rule(key=st.sampled_from(["k1", "k2"]), value=st.none() | st.binary(max_size=4))
    def meta(self, key: str, value: bytes | None) -> None:
        self.write_all(WriteBatch(meta=((key, value),)))

    @precondition(lambda self: bool(self.events))
    @rule(data=st.data())
    def forget(self, data: st.DataObject) -> None:
        entity_id = data.draw(st.sampled_from(sorted(self.events)))
        del self.events[entity_id]
        self.write_all(WriteBatch(forget=(entity_id,)))

    @rule(collection=_COLLECTIONS)
    def failing_batch(self, collection: str) -> None:
        g = genesis(collection, 10**9)
        bad = state_of([g], {"x": object()})
        self.write_all(WriteBatch((g,), (state_of([g]), bad), (("k1", b"lost"),)))

    @rule(
        collection=_COLLECTIONS,
        query=fetch_queries(),
        cut=st.none() | st.tuples(_AFTER, _VALUES),
    )
    def fetch(
        self, collection: str, query: Query, cut: tuple[EntityId, dict[str, object]] | None
    ) -> None:
        # A position as a page's last row gives one: an id, and a row's values for its key.
        after = None if cut is None else After.row(query, *cut)
        found = [
            self.run(fetch_matches_scan(engine, collection, query, name=spec.name, after=after))
            for spec, engine in zip(self.specs, self.engines, strict=True)
        ]
        assert all(f == found[0] for f in found), f"fetch({query}) differs: {found}"

    @precondition(lambda self: any(s.reopen for s in self.specs))
    @rule()
    def reopen(self) -> None:
        for i, spec in enumerate(self.specs):
            if spec.reopen is not None:
                self.engines[i] = self.run(spec.reopen(self.engines[i]))

    @invariant()
    def engines_agree(self) -> None:
        contents = [self.run(engine_content(engine)) for engine in self.engines]
        for spec, content in zip(self.specs[1:], contents[1:], strict=True):
            assert content == contents[0], f"{spec.name} disagrees with {self.specs[0].name}"

    def teardown(self) -> None:
        for engine in self.engines:
            self.run(engine.close())
        self.loop.close()


def agreement_machine(specs: Sequence[EngineSpec]) -> type[EngineAgreement]:
    """An :class:`EngineAgreement` driving ``specs`` (run it with hypothesis's
    ``run_state_machine_as_test``, or take its ``TestCase``)."""
    return type("EngineAgreement", (EngineAgreement,), {"specs": tuple(specs)})
