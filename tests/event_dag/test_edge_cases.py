"""The reference's pinned comparison cases (ankurah-core §2.12, §6B), re-expressed."""

from __future__ import annotations

from collections.abc import Collection, Mapping

import pytest

from mycelia.errors import EventNotFound
from mycelia.event_dag import (
    BudgetExceeded,
    Comparison,
    Disjoint,
    DivergedSince,
    Equal,
    Status,
    StrictAscends,
    StrictDescends,
    compare,
    compare_with,
)
from mycelia.proto import EMPTY_CLOCK, AdmittedEvent, EventId
from mycelia.testing.dags import Dag


def chain(n: int) -> Dag:
    dag = Dag()
    dag.root("e1")
    for i in range(2, n + 1):
        dag.child(f"e{i}", f"e{i - 1}")
    return dag


def rel(dag: Dag, s: Collection[str], o: Collection[str], **kw: object) -> object:
    return compare_with(dag.events, dag.clock(*s), dag.clock(*o), **kw).relation  # type: ignore[arg-type]


def test_a_linear_history_descends_one_way_and_ascends_the_other() -> None:
    dag = chain(3)
    assert rel(dag, ["e3"], ["e1"]) == StrictDescends()
    assert rel(dag, ["e1"], ["e3"]) == StrictAscends()


def test_trivial_clocks() -> None:
    dag = chain(2)
    assert compare_with(dag.events, EMPTY_CLOCK, EMPTY_CLOCK).relation == Equal()
    assert compare_with(dag.events, dag.clock("e1"), EMPTY_CLOCK).relation == DivergedSince(
        EMPTY_CLOCK
    )
    assert compare_with(dag.events, EMPTY_CLOCK, dag.clock("e1")).relation == DivergedSince(
        EMPTY_CLOCK
    )
    assert rel(dag, ["e2"], ["e2"]) == Equal()


def test_an_ancestor_clock_with_internal_concurrency_is_descended() -> None:
    dag = Dag()
    dag.root("1")
    for n in ("2", "3", "4"):
        dag.child(n, "1")
    dag.child("5", "2", "3")
    dag.child("6", "3", "4")
    assert rel(dag, ["5"], ["2", "3"]) == StrictDescends()
    assert rel(dag, ["2"], ["3"]) == DivergedSince(dag.clock("1"))
    assert rel(dag, ["3"], ["2"]) == DivergedSince(dag.clock("1"))
    assert rel(dag, ["6"], ["2", "3"]) == DivergedSince(dag.clock("3"))


def test_different_roots_are_disjoint_and_both_roots_are_named() -> None:
    dag = chain(3)
    dag.root("x1")
    dag.child("x2", "x1")
    relation = rel(dag, ["e3"], ["x2"])
    assert relation == Disjoint(dag.clock("e1"), dag.clock("x1"))


def test_a_partly_foreign_other_clock_diverges_with_an_empty_meet() -> None:
    dag = chain(5)
    dag.child("b3", "e2")
    dag.root("f")
    dag.child("f8", "f")
    assert rel(dag, ["b3"], ["e5", "f8"]) == DivergedSince(EMPTY_CLOCK)
    # ...while a subject already inside the other clock's history is simply older.
    assert rel(dag, ["e3"], ["e5", "f8"]) == StrictAscends()


def test_joining_six_roots_descends_from_all_of_them() -> None:
    dag = Dag()
    roots = [f"r{i}" for i in range(6)]
    for r in roots:
        dag.root(r)
    dag.child("join", *roots)
    dag.child("top", "join")
    assert rel(dag, ["top"], roots) == StrictDescends()
    assert rel(dag, roots, ["top"]) == StrictAscends()


def test_redelivered_head_is_equal_and_an_ancestor_is_ascended() -> None:
    dag = chain(3)
    assert rel(dag, ["e3"], ["e3"]) == Equal()
    assert rel(dag, ["e2"], ["e3"]) == StrictAscends()


def test_a_non_antichain_head_is_never_diverged() -> None:
    dag = chain(4)
    assert rel(dag, ["e4"], ["e3", "e4"]) == StrictDescends()


class RefusingSource:
    """A mapping that fails the test if the comparison reads a forbidden event."""

    def __init__(self, dag: Dag, forbidden: set[EventId]) -> None:
        self.dag, self.forbidden = dag, forbidden
        self.calls: list[tuple[EventId, ...]] = []

    async def get_events(
        self, ids: Collection[EventId], *, ahead: int = 0
    ) -> Mapping[EventId, AdmittedEvent]:
        self.calls.append(tuple(ids))
        assert not (set(ids) & self.forbidden), "read an event it did not need"
        return {i: self.dag.events[i] for i in ids if i in self.dag.events}


