"""The resident set's weak half (:mod:`mycelia.entity.residents`): an entity somebody still
holds stays resident past the strong LRU, one nobody holds is forgotten, and a replaced
resident's death does not take its successor's entry with it."""

from __future__ import annotations

import gc
import types

from mycelia.entity import Entity, Residents
from mycelia.proto import EntityId


def entity(n: int) -> Entity:
    return Entity.empty(EntityId(bytes([n]) * 32), "items")


def test_an_entity_held_elsewhere_stays_resident_and_one_held_nowhere_goes() -> None:
    residents = Residents(keep=1)
    first, second = entity(1), entity(2)
    residents.put(first)
    residents.put(second)  # the LRU keeps one: only ``second`` strongly
    assert residents.get(first.entity_id) is first, "still held here: still the resident"
    first_id = first.entity_id
    residents.put(second)  # ``second`` strongly again, ``first`` weakly only
    del first
    gc.collect()
    assert residents.get(first_id) is None
    assert len(residents) == 1


def test_a_replaced_resident_dying_leaves_its_successor() -> None:
    residents = Residents(keep=1)
    old, new = entity(3), entity(3)
    residents.put(old)
    residents.put(new)
    residents.put(entity(4))  # pushes ``new`` out of the LRU: held weakly, by this test
    del old
    gc.collect()
    assert residents.get(new.entity_id) is new


def test_every_weak_reference_shares_one_callback() -> None:
    """A fresh client adopts a thousand entities at once: each weak reference made its own
    bound method of the resident set (one more tracked object an entity)."""
    residents = Residents(keep=10)
    held = [entity(n) for n in range(5, 105)]
    gc.collect()
    methods = sum(type(o) is types.MethodType for o in gc.get_objects())
    for resident in held:
        residents.put(resident)
    gc.collect()
    assert sum(type(o) is types.MethodType for o in gc.get_objects()) - methods <= 1
    assert all(residents.get(r.entity_id) is r for r in held)


def test_putting_a_changed_resident_leaves_no_new_object_for_the_collector() -> None:
    # The LRU kept an (entity, size) pair and made a new one at every put: a pair the
    # collector tracks, promoted to the old generation with the entity it holds, for every
    # change an applier made (W3: about one in eleven of what each change left behind).
    residents = Residents(keep=4)
    kept = entity(5)
    residents.put(kept)
    gc.collect()
    for _ in range(20):
        assert residents.put(kept) is kept
    young = gc.get_objects(generation=0)
    assert not [o for o in young if type(o) is tuple and kept in o]
    assert residents.get(kept.entity_id) is kept
    assert residents.kept_bytes > 0
