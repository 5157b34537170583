"""Hypothesis strategies for Mycelia values (public: use them in your own property tests).

Every strategy builds valid values through the public constructors, so what they draw is
what a correct peer could send. Strategies for models, edit scripts and whole histories
build on these (ARCHITECTURE.md §12).
"""

from __future__ import annotations

from hypothesis import strategies as st

from mycelia.proto.clock import Clock
from mycelia.proto.event import NONCE_LENGTH, Event, Operations, normalize_operations
from mycelia.proto.ids import EntityId, EventId

__all__ = [
    "backend_names",
    "clocks",
    "collection_names",
    "entity_ids",
    "event_ids",
    "events",
    "genesis_events",
    "operations",
    "update_events",
]


def event_ids() -> st.SearchStrategy[EventId]:
    """Any event id."""
    return st.binary(min_size=32, max_size=32).map(EventId)


def entity_ids() -> st.SearchStrategy[EntityId]:
    """Any entity id."""
    return st.binary(min_size=32, max_size=32).map(EntityId)


def clocks(*, min_size: int = 0, max_size: int = 8) -> st.SearchStrategy[Clock]:
    """Clocks of ``min_size`` to ``max_size`` distinct ids."""
    return st.lists(event_ids(), min_size=min_size, max_size=max_size, unique=True).map(Clock)


def collection_names() -> st.SearchStrategy[str]:
    """Valid collection names (never the reserved ``_mycelia_`` prefix)."""
    return st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True)


def backend_names() -> st.SearchStrategy[str]:
    """Valid backend names."""
    return st.sampled_from(["lww", "text", "x_future"])


def operations() -> st.SearchStrategy[Operations]:
    """Normalised operations: a few backends, each a few opaque diffs."""
    return st.dictionaries(
        backend_names(), st.lists(st.binary(max_size=64), min_size=1, max_size=3), max_size=3
    ).map(normalize_operations)


def genesis_events(*, system: EntityId | None = None) -> st.SearchStrategy[Event]:
    """Genesis events (bound to ``system``, or to a random one when ``None``)."""
    systems = st.just(system) if system is not None else st.none() | entity_ids()
    return st.builds(
        lambda c, s, o, n: Event.genesis(collection=c, system=s, operations=o, nonce=n),
        collection_names(),
        systems,
        operations(),
        st.binary(min_size=NONCE_LENGTH, max_size=NONCE_LENGTH),
    )


def update_events() -> st.SearchStrategy[Event]:
    """Updates with random (not necessarily existing) parents."""
    return st.builds(
        lambda e, c, p, o: Event.update(entity_id=e, collection=c, parent=p, operations=o),
        entity_ids(),
        collection_names(),
        clocks(min_size=1, max_size=5),
        operations(),
    )


def events() -> st.SearchStrategy[Event]:
    """Genesis and update events."""
    return genesis_events() | update_events()
