"""`mycelia serve` as a real process, with clients in other real processes."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

import mycelia
from mycelia import Model, Node
from mycelia.cli.main import build_parser
from mycelia.storage import MemoryStorage
from tests.hostile.serving import start

CLIENT = """
import asyncio, sys
import mycelia
from mycelia import Model, Node
from mycelia.cli.main import build_parser
from mycelia.storage import MemoryStorage

class Album(Model, collection="albums"):
    artist: str
    year: int

async def main():
    node = await Node.open(MemoryStorage(), durable=False)
    await mycelia.connect(node, sys.argv[1])
    await node.wait_ready(timeout=20)
    async with node.context().transaction() as trx:
        album = trx.create(Album, artist="from another process", year=1999)
    print(album.id, flush=True)
    await node.close()

asyncio.run(main())
"""


class Album(Model, collection="albums"):
    artist: str
    year: int


async def start_server(data: Path) -> tuple[asyncio.subprocess.Process, str]:
    served = await start(data)  # logs to data's sibling .log; the child keeps its own copy
    return served.process, served.url


async def test_clients_in_other_processes_sync_through_a_served_lmdb_node(tmp_path: Path) -> None:
    server, url = await start_server(tmp_path / "data")
    watcher = await Node.open(MemoryStorage(), durable=False)
    await mycelia.connect(watcher, url)
    await watcher.wait_ready(timeout=20)
    async with watcher.context().query(Album, "year > ?", 1990) as live:
        changes = aiter(live)
        assert (await anext(changes)).initial == []
        writer = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CLIENT,
            url,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        out, _ = await asyncio.wait_for(writer.communicate(), 60)
        assert writer.returncode == 0
        created = mycelia.EntityId.from_base64(out.decode().strip())
        seen = await asyncio.wait_for(anext(changes), 20)
        assert [v.id for v in seen.added] == [created]
    assert [
        v.id for v in await watcher.context().fetch(Album, "artist = ?", "from another process")
    ] == [created]
    await watcher.close()
    server.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(server.wait(), 30) == 0
    # The data survived the clean shutdown: a new server process serves it.
    server, url = await start_server(tmp_path / "data")
    reader = await Node.open(MemoryStorage(), durable=False)
    await mycelia.connect(reader, url)
    await reader.wait_ready(timeout=20)
    assert (await reader.context().get(Album, created)).year == 1999
    await reader.close()
    server.send_signal(signal.SIGINT)
    assert await asyncio.wait_for(server.wait(), 30) == 0


def test_help_explains_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = capsys.readouterr().out
    for flag in ("--data", "--host", "--port", "--postgres", "--deflate"):
        assert flag in text
