"""Crash tests (ARCHITECTURE.md §1.2, §12): kill -9 a committing process, then check.

A real subprocess (:mod:`tests.storage.crash_child`) commits continuously through the Node
API and acknowledges each commit on stdout after it returns. The parent kills it with
SIGKILL after a random (seeded) number of acknowledgements — the child is mid-commit by
then, with several committers in flight — and after every kill checks that:

- the store opens without any repair step (a durable ``Node.open`` on it just works);
- every acknowledged commit is there (each entity holds at least the last acked value,
  each typed page at least the last acked length: its text is read back from its parts);
- no state references a missing event, and no stored event a missing parent.
"""

from __future__ import annotations

import asyncio
import random
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from mycelia import Node
from mycelia.proto import EntityId, EventId
from mycelia.storage import StorageEngine
from mycelia.storage.engine import EntityRecord
from mycelia.storage.lmdb import LmdbStorage
from tests.storage.conftest import PostgresSchemas
from tests.storage.crash_child import PAGE, Counter, Page

pytestmark = pytest.mark.crash

REPO = Path(__file__).resolve().parents[2]


Acked = dict[tuple[str, EntityId], int]
"""The last acknowledged value of each entity, by kind: ``"n"`` a Counter's ``n``, ``"T"``
a Page's text length."""


async def run_until_killed(argv: list[str], acks_before_kill: int) -> Acked:
    """Start the child, SIGKILL it after ``acks_before_kill`` acks; every ack it printed."""
    with tempfile.TemporaryFile() as errors:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.storage.crash_child", *argv,
            cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=errors,
        )  # fmt: skip
        assert child.stdout is not None
        lines: list[bytes] = []
        try:
            async with asyncio.timeout(60):
                while len(lines) < acks_before_kill:
                    line = await child.stdout.readline()
                    if not line.endswith(b"\n"):
                        errors.seek(0)
                        raise AssertionError(f"the child died by itself: {errors.read()!r}")
                    lines.append(line)
        finally:
            child.kill()
            await child.wait()
        # Lines already in the pipe were printed after their commit returned: acked too.
        lines += (await child.stdout.read()).split(b"\n")[:-1]
    acked: Acked = {}
    for line in lines:
        *kind, text, n = line.decode().split()
        key = (kind[0] if kind else "n", EntityId.from_base64(text))
        acked[key] = max(acked.get(key, 0), int(n))
    return acked


async def assert_consistent(storage: StorageEngine) -> int:
    """No state names a missing event, no event a missing parent; returns the events."""
    events: dict[EntityId, set[EventId]] = {}
    records: list[EntityRecord] = []
    async for record in storage.dump():
        if isinstance(record, EntityRecord):
            records.append(record)
            events.setdefault(record.entity_id, set()).update(e.id for e in record.events)
    for record in records:
        known = events[record.entity_id]
        for event in record.events:
            assert set(event.parent) <= known, f"event {event.id} has a missing parent"
        if record.state is not None:
            head = set(record.state.state.state.head)
            assert head <= known, f"state of {record.entity_id} names missing events"
    return sum(len(ids) for ids in events.values())


async def check_after_crash(
    open_storage: Callable[[], Awaitable[StorageEngine]], acked: Acked
) -> None:
    node = await Node.open(await open_storage(), durable=True)
    try:
        ctx = node.context()
        for (kind, entity_id), n in acked.items():
            if kind == "T":
                length = len(str((await ctx.get(Page, entity_id)).body))
                assert length >= n, f"acknowledged keystroke {n} of {entity_id} lost ({length})"
                continue
            view = await ctx.get(Counter, entity_id)
            assert view.n >= n, f"acknowledged commit n={n} of {entity_id} lost (has {view.n})"
        await assert_consistent(node.storage)
    finally:
        await node.close()


async def crash_loop(
    argv: list[str], open_storage: Callable[[], Awaitable[StorageEngine]], *, kills: int, seed: int
) -> Acked:
    rng = random.Random(seed)
    acked: Acked = {}
    for _ in range(kills):
        for key, n in (await run_until_killed(argv, rng.randint(1, 80))).items():
            acked[key] = max(acked.get(key, 0), n)
        await check_after_crash(open_storage, acked)
    return acked


async def test_lmdb_keeps_every_acknowledged_commit_across_50_kills(tmp_path: Path) -> None:
    path = tmp_path / "store"

    async def open_storage() -> StorageEngine:
        return LmdbStorage(path)

    acked = await crash_loop(["lmdb", str(path)], open_storage, kills=50, seed=5)
    assert len(acked) > 50
    assert any(kind == "T" and n > len(PAGE) for (kind, _), n in acked.items()), "none typed"


@pytest.mark.postgres
async def test_postgres_keeps_every_acknowledged_commit_across_kills(
    pg_schemas: PostgresSchemas,
) -> None:
    from mycelia.storage.postgres import PostgresStorage  # noqa: PLC0415 - optional driver

    schema = pg_schemas.new_schema()

    async def open_storage() -> StorageEngine:
        return await PostgresStorage(pg_schemas.dsn, schema=schema).open()

    acked = await crash_loop(["postgres", pg_schemas.dsn, schema], open_storage, kills=20, seed=7)
    assert len(acked) > 20
    assert any(kind == "T" and n > len(PAGE) for (kind, _), n in acked.items()), "none typed"
