"""W1, commit on A → change on B: the latency of one edit from a client to another.

A and B are clients of one server in this process, each with a live query over the 1,000
:class:`~benches.peers.harness.Fields` entities. A commits each of 1,000 field sets with
``wait="local"`` (a pycrdt set is local too); the clock stops when B's live query yields
the new value, and the next edit starts only after B saw the previous one. Figures: p50,
p99 and max in ms. Every commit must be confirmed by the end, or the run fails.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from benches.peers.harness import (
    EDITS,
    ENTITIES,
    FIELDS,
    Fields,
    Figures,
    Mirror,
    Server,
    Sizes,
    client,
    confirm_all,
    create_fields,
    parse_key,
    repeat,
    set_field,
    within,
)


async def w1(peer: ModuleType, sizes: Sizes, workdir: Path) -> dict[str, list[float]]:
    async def run(i: int) -> Figures:
        server = await Server.start(workdir / f"w1-{i}")
        a, b = await client(server.url), await client(server.url)
        try:
            ids = await create_fields(a, ENTITIES)
            a_live = await Mirror.open(a, Fields)
            waiting: list[Any] = [None]  # (entity id, field, value, future)

            def seen(view: Any) -> None:
                want = waiting[0]
                if (
                    want is not None
                    and view.id == want[0]
                    and getattr(view, want[1]) == want[2]
                    and not want[3].done()
                ):
                    want[3].set_result(time.perf_counter())

            b_live = await Mirror.open(b, Fields, seen)
            await b_live.wait_members(ENTITIES)
            await a_live.wait_members(ENTITIES)
            loop = asyncio.get_running_loop()
            lat, pending = [], []
            for key, value in peer.entity_edits(peer.SEED + i, EDITS, ENTITIES, FIELDS):
                entity, fieldno = parse_key(key)
                waiting[0] = (ids[entity], fieldno, value, loop.create_future())
                t0 = time.perf_counter()
                pending.append(await set_field(a, ids, key, value, wait="local"))
                lat.append((await within(waiting[0][3], "W1: B seeing A's edit") - t0) * 1e3)
            errors = await confirm_all(pending)
            if errors:
                raise RuntimeError(f"W1: {len(errors)} commits failed, first: {errors[0]!r}")
            await a_live.close()
            await b_live.close()
        finally:
            await a.close()
            await b.close()
            await server.kill()
        lat.sort()
        return {
            "p50": peer.percentile(lat, 0.50),
            "p99": peer.percentile(lat, 0.99),
            "max": lat[-1],
        }

    return await repeat("W1", sizes, run)
