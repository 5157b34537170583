"""Sample models the simulator uses when it is given none (every field kind is exercised).

They live in their own collections (``sim_notes``, ``sim_links``), so they never collide
with a user's models.
"""

from __future__ import annotations

from mycelia.entity.fieldtypes import Json, Ref, Text
from mycelia.entity.model import Model

__all__ = ["SimLink", "SimNote"]


class SimNote(Model, collection="sim_notes"):
    """A note: LWW fields of most kinds, a collaborative text body and a JSON payload."""

    title: str | None
    rank: int | None
    body: Text
    tags: Json
    done: bool = False


class SimLink(Model, collection="sim_links"):
    """A link to a note, with a float weight and opaque bytes."""

    target: Ref[SimNote] | None
    weight: float | None
    blob: bytes | None
