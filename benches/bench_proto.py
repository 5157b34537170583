"""Proto benchmarks: encode+hash, decode+verify, Clock construction and membership, and
peering frames.

Targets (issue 2): encode+hash within 3x of msgpack.packb+sha256 of the same event;
decode+verify within 3x of msgpack.unpackb+sha256. Frames (issue 18): the declared
schemas of ``proto.peering`` cost what the hand-written codecs did (within 10%).

Run: ``python -m benches.bench_proto``
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

import msgpack

from benches.harness import Table, fmt_time, interleaved, options, verdict
from mycelia.proto.clock import Clock
from mycelia.proto.event import Event
from mycelia.proto.ids import EntityId, EventId
from mycelia.proto.messages import Message, decode_frame, encode_frame
from mycelia.proto.peering import Delta, DeltasResponse, EventsResponse, GetRequest, KnownEntity
from mycelia.proto.state import EntityState, State


def typical_event(rng: random.Random) -> Event:
    """An update like a one-field LWW commit: one parent, one small diff."""
    entity = EntityId(rng.randbytes(32))
    parent = Clock([EventId(rng.randbytes(32))])
    return Event.update(
        entity_id=entity,
        collection="albums",
        parent=parent,
        operations={"lww": [msgpack.packb([["year", 1987, 1]])]},
    )


def main(argv: Sequence[str] | None = None) -> None:
    options(__doc__, argv)  # --help
    rng = random.Random(2)
    event = typical_event(rng)
    blob = event.to_bytes()
    obj = msgpack.unpackb(blob)
    ops = dict(event.operations)
    n = 20_000
    t = interleaved(
        {
            "encode": lambda: Event.update(
                entity_id=event.entity_id,
                collection=event.collection,
                parent=event.parent,
                operations=ops,
            ),
            "packb+sha": lambda: hashlib.sha256(msgpack.packb(obj)).digest(),
            "decode": lambda: Event.from_bytes(blob),
            "unpackb+sha": lambda: (msgpack.unpackb(blob), hashlib.sha256(blob).digest()),
        },
        number=n,
    )
    enc_ratio = t["encode"] / t["packb+sha"]
    dec_ratio = t["decode"] / t["unpackb+sha"]
    Table(
        f"proto: one typical event ({len(blob)} bytes)",
        ["case", "median", "baseline (same run)", "ratio", "target", "ok"],
        [
            [
                "encode+hash",
                fmt_time(t["encode"]),
                fmt_time(t["packb+sha"]) + " packb+sha256",
                f"{enc_ratio:.2f}x",
                "≤ 3x",
                verdict(enc_ratio <= 3),
            ],
            [
                "decode+verify",
                fmt_time(t["decode"]),
                fmt_time(t["unpackb+sha"]) + " unpackb+sha256",
                f"{dec_ratio:.2f}x",
                "≤ 3x",
                verdict(dec_ratio <= 3),
            ],
        ],
    ).print()

    rows = []
    for width in (8, 64, 512):
        ids = [EventId(rng.randbytes(32)) for _ in range(width)]
        reverse = sorted(ids, reverse=True)
        clock = Clock(ids)
        probe = ids[width // 3]
        c = interleaved(
            {
                "build": lambda r=reverse: Clock(r),  # type: ignore[misc]
                "contains": lambda p=probe, c=clock: p in c,  # type: ignore[misc]
                "sorted": lambda r=reverse: sorted(r),  # type: ignore[misc]
            },
            number=2000 if width == 512 else 20_000,
        )
        rows.append(
            [str(width), fmt_time(c["build"]), fmt_time(c["sorted"]), fmt_time(c["contains"])]
        )
    Table(
        "proto: Clock",
        ["width", "Clock(reverse-sorted ids)", "baseline sorted(list)", "`in`"],
        rows,
    ).print()
    Table("proto: peering frames", ["frame", "size", "encode", "decode"], frame_rows()).print()


def sample_frames(rng: random.Random) -> dict[str, Message]:
    """Three frames a catch-up sends: events, deltas with states, a get with known heads."""
    entity = EntityId(rng.randbytes(32))
    events, parent = [], Clock([EventId(rng.randbytes(32))])
    for i in range(100):
        ops = {"lww": [bytes([i]) * 20]}
        event = Event.update(entity_id=entity, collection="albums", parent=parent, operations=ops)
        events.append(event)
        parent = Clock([event.id])
    head = {events[-1].id: 100}
    state = EntityState(entity, "albums", State.of(head=head, buffers={"lww": b"\x90" * 50}))
    base = (events[0].id,)
    deltas = [
        Delta(EntityId(rng.randbytes(32)), "albums", True, state, (), base) for _ in range(50)
    ]
    known = [KnownEntity(EntityId(rng.randbytes(32)), base) for _ in range(100)]
    ids = tuple(EntityId(rng.randbytes(32)) for _ in range(100))
    return {
        "EventsResponse, 100 events": EventsResponse(1, tuple(events), tuple(range(1, 101))),
        "DeltasResponse, 50 states": DeltasResponse(2, tuple(deltas)),
        "GetRequest, 100 ids + heads": GetRequest(3, ids, tuple(known)),
    }


def frame_rows() -> list[list[str]]:
    rows = []
    for name, msg in sample_frames(random.Random(4)).items():
        frame = encode_frame(msg)
        t = interleaved(
            {"encode": lambda m=msg: encode_frame(m), "decode": lambda f=frame: decode_frame(f)},  # type: ignore[misc]
            number=300,
        )
        rows.append([name, f"{len(frame)} B", fmt_time(t["encode"]), fmt_time(t["decode"])])
    return rows


if __name__ == "__main__":
    main()
