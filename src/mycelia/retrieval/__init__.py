"""``mycelia.retrieval``: the capabilities the comparison and the applier read through.

Narrow :class:`typing.Protocol` s owned by their consumers (STYLE.md §3): the comparison
reads through ``EventSource`` and cannot write; only the applier holds ``EntityStore``
(reads plus one atomic write). The staging map and the getters that combine it with
storage (and, on ephemeral nodes, a remote peer) are here.
"""

from mycelia.retrieval.getters import (
    CachedGetter,
    LocalGetter,
    RemoteEvents,
    local_first,
    reads_ahead,
)
from mycelia.retrieval.protocols import (
    EntityStore,
    EventSource,
    GetState,
    StoredState,
    WriteBatch,
    WriteResult,
)
from mycelia.retrieval.staging import StagingMap

__all__ = [
    "CachedGetter",
    "EntityStore",
    "EventSource",
    "GetState",
    "LocalGetter",
    "RemoteEvents",
    "StagingMap",
    "StoredState",
    "WriteBatch",
    "WriteResult",
    "local_first",
    "reads_ahead",
]
