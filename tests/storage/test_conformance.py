"""The conformance suite (mycelia.storage.testing) on every engine: memory, LMDB, PostgreSQL."""

from __future__ import annotations

import pytest

from mycelia.storage.testing import CHECKS, EngineSpec


@pytest.mark.parametrize("check", list(CHECKS))
async def test_engine_conforms(engine_spec: EngineSpec, check: str) -> None:
    await CHECKS[check](engine_spec)
