"""What the durable peer keeps current for a query is taken in the order the connection
read it (mycelia.node.kept): a subscription's answer is applied page by page while
updates are, so an update read after the answer can be applied before the answer's last
page. Taken as applied, an update saying an entity arrived was undone by a page that had
read it as absent, and the live query hid the entity for good (the simulator, seeds 6
and 7 of the clients soak)."""

from __future__ import annotations

from mycelia.node.kept import KeptRows
from mycelia.proto import EntityId
from mycelia.proto.peering import Delta

QUERY, SESSION = 7, 1


def _said(entity_id: EntityId, matches: bool) -> tuple[Delta, ...]:
    return (Delta(entity_id, "things", matches, None, ()),)


def _entity(n: int) -> EntityId:
    return EntityId(bytes([n]) * 32)


def test_an_update_read_after_the_response_is_taken_after_the_answer() -> None:
    kept, responded = KeptRows(), [False]
    kept.new_session()
    kept.start(QUERY, lambda: responded[0])
    arrived = _entity(1)
    responded[0] = True  # the response is read, then an update of the new subscription
    kept.read()
    assert kept.note(QUERY, _said(arrived, True), 0) == (set(), set())  # held for now
    kept.page(QUERY, _said(arrived, False))  # a page that read it before it arrived
    kept.answered(QUERY, SESSION, (), {arrived})
    assert kept.of(QUERY, SESSION) == {arrived}


def test_an_update_read_before_the_response_is_the_replaced_subscriptions() -> None:
    kept, responded = KeptRows(), [False]
    kept.new_session()
    kept.start(QUERY, lambda: responded[0])
    gone, stays = _entity(1), _entity(2)
    kept.read()  # read before the response: the subscription this one replaces
    responded[0] = True
    kept.note(QUERY, _said(gone, True), 0)
    kept.page(QUERY, _said(stays, True))
    kept.answered(QUERY, SESSION, (), {stays})
    assert kept.of(QUERY, SESSION) == {stays}
    assert kept.note(QUERY, _said(stays, False), 1) == (set(), {stays})  # answered: taken
    assert kept.of(QUERY, SESSION) == set()
    assert kept.of(QUERY, SESSION + 1) is None  # another session's answer is not had
