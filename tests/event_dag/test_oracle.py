"""The comparison agrees with the brute-force ancestor-set oracle on generated DAGs."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mycelia.errors import EventNotFound
from mycelia.event_dag import (
    Ahead,
    Comparison,
    DivergedSince,
    Status,
    StrictAscends,
    compare_with,
)
from mycelia.proto import EMPTY_CLOCK, AdmittedEvent, Clock, EventId
from mycelia.testing.dags import DagShape, ancestry, dag_shapes, oracle_relation


@st.composite
def comparisons(draw: st.DrawFn, *, hide: bool) -> tuple[DagShape, list[int], list[int], set[int]]:
    shape = draw(dag_shapes())
    n = len(shape.parents)
    # Any subsets: antichains or not, sharing ids or not, empty sometimes.
    subject = draw(st.lists(st.integers(0, n - 1), max_size=3, unique=True))
    other = draw(st.lists(st.integers(0, n - 1), max_size=3, unique=True))
    hidden = set(draw(st.lists(st.integers(0, n - 1), max_size=3))) if hide else set()
    return shape, subject, other, hidden


def _check(shape: DagShape, s: list[int], o: list[int], hidden: set[int]) -> None:
    _, events = shape.build()
    subject = Clock(events[i].id for i in s)
    other = Clock(events[i].id for i in o)
    visible: dict[EventId, AdmittedEvent] = {
        e.id: e for i, e in enumerate(events) if i not in hidden
    }
    hidden_ids = {events[i].id for i in hidden}
    # The model sees what the comparison can see: a hidden event is a leaf.
    parents = {e.id: (EMPTY_CLOCK if e.id in hidden_ids else e.parent) for e in events}
    expected = oracle_relation(parents, subject, other)
    a_s, a_o = ancestry(parents, subject), ancestry(parents, other)
    one_sided_hidden = hidden_ids & (a_s ^ a_o)
    trivial = subject == other or not subject or not other
    if one_sided_hidden and not trivial:
        with pytest.raises(EventNotFound) as refused:
            compare_with(visible, subject, other, budget=4 * len(events))
        assert refused.value.event_id in one_sided_hidden
        return
    result = compare_with(visible, subject, other, budget=4 * len(events))
    assert result.relation == expected
    if isinstance(expected, DivergedSince) or not trivial:
        subject_only = {e.id for e in result.subject_only}
        other_only = {e.id for e in result.other_only}
        if not isinstance(expected, DivergedSince) or expected.meet:
            assert subject_only == (a_s - a_o) - hidden_ids
            assert other_only <= (a_o - a_s)


@settings(max_examples=300)
@given(comparisons(hide=False))
def test_the_comparison_matches_the_ancestor_set_oracle(
    case: tuple[DagShape, list[int], list[int], set[int]],
) -> None:
    _check(*case)


@settings(max_examples=300)
@given(comparisons(hide=True))
def test_with_missing_events_it_matches_the_oracle_or_names_a_one_sided_gap(
    case: tuple[DagShape, list[int], list[int], set[int]],
) -> None:
    _check(*case)


# 100,000 examples took 373 s under `HYPOTHESIS_PROFILE=ci` on the shared 2-core machine
# (the 300 s default timeout killed it); a 5x margin covers a loaded machine.
@pytest.mark.slow
@pytest.mark.timeout(1800)
@settings(max_examples=int(os.environ.get("MYCELIA_ORACLE_EXAMPLES", "100000")))
@given(comparisons(hide=True))
def test_the_oracle_property_nightly(case: tuple[DagShape, list[int], list[int], set[int]]) -> None:
    _check(*case)


@settings(max_examples=300)
@given(comparisons(hide=False))
def test_a_subject_side_walk_finds_exactly_what_the_subject_has_beyond_the_other(
    case: tuple[DagShape, list[int], list[int], set[int]],
) -> None:
    shape, s, o, _ = case
    _, events = shape.build()
    subject = Clock(events[i].id for i in s)
    other = Clock(events[i].id for i in o)
    if not subject or not other or subject == other:
        return
    parents = {e.id: e.parent for e in events}
    expected = ancestry(parents, subject) - ancestry(parents, other)
    cmp = Comparison.start(subject, other, subject_side=True)
    by_id = {e.id: e for e in events}
    while cmp.status is Status.WANTS:
        cmp.feed({i: by_id[i] for i in cmp.wanted})
    result = cmp.result()
    assert {e.id for e in result.subject_only} == expected
    assert result.relation == (Ahead() if expected else StrictAscends())
    generations = [e.generation for e in result.subject_only]
    assert generations == sorted(generations)  # parents first
