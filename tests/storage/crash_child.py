"""The process the crash tests kill: commits continuously through the Node API.

``python -m tests.storage.crash_child lmdb PATH`` or ``... postgres DSN SCHEMA``. Several
committers create and edit ``Counter`` entities; after each commit returns, the child
prints ``<entity id> <n>`` (the value just committed) and flushes, so every line the
parent reads is an acknowledged commit. A typist types one character per commit into a
``Page`` whose text starts past LMDB's ``ASIDE_BYTES`` (its parts are stored aside) and
prints ``T <entity id> <length>``. It runs until it is killed.
"""

from __future__ import annotations

import asyncio
import sys

from mycelia import Model, Node, Text
from mycelia.node import Context
from mycelia.proto import EntityId
from mycelia.storage import StorageEngine
from mycelia.storage.lmdb import LmdbStorage

WORKERS = 8


class Counter(Model, collection="counters"):
    worker: int
    n: int


class Page(Model, collection="pages"):
    body: Text


PAGE = "crash " * 1000
"""A page's first text: 6,000 characters, past ASIDE_BYTES."""


async def committer(ctx: Context, worker: int) -> None:
    """Create an entity, edit it a few times, repeat; ack every commit on stdout."""
    entity: EntityId | None = None
    n = 0
    while True:
        n += 1
        async with ctx.transaction() as trx:
            if entity is None or n % 4 == 0:
                entity = trx.create(Counter, worker=worker, n=n).id
            else:
                (await trx.edit(Counter, entity)).n = n
        sys.stdout.write(f"{entity} {n}\n")
        sys.stdout.flush()


async def typist(ctx: Context) -> None:
    """Type into a long text one character per commit (a new page now and then); ack each
    commit with the text's length."""
    page: EntityId | None = None
    length = 0
    while True:
        async with ctx.transaction() as trx:
            if page is None or length >= len(PAGE) + 200:
                page, length = trx.create(Page, body=PAGE).id, len(PAGE)
            else:
                (await trx.edit(Page, page)).body.insert(length // 2, "k")
                length += 1
        sys.stdout.write(f"T {page} {length}\n")
        sys.stdout.flush()


def open_storage(argv: list[str]) -> StorageEngine:
    if argv[0] == "lmdb":
        return LmdbStorage(argv[1])
    from mycelia.storage.postgres import PostgresStorage  # noqa: PLC0415 - optional driver

    return PostgresStorage(argv[1], schema=argv[2])


async def main(argv: list[str]) -> None:
    node = await Node.open(open_storage(argv), durable=True)
    await node.create_system()
    ctx = node.context()
    await asyncio.gather(typist(ctx), *(committer(ctx, w) for w in range(WORKERS)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
