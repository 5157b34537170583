"""Text client ids come only from the ClientIds an entity carries; replica text takes no edits."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from mycelia.entity.backends import ClientIds, TextBackend
from mycelia.entity.backends.text import REPLICA_CLIENT_ID
from mycelia.entity.entity import Entity
from mycelia.errors import TransactionError
from mycelia.proto import EntityId

ENTITY = EntityId(b"\x07" * 32)


def _ids(seed: int) -> ClientIds:
    return ClientIds(random.Random(seed))


def _first_id(seed: int) -> int:
    return _ids(seed).next()


EDITS: list[Callable[[TextBackend], None]] = [
    lambda text: text.insert("body", 0, "x"),
    lambda text: text.delete("body", 0, 1),
    lambda text: text.replace("body", "x"),
]


@pytest.mark.parametrize("edit", EDITS)
def test_text_made_without_client_ids_is_a_replica_that_refuses_local_edits(
    edit: Callable[[TextBackend], None],
) -> None:
    text = Entity.empty(ENTITY, "notes").text()
    assert text.is_replica
    assert text.client_id == REPLICA_CLIENT_ID
    with pytest.raises(TransactionError, match="replica"):
        edit(text)
    assert text.take_diff() is None
    editable = TextBackend.empty(_ids(2))
    editable.insert("body", 0, "ab")
    editable.take_diff()
    edit(editable)
    assert editable.take_diff() is not None


def test_a_replica_still_applies_and_merges_what_others_wrote() -> None:
    writer = TextBackend.empty(_ids(1))
    writer.insert("body", 0, "hello")
    state = writer.to_state()
    replica = TextBackend.from_state(state)
    assert replica.is_replica
    assert replica.values() == {"body": "hello"}
    other = TextBackend.empty()
    assert other.merge(replica) == {"body"}
    assert other.to_state() == state


def test_text_created_lazily_on_a_fork_draws_from_the_forks_client_ids() -> None:
    resident = Entity.empty(ENTITY, "notes")  # no text backend yet
    fork = resident.fork(text_ids=_ids(3))
    assert not fork.has_backend(TextBackend.name)
    fork.text().insert("body", 0, "x")
    assert fork.text().client_id == _first_id(3)


def test_a_fork_hands_its_entitys_client_ids_on_and_each_fork_gets_a_fresh_id() -> None:
    ids = _ids(4)
    expected = _ids(4)
    entity = Entity.empty(ENTITY, "notes", text_ids=ids)
    assert entity.text().client_id == expected.next()
    first, second = entity.fork(), entity.fork()
    assert first.text().client_id == expected.next()
    assert second.text().client_id == expected.next()
    first.text().insert("body", 0, "a")
    assert first.with_id(EntityId(b"\x08" * 32)).fork().text().client_id == expected.next()


def test_a_decoded_state_draws_its_text_id_from_the_client_ids_it_is_given() -> None:
    writer = Entity.empty(ENTITY, "notes", text_ids=_ids(5))
    writer.text().insert("body", 0, "hi")
    stored = writer.to_state()
    assert Entity.from_state(stored).text().is_replica
    decoded = Entity.from_state(stored, text_ids=_ids(6))
    assert decoded.text().client_id == _first_id(6)
    assert decoded.values() == {"body": "hi"}


def test_the_same_seed_gives_the_same_text_update() -> None:
    def edit(seed: int) -> bytes | None:
        fork = Entity.empty(ENTITY, "notes").fork(text_ids=_ids(seed))
        fork.text().insert("body", 0, "same")
        return fork.text().take_diff()

    assert edit(9) == edit(9)
    assert edit(9) != edit(10)


def test_a_replicas_id_is_never_leased_out_again() -> None:
    ids = _ids(11)
    ids.release(REPLICA_CLIENT_ID)
    assert ids.next() != REPLICA_CLIENT_ID
