"""The declarative LWW rule converges in every delivery order (ARCHITECTURE.md §5)."""

from __future__ import annotations

import itertools

import pytest

from mycelia import Model, Node
from mycelia.entity.backends.lww import encode_diff
from mycelia.entity.values import encode_value
from mycelia.storage import MemoryStorage
from mycelia.testing.dags import Dag


class Thing(Model, collection="things"):
    p: str | None
    q: str | None


def writes(**values: object) -> dict[str, list[bytes]]:
    return {"lww": [encode_diff({k: encode_value(v) for k, v in values.items()})]}


async def system_dag() -> tuple[Node, Dag]:
    origin = await Node.open(MemoryStorage(), durable=True)
    root = await origin.create_system()
    return origin, Dag(collection="things", system=root)


async def replica(origin: Node) -> Node:
    node = await Node.open(MemoryStorage(), durable=True)
    await node.join_system(await origin.system_events())
    return node


def declared_winner(dag: Dag, names: list[str], prop: str) -> str:
    """The rule, by brute force: the largest (generation, id) among writers of ``prop``."""
    writers = [dag[n] for n in names if prop.encode() in b"".join(dag[n].event.diffs("lww"))]
    return dag.name_of(max(writers, key=lambda e: (e.generation, e.id)).id)


async def deliver(origin: Node, dag: Dag, order: list[str]) -> Node:
    node = await replica(origin)
    for name in order:
        await node.ingest([dag[name]])
    return node


async def test_the_reference_counterexample_converges_in_every_order() -> None:
    # G; A and B on G; C on A; all write p; ids ordered A > B > C (ankurah-core §3.8).
    origin, dag = await system_dag()
    dag.root("G", ops=writes(p="G"))
    dag.child("A", "G", ops=writes(p="A"))
    for salt in range(10_000):
        b = dag.child("B", "G", ops=writes(p="B", q=str(salt)))
        if b.id < dag.id("A"):
            break
    for salt in range(10_000):
        c = dag.child("C", "A", ops=writes(p="C", q=str(salt)))
        if c.id < dag.id("B"):
            break
    assert dag.id("A") > dag.id("B") > dag.id("C")
    states = set()
    for order in itertools.permutations(["G", "A", "B", "C"]):
        node = await deliver(origin, dag, list(order))
        view = await node.context().get(Thing, dag["G"].entity_id)
        states.add((view.p, view.head))
    expected = declared_winner(dag, ["G", "A", "B", "C"], "p")
    assert states == {(expected, dag.clock("B", "C"))}


@pytest.mark.parametrize("width", [2, 3, 5])
async def test_concurrent_writes_resolve_to_the_same_winner_in_every_order(width: int) -> None:
    origin, dag = await system_dag()
    dag.root("G")
    branches = [f"w{i}" for i in range(width)]
    for name in branches:
        dag.child(name, "G", ops=writes(p=name))
    expected = declared_winner(dag, branches, "p")
    results = set()
    for order in itertools.islice(itertools.permutations(branches), 24):
        node = await deliver(origin, dag, ["G", *order])
        view = await node.context().get(Thing, dag["G"].entity_id)
        results.add((view.p, view.head))
    assert results == {(expected, dag.clock(*branches))}


async def test_properties_resolve_independently_and_a_merge_event_heals_the_fork() -> None:
    origin, dag = await system_dag()
    dag.root("G")
    dag.child("B", "G", ops=writes(p="B"))
    dag.child("C", "G", ops=writes(q="C"))
    dag.child("D", "B", "C", ops=writes(p="D"))
    for order in (["G", "B", "C", "D"], ["D", "C", "B", "G"], ["C", "G", "D", "B"]):
        node = await deliver(origin, dag, order)
        view = await node.context().get(Thing, dag["G"].entity_id)
        assert (view.p, view.q, view.head) == ("D", "C", dag.clock("D"))


async def test_a_causally_later_write_wins_and_deletion_competes_like_a_value() -> None:
    origin, dag = await system_dag()
    dag.root("G")
    dag.child("E1", "G", ops=writes(p="first"))
    dag.child("E2", "E1", ops=writes(p=None))
    for order in (["G", "E1", "E2"], ["E2", "E1", "G"]):
        node = await deliver(origin, dag, order)
        assert (await node.context().get(Thing, dag["G"].entity_id)).p is None


async def test_a_stale_event_on_one_tip_keeps_the_head_an_antichain() -> None:
    origin, dag = await system_dag()
    dag.root("A")
    dag.child("B", "A", ops=writes(p="B"))
    dag.child("C", "A", ops=writes(p="C"))
    dag.child("E", "B", ops=writes(p="E"))
    node = await deliver(origin, dag, ["A", "B", "C", "E"])
    view = await node.context().get(Thing, dag["A"].entity_id)
    assert view.head == dag.clock("C", "E")
    assert view.p == declared_winner(dag, ["B", "C", "E"], "p")


async def test_redelivery_is_a_no_op() -> None:
    origin, dag = await system_dag()
    dag.root("G")
    dag.child("A", "G", ops=writes(p="A"))
    node = await deliver(origin, dag, ["G", "A"])
    before = await node.storage.last_offset()
    for _ in range(3):
        result = await node.ingest([dag["A"], dag["G"], dag["A"]])
        assert not result.changes
        assert not result.stored
    assert await node.storage.last_offset() == before
    events = await node.storage.events_of(dag["G"].entity_id)
    assert [e.id for e in events] == [dag.id("G"), dag.id("A")]


async def test_events_with_unknown_parents_are_held_and_applied_when_the_parents_arrive() -> None:
    origin, dag = await system_dag()
    dag.root("G")
    dag.child("A", "G", ops=writes(p="A"))
    dag.child("B", "A", ops=writes(p="B"))
    node = await replica(origin)
    result = await node.ingest([dag["B"]])
    assert result.held == [dag.id("B")]
    assert result.missing == {dag.id("A")}
    result = await node.ingest([dag["A"]])
    assert result.held == [dag.id("A")]
    result = await node.ingest([dag["G"]])
    assert {e.id for e in result.stored} == {dag.id("G"), dag.id("A"), dag.id("B")}
    view = await node.context().get(Thing, dag["G"].entity_id)
    assert (view.p, view.head) == ("B", dag.clock("B"))
