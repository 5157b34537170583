"""Counting the O(document) text canonicalisations a piece of code makes (for the tests
that pin a path to O(diff))."""

from __future__ import annotations

import pytest

from mycelia.entity.backends import text_canon


def count_canonical(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on, one item per canonicalisation of a whole text document."""
    calls: list[int] = []
    canonical = text_canon.canonical

    def counted(doc: object) -> bytes:
        calls.append(1)
        return canonical(doc)  # type: ignore[arg-type]

    monkeypatch.setattr(text_canon, "canonical", counted)
    return calls
