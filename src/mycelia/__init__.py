"""Mycelia: a replicated, event-sourced sync engine for Python.

Every change is a content-hashed :class:`Event` in a per-entity DAG; nodes exchange events
and every replica converges to the same state without coordination. See ARCHITECTURE.md
for the contract and README.md for a tour.

``Server`` and ``serve`` load on first use: a process that only connects (a client in an
app) never imports the server side (its websockets server, its metrics registry).
"""

from typing import TYPE_CHECKING

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
from mycelia.node.tokens import Grant, TokenAgent, TokenIssuer
from mycelia.proto import AdmittedEvent, Clock, EntityId, Event, EventId

if TYPE_CHECKING:
    from mycelia.node.server import Server, serve

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

_SERVER_SIDE = frozenset({"Server", "serve"})


def __getattr__(name: str) -> object:
    """``Server`` and ``serve``, imported on first use (see the module docstring)."""
    if name in _SERVER_SIDE:
        from mycelia.node import server  # noqa: PLC0415

        return getattr(server, name)
    raise AttributeError(f"module 'mycelia' has no attribute {name!r}")
