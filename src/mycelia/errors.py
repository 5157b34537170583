"""Every error Mycelia raises, in one tree (ARCHITECTURE.md §10).

Catch :class:`MyceliaError` to catch everything; catch a branch to handle one family::

    MyceliaError
    ├── InvalidArgument            a caller passed a value the API cannot accept (also a ValueError)
    │   └── ConfigError            an operator's setting (flag, variable, file) cannot be used
    │       └── AddressInUse       the address to listen on is taken by another process
    ├── DecodeError                bytes from the wire or a file could not be decoded
    │   ├── PayloadTooLarge        a documented limit (proto.limits) was exceeded
    │   ├── InvalidEvent           an event is structurally invalid
    │   │   └── IdMismatch         an id does not match the content it names
    │   ├── InvalidState           a state is malformed or does not follow from its events
    │   └── InvalidMessage         a wire frame is not a message this protocol knows
    ├── RetrievalError
    │   ├── EventNotFound          an event id is not known here
    │   └── EntityNotFound         an entity id is not known here
    ├── LineageError               an event cannot be placed in its entity's history
    │   ├── BudgetExceeded         the comparison walked more events than it was allowed
    │   ├── Disjoint               two clocks share no history (different genesis)
    │   └── PendingLimit           too many events wait for missing parents
    ├── SystemError_               the node's system (root) is missing or is another one
    │   ├── SystemNotReady         no system root yet: create_system() or join_system() (a
    │   │                          client: connect once to a server to join its system)
    │   ├── ForeignSystem          events belong to another system
    │   └── ForeignNode            data belongs to another node (another node key)
    ├── PolicyDenied               the policy agent refused an operation (here, or the peer's
    │                              at the handshake: the client then stops retrying)
    ├── StorageError               the storage engine failed (backend error chained)
    │   ├── StorageLocked          another process holds the store
    │   ├── StorageReadOnly        the store cannot be written
    │   ├── StorageNotFound        there is no store at the path given (nothing was created)
    │   └── StorageCorrupt         the store's content fails its own checks
    ├── TransactionError
    │   ├── TransactionClosed      a transaction was used after commit or rollback
    │   └── CommitReverted         a local commit was undone: it was built on one the
    │                              durable peer refused, or its entity was reverted under it
    ├── QueryError                 a query could not be parsed or evaluated (column given), or
    │   │                          names a field its model lacks, or a value of the wrong type
    │   └── QueryTooExpensive      a query is beyond the cost budget (terms, work)
    ├── UsageError                 the API was used out of order (also a RuntimeError)
    │   └── NodeClosed             the node was closed: every call on it or its contexts raises
    └── ProtocolError              the peering protocol failed
        ├── LocalProtocolError     this side was asked to do something the protocol forbids
        ├── RemoteProtocolError    the peer sent something the protocol forbids
        │   └── PresenceRejected   the peer's Presence was refused (version, key, system)
        ├── RequestTimeout         a request got no answer in time
        ├── ConnectTimeout         wait_ready gave up (also a TimeoutError): names the state
        │                          and the last cause (refused, DNS, TLS, version, handshake)
        ├── RemoteError            the peer answered a request with an error
        ├── ConnectionClosed       the connection closed before the operation finished
        │   └── NotConnected       there was no open connection: nothing was asked
        └── Overloaded             the peer refused work beyond one of its budgets

Backend exceptions (lmdb, psycopg, websockets, msgpack) are translated where they are
caught and chained with ``raise ... from exc``; nothing else escapes the public API.

**Codes.** Every class has a stable numeric code (:data:`CODES`, the table in
``docs/protocol.md``): errors travel between peers as codes, never as class names. A
class's code is its parent's followed by two digits (``PayloadTooLarge`` 10201 is a
``DecodeError``, 102), so a code this node does not know is read as its nearest known
ancestor (:func:`error_class`). Codes are never reused or renumbered. A peer's error is
raised here as :func:`remote`: an instance of both the class its code names and
:class:`RemoteError` (or :class:`ConnectionClosed`, for a connection the peer closed with
a reason), so ``except PolicyDenied`` and ``except RemoteError`` both catch it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

__all__ = [
    "AddressInUse",
    "BudgetExceeded",
    "CommitReverted",
    "ConfigError",
    "ConnectTimeout",
    "ConnectionClosed",
    "DecodeError",
    "Disjoint",
    "EntityNotFound",
    "EventNotFound",
    "ForeignNode",
    "ForeignSystem",
    "IdMismatch",
    "InvalidArgument",
    "InvalidEvent",
    "InvalidMessage",
    "InvalidState",
    "LineageError",
    "LocalProtocolError",
    "MyceliaError",
    "NodeClosed",
    "NotConnected",
    "Overloaded",
    "PayloadTooLarge",
    "PendingLimit",
    "PolicyDenied",
    "PresenceRejected",
    "ProtocolError",
    "QueryError",
    "QueryTooExpensive",
    "RemoteError",
    "RemoteProtocolError",
    "RequestTimeout",
    "RetrievalError",
    "StorageCorrupt",
    "StorageError",
    "StorageLocked",
    "StorageNotFound",
    "StorageReadOnly",
    "SystemError_",
    "SystemNotReady",
    "TransactionClosed",
    "TransactionError",
    "UsageError",
    "closed_by_peer",
    "code_of",
    "error_class",
    "remote",
]


class MyceliaError(Exception):
    """The root of every error Mycelia raises."""


class InvalidArgument(MyceliaError, ValueError):
    """A caller passed a value the API cannot accept; the message says which and why."""


class ConfigError(InvalidArgument):
    """An operator's setting (a flag, an environment variable, a file it names) cannot be
    used; the message names the setting and says what to do. ``mycelia`` exits 2 on it."""


class AddressInUse(ConfigError):
    """The host and port to listen on are taken (another server, or another ``mycelia``)."""


class DecodeError(MyceliaError):
    """Bytes from the wire or a file could not be decoded into a valid value."""


class PayloadTooLarge(DecodeError):
    """A documented limit (see :mod:`mycelia.proto.limits`) was exceeded."""


class InvalidEvent(DecodeError):
    """An event is structurally invalid (shape, parents, collection, operations)."""


class IdMismatch(InvalidEvent):
    """An id does not match the content it is claimed for (a forged or corrupted event)."""


class InvalidState(DecodeError):
    """A state snapshot is malformed, or does not follow from the events it names (a forged
    or damaged state: its head, values or buffers differ from what its events give)."""


class InvalidMessage(DecodeError):
    """A wire frame does not decode to a message of this protocol."""


class RetrievalError(MyceliaError):
    """Something asked for is not available here."""


class EventNotFound(RetrievalError):
    """An event id is not known to this node (nor, where asked, to its peers)."""

    event_id: object = None

    def __init__(self, message: str, *, event_id: object = None) -> None:
        super().__init__(message)
        self.event_id = event_id


class EntityNotFound(RetrievalError):
    """An entity id is not known to this node."""


class LineageError(MyceliaError):
    """An event or state cannot be placed in its entity's history."""


