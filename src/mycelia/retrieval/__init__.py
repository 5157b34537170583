"""``mycelia.retrieval``: the capabilities the comparison and the applier read through.

Narrow :class:`typing.Protocol` s owned by their consumers (STYLE.md §3): ``GetEvents`` can
read, not write; only the outermost applier holds ``SuspenseEvents``. The staging map and
the getters that combine it with storage (and, on ephemeral nodes, a remote peer) are here.
"""

from mycelia.retrieval.getters import CachedGetter, LocalGetter, RemoteEvents
from mycelia.retrieval.protocols import (
    EntityStore,
    EventSource,
    GetEvents,
    GetState,
    StoredState,
    SuspenseEvents,
    WriteBatch,
    WriteResult,
)
from mycelia.retrieval.staging import StagingMap

__all__ = [
    "CachedGetter",
    "EntityStore",
    "EventSource",
    "GetEvents",
    "GetState",
    "LocalGetter",
    "RemoteEvents",
    "StagingMap",
    "StoredState",
    "SuspenseEvents",
    "WriteBatch",
    "WriteResult",
]
