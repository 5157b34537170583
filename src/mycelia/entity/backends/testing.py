"""The property-backend conformance suite, as library code (STYLE.md §16).

``check_backend(make_events, backend_class)`` takes a small history (a list of admitted
events, parents first, whose operations include diffs for ``backend_class.name``) and
checks the laws every backend must satisfy:

- order independence: every causal delivery order gives the same state buffer
  (``same_buffer=True``) or the same values;
- idempotence: applying every event twice changes nothing;
- round trip: ``from_state(to_state())`` yields the same buffer and values;
- merge: joining two replicas' states equals applying the union of their events.

It raises AssertionError with a readable message on the first law broken. It needs no
test framework, so any engine (and any user's custom backend) can run it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar, Protocol, Self

from mycelia.proto import AdmittedEvent

__all__ = ["ConformingBackend", "check_backend"]


class ConformingBackend(Protocol):
    """The part of the backend protocol the suite exercises."""

    name: ClassVar[str]

    @classmethod
    def empty(cls) -> Self: ...
    @classmethod
    def from_state(cls, buffer: bytes) -> Self: ...
    def to_state(self) -> bytes: ...
    def apply(self, event: AdmittedEvent, diffs: tuple[bytes, ...]) -> set[str]: ...
    def merge(self, other: Self) -> set[str]: ...
    def values(self) -> dict[str, object]: ...


def _replay(cls: type[ConformingBackend], events: Sequence[AdmittedEvent]) -> ConformingBackend:
    backend = cls.empty()
    for event in events:
        backend.apply(event, event.event.diffs(cls.name))
    return backend


def _causal_orders(
    events: Sequence[AdmittedEvent], rng: random.Random, count: int
) -> list[list[AdmittedEvent]]:
    """Up to ``count`` random parent-first orders of ``events``."""
    orders = []
    for _ in range(count):
        remaining = list(events)
        placed: set[object] = set()
        order = []
        while remaining:
            ready = [
                e for e in remaining if all(p in placed for p in e.parent if p in _ids(events))
            ]
            pick = rng.choice(ready)
            remaining.remove(pick)
            placed.add(pick.id)
            order.append(pick)
        orders.append(order)
    return orders


def _ids(events: Sequence[AdmittedEvent]) -> set[object]:
    return {e.id for e in events}


def check_backend(
    backend_class: type[ConformingBackend],
    events: Sequence[AdmittedEvent],
    *,
    same_buffer: bool = True,
    seed: int = 0,
    orders: int = 12,
) -> None:
    """Check the backend laws on ``events`` (parents first); see the module docstring."""
    rng = random.Random(seed)
    reference = _replay(backend_class, events)
    ref_buffer, ref_values = reference.to_state(), reference.values()
    for order in _causal_orders(events, rng, orders):
        replica = _replay(backend_class, order)
        if same_buffer:
            assert replica.to_state() == ref_buffer, "order changed the state buffer"
        assert replica.values() == ref_values, "order changed the values"
    twice = _replay(backend_class, [*events, *events])
    assert twice.values() == ref_values, "applying events twice changed the values"
    if same_buffer:
        assert twice.to_state() == ref_buffer, "applying events twice changed the buffer"
    again = backend_class.from_state(ref_buffer)
    assert again.values() == ref_values, "round trip changed the values"
    assert again.to_state() == ref_buffer or not same_buffer, "round trip changed the buffer"
    # A replica always holds an ancestor-closed set of events; merge two that cover all.
    for cut in range(len(events) + 1):
        left = _replay(backend_class, events[:cut])
        right = _replay(backend_class, _closure(events, events[cut:]))
        left.merge(right)
        assert left.values() == ref_values, f"merging at {cut} lost writes"


def _closure(
    events: Sequence[AdmittedEvent], wanted: Sequence[AdmittedEvent]
) -> list[AdmittedEvent]:
    """``wanted`` and all their ancestors among ``events``, parents first."""
    by_id = {e.id: e for e in events}
    keep: set[object] = set()
    stack = [e.id for e in wanted]
    while stack:
        eid = stack.pop()
        if eid in keep or eid not in by_id:
            continue
        keep.add(eid)
        stack.extend(by_id[eid].parent)
    return [e for e in events if e.id in keep]
