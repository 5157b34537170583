"""Property backends: LWW registers, collaborative text, and an opaque keeper for unknown ones."""

from mycelia.entity.backends.base import Backend
from mycelia.entity.backends.lww import LwwBackend
from mycelia.entity.backends.opaque import OpaqueBackend
from mycelia.entity.backends.text import ClientIds, TextBackend

__all__ = ["Backend", "ClientIds", "LwwBackend", "OpaqueBackend", "TextBackend"]
