"""Mycelia: a replicated, event-sourced sync engine for Python.

Every change is a content-hashed :class:`Event` in a per-entity DAG; nodes exchange events
and every replica converges to the same state without coordination. See ARCHITECTURE.md
for the contract and README.md for a tour.
"""

from mycelia.compiled import choose as _choose

_choose()  # before any other module: the compiled hot path, or pure Python (compiled.py)

# ruff: noqa: E402

from mycelia.entity.fieldtypes import Json, Ref, Text
from mycelia.entity.model import Model
from mycelia.errors import MyceliaError
from mycelia.node import (
    Context,
    Credentials,
    Node,
    PeerInfo,
    PermissiveAgent,
    PolicyAgent,
    Transaction,
)
from mycelia.node.client import Connection, ConnectionState, connect
from mycelia.node.server import Server, serve
from mycelia.node.tokens import Grant, TokenAgent, TokenIssuer
from mycelia.proto import AdmittedEvent, Clock, EntityId, Event, EventId

__all__ = [
    "AdmittedEvent",
    "Clock",
    "Connection",
    "ConnectionState",
    "Context",
    "Credentials",
    "EntityId",
    "Event",
    "EventId",
    "Grant",
    "Json",
    "Model",
    "MyceliaError",
    "Node",
    "PeerInfo",
    "PermissiveAgent",
    "PolicyAgent",
    "Ref",
    "Server",
    "Text",
    "TokenAgent",
    "TokenIssuer",
    "Transaction",
    "connect",
    "serve",
]
__version__ = "0.1.0"
