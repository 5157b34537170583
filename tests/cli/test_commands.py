"""`mycelia inspect`, `dump` and `load` on real LMDB stores."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mycelia import EntityId, Model, Node
from mycelia.cli.main import main
from mycelia.storage.lmdb import LmdbStorage


class Note(Model, collection="notes"):
    text: str


async def fill(path: Path, count: int) -> list[EntityId]:
    node = await Node.open(LmdbStorage(path), durable=True)
    await node.create_system()
    async with node.context().transaction() as trx:
        ids = [trx.create(Note, text=f"n{i}").id for i in range(count)]
    await node.close()
    return ids


def test_dump_then_load_into_a_fresh_store_keeps_everything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = asyncio.run(fill(tmp_path / "a", 25))
    dump = tmp_path / "a.dump"
    assert main(["dump", str(tmp_path / "a"), str(dump)]) == 0
    assert "dumped" in capsys.readouterr().err
    assert main(["load", str(dump), str(tmp_path / "b")]) == 0
    assert "loaded" in capsys.readouterr().err

    async def check() -> None:
        node = await Node.open(LmdbStorage(tmp_path / "b"), durable=True)
        texts = sorted(v.text for v in await node.context().fetch(Note, ""))
        assert texts == sorted(f"n{i}" for i in range(25))
        assert len(ids) == 25
        await node.close()

    asyncio.run(check())


def test_inspect_prints_a_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    asyncio.run(fill(tmp_path / "a", 3))
    assert main(["inspect", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "node id" in out
    assert "notes: 3 entities" in out


def test_a_tampered_dump_is_refused_with_a_typed_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ids = asyncio.run(fill(tmp_path / "a", 5))

    async def event_bytes() -> bytes:
        storage = LmdbStorage(tmp_path / "a")
        (genesis,) = await storage.events_of(ids[2])
        await storage.close()
        return genesis.to_bytes()

    original = asyncio.run(event_bytes())
    dump = tmp_path / "a.dump"
    assert main(["dump", str(tmp_path / "a"), str(dump)]) == 0
    data = dump.read_bytes()
    at = data.index(original) + len(original) - 1  # the last byte of a note's value
    forged = data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]
    dump.write_bytes(forged)
    assert main(["load", str(dump), str(tmp_path / "b")]) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors
    assert errors[0].startswith(("InvalidEvent", "IdMismatch", "DecodeError")), errors
