"""Mycelia: a replicated, event-sourced sync engine for Python.

Every change is a content-hashed :class:`~mycelia.proto.Event` in a per-entity DAG; nodes
exchange events and every replica converges to the same state without coordination.
See ARCHITECTURE.md for the contract and README.md for a tour.
"""

from mycelia.proto import Clock, EntityId, Event, EventId

__all__ = ["Clock", "EntityId", "Event", "EventId"]
__version__ = "0.1.0"