async def test_multi_head_heads_extend_and_diverge_correctly() -> None:
    dag = Dag()
    dag.root("A")
    for n in ("B", "C", "D"):
        dag.child(n, "A")
    dag.child("onC", "C")
    dag.child("onBC", "B", "C")
    dag.child("onB", "B")
    assert rel(dag, ["onC"], ["B", "C"]) == DivergedSince(dag.clock("C"))
    assert rel(dag, ["onB"], ["B", "C", "D"]) == DivergedSince(dag.clock("B"))
    # Extending every tip descends after reading only the new event's parents' records:
    # nothing below B and C (A) is ever fetched.
    source = RefusingSource(dag, {dag.id("A")})
    result = await compare(source, dag.clock("onBC"), dag.clock("B", "C"))
    assert result.relation == StrictDescends()
    assert len(source.calls) == 1


def test_an_asymmetric_diamond_meets_at_its_fork() -> None:
    dag = Dag()
    dag.root("A")
    dag.child("L1", "A")
    dag.child("R1", "A")
    for i in range(2, 5):
        dag.child(f"L{i}", f"L{i - 1}")
        dag.child(f"R{i}", f"R{i - 1}")
    result = compare_with(dag.events, dag.clock("L4"), dag.clock("R4"))
    assert result.relation == DivergedSince(dag.clock("A"))
    assert [dag.name_of(e.id) for e in result.subject_only] == ["L1", "L2", "L3", "L4"]
    assert [dag.name_of(e.id) for e in result.other_only] == ["R1", "R2", "R3", "R4"]


def test_a_short_branch_from_a_deep_point_meets_there_not_at_genesis() -> None:
    dag = chain(20)
    dag.child("b", "e15")
    assert rel(dag, ["b"], ["e20"]) == DivergedSince(dag.clock("e15"))


def test_a_forward_chain_lists_exactly_the_new_events_in_order() -> None:
    dag = chain(5)
    result = compare_with(dag.events, dag.clock("e5"), dag.clock("e1"))
    assert result.relation == StrictDescends()
    assert [dag.name_of(e.id) for e in result.subject_only] == ["e2", "e3", "e4", "e5"]


def test_revisits_through_a_longer_path_do_not_fake_a_strict_relation() -> None:
    dag = Dag()
    dag.root("R")
    dag.child("N", "R")
    dag.child("D", "R")
    dag.child("A", "N")
    dag.child_with_id_order("C", "N", above="N")
    dag.child("B", "C")
    dag.child("S", "A", "B")
    assert rel(dag, ["S"], ["N", "D"]) == DivergedSince(dag.clock("N"))
    assert rel(dag, ["N", "D"], ["S"]) == DivergedSince(dag.clock("N"))


def test_late_and_stalled_origins_still_find_the_meet() -> None:
    dag = Dag()
    dag.root("M")
    dag.child("C1", "M")
    dag.child("X", "M")
    dag.child("C2", "X")
    dag.child("S", "M")
    assert rel(dag, ["S"], ["C1", "C2"]) == DivergedSince(dag.clock("M"))
    dag2 = Dag()
    dag2.root("M")
    dag2.child("K", "M")
    dag2.child("C1", "K")
    dag2.child_with_id_order("L", "K", above="K")
    dag2.child("H", "L")
    dag2.child("S", "M")
    assert rel(dag2, ["S"], ["C1", "H"]) == DivergedSince(dag2.clock("M"))


def test_smuggled_foreign_lineage_never_fast_forwards() -> None:
    dag = Dag()
    dag.root("A")
    dag.child("B", "A")
    dag.root("X")
    assert rel(dag, ["B", "X"], ["A"]) != StrictDescends()
    dag.child("D", "B", "X")
    assert rel(dag, ["D"], ["A"]) == DivergedSince(dag.clock("A"))


def test_a_meet_missing_from_storage_but_reached_from_both_sides_is_the_meet() -> None:
    dag = Dag()
    dag.root("A")
    dag.child("B", "A")
    dag.child("C", "A")
    visible = {i: e for i, e in dag.events.items() if i != dag.id("A")}
    result = compare_with(visible, dag.clock("B"), dag.clock("C"))
    assert result.relation == DivergedSince(dag.clock("A"))


