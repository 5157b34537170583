"""``mycelia.entity``: entities, property backends, the applier and the model layer.

The merge logic is pure and synchronous; the applier reaches storage only through the
:class:`~mycelia.retrieval.EntityStore` capability (ARCHITECTURE.md §2, §5).
"""

from mycelia.entity.values import check_value, decode_value, encode_value  # noqa: I001 - first: no cycles
from mycelia.entity.entity import DELETED, Entity, Snapshot, stored_merge
from mycelia.entity.runs import EntityChange, EventCheck, ForkBase, IngestResult, Refused
from mycelia.entity.applier import Applier
from mycelia.entity.pending import PendingPool
from mycelia.entity.verdicts import VERDICTS, Action
from mycelia.entity.residents import Residents

__all__ = [
    "DELETED",
    "VERDICTS",
    "Action",
    "Applier",
    "Entity",
    "EntityChange",
    "EventCheck",
    "ForkBase",
    "IngestResult",
    "PendingPool",
    "Refused",
    "Residents",
    "Snapshot",
    "check_value",
    "decode_value",
    "encode_value",
    "stored_merge",
]