class BudgetExceeded(LineageError):
    """The comparison walked more events than its budget allowed; no verdict was reached."""


class Disjoint(LineageError):
    """Two clocks share no history: they descend from different genesis events."""


class PendingLimit(LineageError):
    """Too many events are waiting for parents that have not arrived; the oldest were shed."""


class SystemError_(MyceliaError):  # noqa: N801 - trailing underscore avoids the builtin name
    """The node's system root is missing, or events belong to another system."""


class SystemNotReady(SystemError_):
    """This node has no system root yet: a durable node calls ``create_system()`` or
    ``join_system()``; a client connects once to a server to join its system (or, to work
    offline from its first run, calls ``join_system()`` with the system's root events)."""


class ForeignSystem(SystemError_):
    """The events or peer belong to a different system than this node's."""


class ForeignNode(SystemError_):
    """The data belongs to another node (another node key) than the store's own."""


class PolicyDenied(MyceliaError):
    """The policy agent refused the operation; nothing was persisted."""


class StorageError(MyceliaError):
    """The storage engine failed; the backend exception is chained as ``__cause__``."""


class StorageLocked(StorageError):
    """Another process holds the store open for writing."""


class StorageReadOnly(StorageError):
    """The store (or its directory) cannot be written."""


class StorageNotFound(StorageError):
    """There is no store at the path given (it is missing, or is a file): nothing was
    created there. Give the directory of an existing store, or open it writable to create
    one."""