def test_a_missing_event_on_one_side_is_an_error_not_a_busy_loop() -> None:
    dag = chain(3)
    visible = {i: e for i, e in dag.events.items() if i != dag.id("e2")}
    with pytest.raises(EventNotFound) as info:
        compare_with(visible, dag.clock("e3"), dag.clock("e1"))
    assert info.value.event_id == dag.id("e2")


def test_a_hinted_head_need_not_be_stored_to_fast_forward() -> None:
    # An ephemeral node holds a snapshot with head [e5] and not the events themselves.
    dag = chain(6)
    visible = {dag.id("e6"): dag["e6"]}
    result = compare_with(visible, dag.clock("e6"), dag.clock("e5"), hints={dag.id("e5"): 5})
    assert result.relation == StrictDescends()
    assert dict(result.merged_head) == {dag.id("e6"): 6}


def test_the_budget_stops_the_walk_without_a_verdict_and_escalation_resumes_it() -> None:
    dag = chain(6)
    # Budget 2, escalated once to 8: enough for the 6-chain.
    assert rel(dag, ["e6"], ["e1"], budget=2) == StrictDescends()
    # Budget 1, escalated to 4: not enough; no verdict is made up.
    relation = rel(dag, ["e6"], ["e1"], budget=1)
    assert isinstance(relation, BudgetExceeded)
    long = chain(20)
    assert isinstance(rel(long, ["e20"], ["e1"], budget=1), BudgetExceeded)
    assert rel(long, ["e20"], ["e1"], budget=100) == StrictDescends()


@pytest.mark.parametrize(("budget", "concludes"), [(0, False), (1, False), (2, True), (6, True)])
async def test_the_async_and_sync_drivers_escalate_the_same_way(
    budget: int, concludes: bool
) -> None:
    dag = chain(6)
    s, o = dag.clock("e6"), dag.clock("e1")
    remote = await compare(RefusingSource(dag, set()), s, o, budget=budget)
    local = compare_with(dag.events, s, o, budget=budget)
    assert remote.relation == local.relation
    assert remote.fetched == local.fetched
    assert (remote.relation == StrictDescends()) is concludes  # 2 concludes only at 4x


def _drain(cmp: Comparison, dag: Dag) -> int:
    fetched = 0
    while cmp.status is Status.WANTS:
        fetched += len(cmp.wanted)
        cmp.feed({i: dag.events[i] for i in cmp.wanted})
    return fetched


def test_an_over_budget_walk_resumes_where_it_stopped() -> None:
    dag = chain(10)
    cmp = Comparison.start(dag.clock("e10"), dag.clock("e1"), budget=3)
    fetched = _drain(cmp, dag)
    assert cmp.status is Status.OVER_BUDGET
    assert isinstance(cmp.result().relation, BudgetExceeded)
    cmp.extend_budget(100)
    fetched += _drain(cmp, dag)
    assert cmp.result().relation == StrictDescends()
    assert fetched == 10  # nothing was fetched twice


def test_per_event_charging_keeps_stacked_uneven_diamonds_within_budget() -> None:
    dag = Dag()
    dag.root("J0")
    for i in range(1, 13):
        dag.child(f"A{i}", f"J{i - 1}")
        dag.child_with_id_order(f"C{i}", f"J{i - 1}", above=f"J{i - 1}")
        dag.child(f"B{i}", f"C{i}")
        dag.child(f"J{i}", f"A{i}", f"B{i}")
    total = len(dag.events)
    result = compare_with(dag.events, dag.clock("J12"), dag.clock("J0"), budget=2 * total)
    assert result.relation == StrictDescends()
    assert len(result.subject_only) == total - 1
    assert result.fetched <= total


async def test_a_batch_getter_sees_one_call_per_frontier_step() -> None:
    # Two 4-event branches on a fork: the walk needs the heads, then each generation of
    # both sides together: one call per generation, never one per event.
    dag = Dag()
    dag.root("G")
    dag.child("F", "G")
    dag.child("L1", "F")
    dag.child("R1", "F")
    for i in range(2, 5):
        dag.child(f"L{i}", f"L{i - 1}")
        dag.child(f"R{i}", f"R{i - 1}")
    source = RefusingSource(dag, set())
    result = await compare(source, dag.clock("L4"), dag.clock("R4"))
    assert result.relation == DivergedSince(dag.clock("F"))
    assert [len(c) for c in source.calls] == [2, 2, 2, 2, 1]
    assert result.steps == len(source.calls)
