"""The adversarial corpus against a live node: every item refused, nothing persisted.

The corpus lives in ``tests/testing/corpus/`` (regenerate with
``python -m mycelia.testing.corpus --write tests/testing/corpus/``). Each item is sent on its
own connection to a real ``mycelia.serve`` websocket server on 127.0.0.1; the node must
answer with a typed error (an ErrorResponse naming a MyceliaError class), a
PresenceRejected or a close — the one the manifest expects — and its storage (every
record of a full dump, the change-feed offset) and its pending pool must be unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import mycelia
from mycelia import Server, errors
from mycelia.node import Node
from mycelia.proto import Clock, Event, Limits
from mycelia.proto.messages import encode_frame
from mycelia.proto.peering import CommitRequest
from mycelia.storage import MemoryStorage
from mycelia.testing.corpus import (
    CorpusItem,
    CorpusNote,
    Fixture,
    build_corpus,
    load_corpus,
    open_fixture,
)

from .hostile import outcome

CORPUS = Path(__file__).parent / "corpus"
ROOT, ITEMS = load_corpus(CORPUS)


def test_the_checked_in_corpus_is_what_the_generator_writes() -> None:
    fixture, items = asyncio.run(build_corpus())
    assert fixture.root == ROOT, "the fixture changed: regenerate the corpus"
    assert items == ITEMS, "stale corpus: python -m mycelia.testing.corpus --write " + str(CORPUS)


def test_the_corpus_covers_every_category_of_the_issue() -> None:
    categories = {item.category for item in ITEMS}
    assert categories >= {
        "malformed frames",
        "forged ids",
        "foreign parents",
        "oversized clocks and batches",
        "cycles by claim",
        "phantom entities",
        "replays from another system",
    }


@pytest.fixture
async def live() -> AsyncIterator[tuple[Fixture, Server]]:
    fixture = await open_fixture()
    assert fixture.root == ROOT, "the fixture node changed: regenerate the corpus"
    server = await mycelia.serve(fixture.node, host="127.0.0.1", port=0, handshake_timeout=2.0)
    yield fixture, server
    await server.close()
    await fixture.node.close()


async def _persisted(node: Node) -> tuple[object, ...]:
    """Everything the node has made durable, plus what it holds pending."""
    records = [record async for record in node.storage.dump()]
    return (await node.storage.last_offset(), records, node.stats().held_events)


def _typed(verdict: str) -> bool:
    if verdict in ("close", "rejected"):
        return True
    kind = verdict.removeprefix("error:")
    cls = getattr(errors, kind, None)
    return isinstance(cls, type) and issubclass(cls, errors.MyceliaError)


async def _still_serving(fixture: Fixture, server: Server) -> None:
    client = await Node.open(MemoryStorage(), durable=False)
    await mycelia.connect(client, f"ws://127.0.0.1:{server.port}")
    await client.wait_ready(timeout=10)
    async with client.context().transaction() as trx:
        note = trx.create(CorpusNote, text="fine", body="")
    assert (await fixture.node.context().get(CorpusNote, note.id)).text == "fine"
    await client.close()


async def _refused_without_trace(
    fixture: Fixture, server: Server, item: CorpusItem, expect: tuple[str, ...]
) -> None:
    before = await _persisted(fixture.node)
    verdict = await outcome(f"ws://127.0.0.1:{server.port}", item, fixture.root)
    assert verdict in expect, f"{item.name} ({item.description}): got {verdict}"
    assert _typed(verdict), f"{item.name}: {verdict} is not a typed refusal"
    assert await _persisted(fixture.node) == before, f"{item.name} left something behind"
    await _still_serving(fixture, server)


@pytest.mark.parametrize("item", ITEMS, ids=[item.name for item in ITEMS])
async def test_every_corpus_item_is_refused_and_leaves_nothing_behind(
    live: tuple[Fixture, Server], item: CorpusItem
) -> None:
    fixture, server = live
    await _refused_without_trace(fixture, server, item, item.expect)


def _big_items(fixture: Fixture) -> list[CorpusItem]:
    """Items too large to check in, built at run time."""
    huge_operation = Event.update(
        entity_id=fixture.a[0].entity_id,
        collection=CorpusNote.__collection__,
        parent=Clock([fixture.a[1].id]),
        operations={"x_blob": [bytes(600 * 1024), bytes(600 * 1024)]},
        limits=Limits(max_operation_bytes=1 << 21),  # minted past the node's limit
    )
    kind = "oversized clocks and batches"
    return [
        CorpusItem("frame-over-4-MiB", kind, "a 5 MiB frame", (bytes(5 << 20),), ("close",)),
        CorpusItem(
            "operations-over-1-MiB",
            kind,
            "an event carrying 1.2 MiB of operations",
            (encode_frame(CommitRequest(1, (huge_operation,))),),
            ("error:PayloadTooLarge",),  # a request over a limit fails alone
        ),
    ]


@pytest.mark.parametrize("which", [0, 1], ids=["frame-over-4-MiB", "operations-over-1-MiB"])
async def test_oversized_frames_built_at_run_time_are_refused(
    live: tuple[Fixture, Server], which: int
) -> None:
    fixture, server = live
    item = _big_items(fixture)[which]
    await _refused_without_trace(fixture, server, item, item.expect)


async def test_the_client_tells_an_accepted_commit_from_a_refusal(
    live: tuple[Fixture, Server],
) -> None:
    fixture, server = live
    fine = Event.update(
        entity_id=fixture.a[0].entity_id,
        collection=CorpusNote.__collection__,
        parent=Clock([fixture.a[1].id]),
        operations={},
    )
    item = CorpusItem(
        "valid", "control", "a valid commit", (encode_frame(CommitRequest(1, (fine,))),), ()
    )
    assert await outcome(f"ws://127.0.0.1:{server.port}", item, fixture.root) == "answered:Ack"
