"""Several commits in one run (``Applier.commit_many``): each checked against its own
before and after, a refusal among several peers' commits named, and a commit made on the held head
admitted without a lookup. Helpers and events as in ``test_applier``."""

from __future__ import annotations

from typing import Any

import pytest

from mycelia.entity import Refused, Snapshot
from mycelia.errors import PolicyDenied
from mycelia.proto import AdmittedEvent, Clock, EventId
from mycelia.storage.testing import engine_content
from tests.entity.test_applier import _update, _with_note


def _refusing(seen: list[object]) -> Any:
    """A check that notes each commit's own title after it, and refuses ``refused``."""

    def check(before: Snapshot, after: Snapshot, event: AdmittedEvent) -> None:
        seen.append(after.values.get("title"))
        if after.values.get("title") == "refused":
            raise PolicyDenied("refused")

    return check


async def test_grouped_commits_are_each_checked_against_their_own_before_and_after() -> None:
    a, note, applier, store, _ = await _with_note(durable=True)
    head = Clock([(await a.storage.events_of(note))[-1].id])
    bad = _update(note, head, title="refused")
    good = _update(note, Clock([bad.id]), title="fine")
    seen: list[object] = []
    before = await engine_content(store)
    with pytest.raises(PolicyDenied):
        await applier.commit_many([[bad], [good]], check=_refusing(seen))
    assert seen == ["refused"]  # the first commit's own after, not the batch's last
    assert await engine_content(store) == before


async def test_a_refusal_among_peers_commits_names_the_commit_refused_and_nothing_is_written() -> (
    None
):
    a, note, applier, store, _ = await _with_note(durable=True)
    head = Clock([(await a.storage.events_of(note))[-1].id])
    first = _update(note, head, title="fine")
    bad = _update(note, Clock([first.id]), title="refused")
    after = _update(note, Clock([bad.id]), title="after")
    seen: list[object] = []
    before = await engine_content(store)
    with pytest.raises(Refused) as refused:
        await applier.commit_many([[first], [bad], [after]], check=_refusing(seen), parts=[2, 1])
    assert refused.value.index == 1
    assert isinstance(refused.value.error, PolicyDenied)
    assert seen == ["fine", "refused"], "checked after the first, as it left the entity"
    assert await engine_content(store) == before
    entity = await applier.load(note)
    assert entity is not None
    assert entity.head == head, "what the run had applied is gone from memory too"
    result = await applier.commit_many([[first]], check=_refusing(seen), parts=[1])
    assert [e.id for e in result.stored] == [first.id], "those before it pass again"


async def test_a_commit_on_the_held_head_is_admitted_without_a_lookup_and_a_resent_one_is_a_no_op(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, note, applier, store, held = await _with_note(durable=True)
    asked: list[set[EventId]] = []
    get_events = store.get_events

    async def counted(ids: Any) -> Any:
        asked.append(set(ids))
        return await get_events(ids)

    monkeypatch.setattr(store, "get_events", counted)
    first = _update(note, held.head, title="one")
    second = _update(note, Clock([first.id]), rank=2)  # on the first, in the same commit
    result = await applier.commit_many([[first, second]])
    assert [e.id for e in result.stored] == [first.id, second.id]
    assert asked == [], "made on the head this node holds: nothing to look up"

    third = _update(note, Clock([second.id]), title="three")
    for resent in ([first], [second], [first, second, third]):  # none of them on the head now
        before = await engine_content(store)
        result = await applier.commit_many([resent])
        assert asked.pop() >= {e.id for e in resent}, "not on the head: looked up"
        if third not in resent:
            assert result.stored == []
            assert result.changes == []
            assert await engine_content(store) == before, "a stored event is a no-op"
    assert [e.id for e in result.stored] == [third.id], "only the new one of the three"
    entity = await applier.load(note)
    assert entity is not None
    assert entity.head == Clock([third.id])
    assert entity.snapshot().values == {"title": "three", "rank": 2}
    genesis = (await a.storage.events_of(note))[0].event
    assert (await applier.commit_many([[genesis]])).stored == []  # a genesis is looked up
    assert asked.pop() >= {genesis.id}
