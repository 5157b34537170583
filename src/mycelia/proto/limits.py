"""Decode-time limits (ARCHITECTURE.md §3 "Limits").

Every decoder takes a :class:`Limits` and refuses input beyond it with
:class:`~mycelia.errors.PayloadTooLarge` before allocating for it. The defaults are the
documented constants below; a node can be opened with its own :class:`Limits`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "DEFAULT_LIMITS",
    "FRAME_ENVELOPE",
    "MAX_BATCH_COMMITS",
    "MAX_BATCH_EVENTS",
    "MAX_CLOCK_WIDTH",
    "MAX_COLLECTION_NAME",
    "MAX_FRAME_BYTES",
    "MAX_HANDSHAKE_FRAME",
    "MAX_NESTING_DEPTH",
    "MAX_OPERATION_BYTES",
    "MAX_PARENTS",
    "MAX_STRING_LENGTH",
    "Limits",
]

MAX_FRAME_BYTES: Final = 4 * 1024 * 1024
"""Largest wire frame (one websocket message) or stored record, in bytes."""
MAX_HANDSHAKE_FRAME: Final = 16 * 1024
"""Largest frame a peer may send before the handshake completes (a Presence, or a proof
with its token): what an unauthenticated peer can make a node read and decode."""
FRAME_ENVELOPE: Final = 64 * 1024
"""Room a frame keeps for what surrounds one entity's snapshot (ids, names, the message)."""
MAX_BATCH_EVENTS: Final = 10_000
"""Most events in one batch (a frame, a commit, a bridge)."""
MAX_BATCH_COMMITS: Final = 128
"""Most commits in one frame (a ``CommitsRequest``): a responder applies them together, or
one by one when one is refused, so this bounds the writes one frame can cost."""
MAX_PARENTS: Final = 256
"""Most parents one event may name."""
MAX_CLOCK_WIDTH: Final = 256
"""Most ids in any clock on the wire (heads, known heads)."""
MAX_OPERATION_BYTES: Final = 1024 * 1024
"""Most bytes of operations (all diffs together) in one event."""
MAX_STRING_LENGTH: Final = 64 * 1024
"""Longest string anywhere in a decoded value."""
MAX_COLLECTION_NAME: Final = 64
"""Longest collection, backend or property name."""
MAX_NESTING_DEPTH: Final = 32
"""Deepest nesting of a ``Json`` value."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """The limits one node enforces on what it decodes; see the module constants."""

    max_frame_bytes: int = MAX_FRAME_BYTES
    max_batch_events: int = MAX_BATCH_EVENTS
    max_batch_commits: int = MAX_BATCH_COMMITS
    max_parents: int = MAX_PARENTS
    max_clock_width: int = MAX_CLOCK_WIDTH
    max_operation_bytes: int = MAX_OPERATION_BYTES
    max_string_length: int = MAX_STRING_LENGTH
    max_name_length: int = MAX_COLLECTION_NAME
    max_nesting_depth: int = MAX_NESTING_DEPTH
    max_handshake_bytes: int = MAX_HANDSHAKE_FRAME
    max_entity_bytes: int = field(init=False, repr=False, compare=False)
    """The largest encoded state an entity may reach (derived): its snapshot must fit in
    one frame with :data:`FRAME_ENVELOPE` to spare, so an event that would grow an entity
    beyond it is refused at commit (ARCHITECTURE.md §7, "Paged answers")."""
    max_array_length: int = field(init=False, repr=False, compare=False)
    """The longest msgpack array any of our shapes may contain (derived)."""
    cache: dict[str, object] = field(
        init=False, repr=False, compare=False, hash=False, default_factory=dict
    )
    """Derived decoder settings, memoised by the codec (not part of the value)."""

    def __post_init__(self) -> None:
        longest = max(self.max_batch_events, self.max_parents, self.max_clock_width)
        object.__setattr__(self, "max_array_length", longest)
        room = max(self.max_frame_bytes - FRAME_ENVELOPE, self.max_frame_bytes // 2)
        object.__setattr__(self, "max_entity_bytes", room)


DEFAULT_LIMITS: Final = Limits()
