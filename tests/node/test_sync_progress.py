"""A client's large initial sync shows its progress: log lines, or a bar on a terminal."""

from __future__ import annotations

import asyncio
import logging

import pytest

from mycelia import Model, Node
from mycelia.node import progress
from mycelia.node.inprocess import InProcessServer
from mycelia.node.progress import Slow
from mycelia.storage import MemoryStorage


class Note(Model, collection="notes"):
    title: str


async def test_a_slow_first_result_logs_its_progress_and_one_closing_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    server_node = await Node.open(MemoryStorage(), durable=True)
    await server_node.create_system()
    async with server_node.context().transaction() as trx:
        for i in range(300):
            trx.create(Note, title=f"n{i}")
    server = InProcessServer(server_node)
    app = await Node.open(MemoryStorage(), durable=False)
    server.connect(app)
    await app.wait_ready(timeout=10)
    monkeypatch.setattr(progress, "SLOW_AFTER", 0.0)  # every sync counts as slow here
    caplog.set_level(logging.INFO, logger="mycelia.node.node")
    async with app.context().query(Note, "") as live:
        assert len(live.items) == 300
    lines = [r.getMessage() for r in caplog.records if r.name == "mycelia.node.node"]
    assert "first result of notes '': 0 entities so far ..." in lines, lines
    assert "first result of notes '': 300 entities in 0 s, done" in lines, lines
    await app.close()
    await server.close()
    await server_node.close()


async def test_fast_work_shows_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with Slow("quick", lambda: 0, log=logging.getLogger("t"), bar=True) as slow:
        await asyncio.sleep(0)
    assert not slow.shown
    assert caplog.records == []
