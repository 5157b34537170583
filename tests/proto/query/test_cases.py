"""The shared case file ``cases.json``, run against the in-memory executor.

Storage engines run the same file (ARCHITECTURE.md §8): row id N is ``bytes([N]) * 32``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mycelia.proto.query import parse, sort_rows

CASES_FILE = Path(__file__).with_name("cases.json")
_DATA: dict[str, Any] = json.loads(CASES_FILE.read_text(encoding="utf-8"))
ROWS = [(bytes([row["id"]]) * 32, row["values"]) for row in _DATA["rows"]]


@pytest.mark.parametrize("case", _DATA["cases"], ids=lambda case: case["query"] or "<empty>")
def test_the_in_memory_executor_returns_each_expected_result(case: dict[str, Any]) -> None:
    query = parse(case["query"]).bind(*case["args"])
    assert [row_id[0] for row_id, _ in sort_rows(ROWS, query)] == case["expected"]
    assert parse(query.to_text()) == query


def test_the_case_file_covers_the_language() -> None:
    assert len(ROWS) >= 40
    assert len({row_id for row_id, _ in ROWS}) == len(ROWS)
    text = " ".join(case["query"].upper() for case in _DATA["cases"])
    for needle in [" NOT IN ", " IN ", "IS NULL", "IS NOT NULL", " OR ", " AND ", "NOT ", "<>",
                   "!=", "<=", ">=", "ORDER BY", " DESC", "LIMIT", "?", ".", "-", "E"]:  # fmt: skip
        assert needle in text, needle