class StorageCorrupt(StorageError):
    """The store's content fails its own integrity checks."""


class TransactionError(MyceliaError):
    """A transaction was misused."""


class TransactionClosed(TransactionError):
    """The transaction (or a handle from it) was used after commit or rollback."""


class CommitReverted(TransactionError):
    """A local commit was undone (ARCHITECTURE.md §7, "a refusal reverts").

    Either it was built on a commit the durable peer refused (``__cause__`` is that
    refusal), or the entity it edits was reverted to the peer's state while its
    transaction was open. Nothing of it remains anywhere; redo the edit if it still
    makes sense.
    """


class QueryError(MyceliaError):
    """A query could not be parsed or evaluated; ``column`` points at the problem (1-based)."""

    column: int | None = None

    def __init__(self, message: str, *, column: int | None = None) -> None:
        super().__init__(message if column is None else f"{message} (at column {column})")
        self.column = column


class QueryTooExpensive(QueryError):
    """A query is beyond the cost budget: too many terms, or more evaluation work than one
    query may take (ARCHITECTURE.md §8). Narrow it (an indexed condition, fewer ORs)."""


class UsageError(MyceliaError, RuntimeError):
    """The API was used in an order it does not allow (a live query iterated outside its
    ``async with``); the message says what to do instead."""


class NodeClosed(UsageError):
    """The node was closed (``node.close()``): it, its contexts, transactions and live
    queries answer nothing more. Open the store again with ``Node.open``."""


class ProtocolError(MyceliaError):
    """The peering protocol failed."""


class LocalProtocolError(ProtocolError):
    """This side was asked to do something the protocol forbids (a bug in the caller)."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol forbids; the connection is closed."""


class PresenceRejected(RemoteProtocolError):
    """The peer's Presence was refused: wrong protocol version, bad signature or system."""


class RequestTimeout(ProtocolError):
    """A request to a peer got no answer within its timeout."""


class ConnectTimeout(ProtocolError, TimeoutError):
    """``wait_ready(timeout=...)`` gave up before the durable peer was ready.

    The message names the connection's state and the last attempt's cause (connection
    refused, DNS, TLS, protocol version, handshake); ``state`` is the
    :class:`~mycelia.node.link.ConnectionState` value and ``cause`` the last error (also
    chained as ``__cause__``). The connection keeps trying after it is raised.
    """

    def __init__(self, message: str, *, state: str, cause: BaseException | None) -> None:
        super().__init__(message)
        self.state = state
        self.cause = cause


class RemoteError(ProtocolError):
    """The peer answered a request with an error; ``kind`` names its class, ``code`` is its
    wire code (see :func:`remote`: a peer's error is also an instance of that class)."""

    kind: str = "MyceliaError"
    code: int = 1

    def __init__(self, message: str, *, kind: str = "MyceliaError", code: int = 1) -> None:
        super().__init__(message)
        self.kind = kind
        self.code = code


class ConnectionClosed(ProtocolError):
    """The connection closed before the operation finished."""


class NotConnected(ConnectionClosed):
    """There was no open connection to send the request on: nothing was asked (a reader
    then answers from what this node holds)."""


class Overloaded(ProtocolError):
    """The peer refused work beyond one of its documented budgets (connections, bytes
    queued for a connection, bytes in flight): do less at once, or try again later."""


