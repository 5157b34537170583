"""Shared test setup: hypothesis profiles (registered once, STYLE.md §17).

``dev`` (default) keeps the suite fast; ``ci`` runs more examples. Pick one with
``HYPOTHESIS_PROFILE=ci``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

import mycelia.node  # noqa: F401  (imports the hot path, for the report header)
from mycelia.compiled import loaded

settings.register_profile(
    "dev",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_report_header() -> str:
    """Which form of the hot path this run tests (``make test`` runs both: §13)."""
    modules = loaded()
    return f"mycelia: {len(modules)} compiled modules" if modules else "mycelia: pure Python"
