"""The models the cluster tests edit."""

from __future__ import annotations

from mycelia import Model, Text


class Card(Model, collection="cards"):
    """A shared entity: an LWW title and counter, and a text everybody appends to."""

    title: str = ""
    n: int = 0
    body: Text