CODES: Final[Mapping[type[MyceliaError], int]] = MappingProxyType(
    {
        MyceliaError: 1,
        InvalidArgument: 101,
        ConfigError: 10101,
        AddressInUse: 1010101,
        DecodeError: 102,
        PayloadTooLarge: 10201,
        InvalidEvent: 10202,
        IdMismatch: 1020201,
        InvalidState: 10203,
        InvalidMessage: 10204,
        RetrievalError: 103,
        EventNotFound: 10301,
        EntityNotFound: 10302,
        LineageError: 104,
        BudgetExceeded: 10401,
        Disjoint: 10402,
        PendingLimit: 10403,
        SystemError_: 105,
        SystemNotReady: 10501,
        ForeignSystem: 10502,
        ForeignNode: 10503,
        PolicyDenied: 106,
        StorageError: 107,
        StorageLocked: 10701,
        StorageReadOnly: 10702,
        StorageNotFound: 10703,
        StorageCorrupt: 10704,
        TransactionError: 108,
        TransactionClosed: 10801,
        CommitReverted: 10802,
        QueryError: 109,
        QueryTooExpensive: 10901,
        UsageError: 111,
        NodeClosed: 11101,
        ProtocolError: 110,
        LocalProtocolError: 11001,
        RemoteProtocolError: 11002,
        PresenceRejected: 1100201,
        RequestTimeout: 11003,
        ConnectTimeout: 11007,
        RemoteError: 11004,
        ConnectionClosed: 11005,
        NotConnected: 1100501,
        Overloaded: 11006,
    }
)
"""Every error class → its stable wire code (see the module docstring)."""

_BY_CODE: Final = {code: cls for cls, code in CODES.items()}


def code_of(error: BaseException) -> int:
    """The wire code of ``error``: its class's, or its nearest coded ancestor's (1, the
    root, for anything that is not a MyceliaError)."""
    for cls in type(error).__mro__:
        code = CODES.get(cls)
        if code is not None:
            return code
    return CODES[MyceliaError]


def error_class(code: int) -> type[MyceliaError]:
    """The class a wire code names; an unknown code names its nearest known ancestor."""
    while code > 0:
        cls = _BY_CODE.get(code)
        if cls is not None:
            return cls
        code //= 100
    return MyceliaError


_REMOTE: dict[tuple[type[MyceliaError], type[MyceliaError]], type[MyceliaError]] = {}


def _combined(cls: type[MyceliaError], how: type[MyceliaError]) -> type[MyceliaError]:
    """A class that is both ``cls`` and ``how`` (RemoteError or ConnectionClosed), made
    once per pair; its constructor takes just the message."""
    if issubclass(cls, how):
        return cls
    if issubclass(how, cls):  # the root, or ProtocolError: ``how`` is one already
        return how
    made = _REMOTE.get((cls, how))
    if made is None:

        def init(self: MyceliaError, message: str) -> None:
            Exception.__init__(self, message)

        made = type(f"{how.__name__}[{cls.__name__}]", (cls, how), {"__init__": init})
        _REMOTE[(cls, how)] = made
    return made


def remote(code: int, text: str) -> RemoteError:
    """The error a peer answered a request with, as this node raises it: an instance of
    :class:`RemoteError` and of the class ``code`` names (``kind`` is that class's name,
    ``code`` the code as sent)."""
    cls = error_class(code)
    error = _combined(cls, RemoteError)(f"{cls.__name__}: {text}")
    assert isinstance(error, RemoteError)
    error.kind = cls.__name__
    error.code = code
    return error


def closed_by_peer(code: int, text: str) -> ConnectionClosed:
    """A connection the peer closed, saying why with an error code: an instance of
    :class:`ConnectionClosed` and of the class ``code`` names."""
    cls = error_class(code)
    closed = _combined(cls, ConnectionClosed)
    error = closed(f"the peer closed the connection: {cls.__name__}: {text}")
    assert isinstance(error, ConnectionClosed)
    return error
