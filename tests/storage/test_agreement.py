"""The differential machine: every engine, driven in lockstep, holds the same content."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from mycelia.storage.testing import agreement_machine
from tests.storage.conftest import PostgresSchemas, lmdb_spec, memory_spec


def test_memory_and_lmdb_agree_after_every_step(tmp_path: Path) -> None:
    machine = agreement_machine([memory_spec(), lmdb_spec(tmp_path)])
    run_state_machine_as_test(machine, settings=settings(max_examples=30, stateful_step_count=25))


@pytest.mark.postgres
def test_memory_lmdb_and_postgres_agree_after_every_step(
    tmp_path: Path, pg_schemas: PostgresSchemas
) -> None:
    machine = agreement_machine([memory_spec(), lmdb_spec(tmp_path), pg_schemas.spec()])
    run_state_machine_as_test(machine, settings=settings(max_examples=12, stateful_step_count=20))


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(1800)
def test_engines_agree_in_a_long_soak(tmp_path: Path, pg_schemas: PostgresSchemas) -> None:
    machine = agreement_machine([memory_spec(), lmdb_spec(tmp_path), pg_schemas.spec()])
    run_state_machine_as_test(machine, settings=settings(max_examples=150, stateful_step_count=40))
