"""``mycelia.proto``: ids, clocks, events, states, limits and the canonical codec.

Pure and synchronous: nothing here does I/O (ARCHITECTURE.md §2).
"""

from mycelia.proto.clock import EMPTY_CLOCK, Clock
from mycelia.proto.event import (
    SYSTEM_COLLECTION,
    AdmittedEvent,
    Event,
    Operations,
    is_reserved_collection,
)
from mycelia.proto.ids import EntityId, EventId, NodeId
from mycelia.proto.limits import DEFAULT_LIMITS, Limits
from mycelia.proto.state import Attested, Buffer, Deferred, EntityState, Merge, State

__all__ = [
    "DEFAULT_LIMITS",
    "EMPTY_CLOCK",
    "SYSTEM_COLLECTION",
    "AdmittedEvent",
    "Attested",
    "Buffer",
    "Clock",
    "Deferred",
    "EntityId",
    "EntityState",
    "Event",
    "EventId",
    "Limits",
    "Merge",
    "NodeId",
    "Operations",
    "State",
    "is_reserved_collection",
]
