"""Layers of a diverged result, and the deterministic topological sort."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mycelia.errors import InvalidEvent, LineageError
from mycelia.event_dag import DivergedSince, compare_with, topological_sort
from mycelia.proto import Clock, Event, EventId
from mycelia.testing.dags import Dag, DagShape, ancestry, dag_shapes


def test_a_merge_event_comes_after_every_parent_including_one_off_the_meet() -> None:
    dag = Dag()
    dag.root("A")
    dag.child("B", "A")
    dag.child("G", "A")
    dag.child("C", "B")
    dag.child("E", "C", "G")
    result = compare_with(dag.events, dag.clock("E"), dag.clock("B"))
    layers = result.into_layers()
    order = [dag.name_of(e.id) for layer in layers for e in layer.to_apply]
    assert set(order) == {"G", "C", "E"}
    assert order.index("E") > order.index("C")
    assert order.index("E") > order.index("G")


@given(dag_shapes(extra_roots=False, min_events=2), st.data())
def test_layers_hold_every_event_since_the_meet_once_parents_first(
    shape: DagShape, data: st.DataObject
) -> None:
    dag, events = shape.build()
    n = len(events)
    s = Clock([events[data.draw(st.integers(0, n - 1))].id])
    o = Clock([events[data.draw(st.integers(0, n - 1))].id])
    result = compare_with(dag.events, s, o)
    if not isinstance(result.relation, DivergedSince):
        return
    parents = {e.id: e.parent for e in events}
    a_s, a_o = ancestry(parents, s), ancestry(parents, o)
    layers = result.into_layers()
    to_apply = [e.id for layer in layers for e in layer.to_apply]
    applied = [e.id for layer in layers for e in layer.already_applied]
    assert sorted(to_apply) == sorted(a_s - a_o)
    assert sorted(applied) == sorted(a_o - a_s)
    position = {
        eid: i
        for i, layer in enumerate(layers)
        for eid in [e.id for e in (*layer.to_apply, *layer.already_applied)]
    }
    for eid, layer_index in position.items():
        for parent in parents[eid]:
            if parent in position:
                assert position[parent] < layer_index
    for layer in layers:  # an antichain: no event of a layer is an ancestor of another
        ids = [e.id for e in (*layer.to_apply, *layer.already_applied)]
        for a in ids:
            assert not (ancestry(parents, parents[a]) & set(ids))


def test_layers_are_refused_for_a_result_without_divergence() -> None:
    dag = Dag()
    dag.root("A")
    dag.child("B", "A")
    with pytest.raises(LineageError):
        compare_with(dag.events, dag.clock("A"), dag.clock("B")).into_layers()


@given(dag_shapes(), st.randoms(use_true_random=False))
def test_the_topological_sort_is_valid_and_the_same_for_every_permutation(
    shape: DagShape, rng: random.Random
) -> None:
    _, events = shape.build()
    shuffled = list(events) + events[: len(events) // 2]  # duplicates collapse
    rng.shuffle(shuffled)
    order = topological_sort(shuffled)
    assert order == topological_sort(list(reversed(shuffled)))
    assert len(order) == len(events)
    seen: set[EventId] = set()
    for event in order:
        assert all(p in seen for p in event.parent if p in {e.id for e in events})
        seen.add(event.id)


def test_parents_outside_the_batch_do_not_order_it() -> None:
    dag = Dag()
    dag.root("A")
    dag.child("B", "A")
    dag.child("C", "B")
    order = topological_sort([dag["C"], dag["B"]])
    assert [dag.name_of(e.id) for e in order] == ["B", "C"]


def test_a_claimed_cycle_is_refused() -> None:
    class Fake:
        def __init__(self, i: EventId, p: EventId) -> None:
            self.id, self.parent = i, Clock([p])

    a, b = EventId(b"\x01" * 32), EventId(b"\x02" * 32)
    with pytest.raises(InvalidEvent, match="cycle"):
        topological_sort([Fake(a, b), Fake(b, a)])


def test_reparenting_an_event_onto_another_changes_its_own_id() -> None:
    # Why a real cycle cannot be built: an event's id depends on its parents.
    dag = Dag()
    dag.root("A")
    b = dag.child("B", "A")
    c = dag.child("C", "B")
    b_on_c = Event.update(
        entity_id=b.entity_id,
        collection=b.collection,
        parent=Clock([c.id]),
        operations=b.event.operations,
    )
    assert b_on_c.id != b.id
