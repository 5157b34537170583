"""An entity's head as it advances: the antichain, its clock and its top generation."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mycelia.entity.entity import Entity
from mycelia.proto import Clock
from mycelia.testing.dags import DagShape, dag_shapes


@given(
    shape=dag_shapes(max_events=24, extra_roots=False),
    cuts=st.lists(st.integers(1, 4), min_size=24, max_size=24),
    reads=st.lists(st.booleans(), min_size=24, max_size=24),
)
def test_the_head_advances_to_the_maximal_events_and_keeps_its_top(
    shape: DagShape, cuts: list[int], reads: list[bool]
) -> None:
    """Events applied in batches, parents first: after each, the head is the events no
    applied event names, its clock is theirs in order, and ``top_generation`` is their
    largest generation, whether or not the clock and top were read before (a cached one
    is moved, an unread one computed)."""
    dag, events = shape.build()
    entity = Entity.empty(dag.entity_id, dag.collection)
    assert entity.top_generation == 0
    done = 0
    for cut, read in zip(cuts, reads, strict=True):
        batch, done = events[done : done + cut], done + cut
        if not batch:
            break
        if read:
            assert entity.head == Clock(entity.head_map)
            assert entity.top_generation == max(entity.head_map.values(), default=0)
        entity.advance(batch)
        applied = events[:done]
        named = {p for e in applied for p in e.parent}
        expected = {e.id: e.generation for e in applied if e.id not in named}
        assert dict(entity.head_map) == expected
        assert entity.head == Clock(expected)
        assert entity.top_generation == max(expected.values())


def test_setting_the_head_recomputes_its_top() -> None:
    """A head set whole (a comparison's merged head) drops the kept top: the next read
    computes the new head's, even when it is lower."""
    shape = DagShape(((), (0,), (1,), (2,)))
    dag, events = shape.build()
    entity = Entity.empty(dag.entity_id, dag.collection)
    entity.advance(events)
    assert entity.top_generation == 4
    entity.set_head({events[1].id: events[1].generation})
    assert entity.top_generation == 2


def test_entities_with_the_same_one_tip_head_share_its_clock() -> None:
    """Each client of a process that follows an entity holds its head: a head of one tip
    is the shared clock of that id (:meth:`Clock.single`), moved there by one event or read
    fresh, so a hundred clients keep one clock of it, not a hundred."""
    dag, events = DagShape(((), (0,), (1,))).build()
    linear, batched = (Entity.empty(dag.entity_id, dag.collection) for _ in range(2))
    for event in events:
        linear.advance([event])
        assert linear.head is Clock.single(event.id)
    batched.advance(events)
    assert batched.head is linear.head, "read fresh"
    assert Entity.empty(dag.entity_id, dag.collection).head == Clock()
