"""W2, catch-up: a fresh client's connect until its live query holds every last write.

The server is built once for all runs: one client writes 10,000 field sets (one
transaction each, pipelined) until the server confirmed all. Each run then times a fresh
client from its connect until its live query over the 1,000 entities holds the last write
of every key (a key missing or stale fails the run); bytes are the server's frame bytes
sent meanwhile (its ``/metrics``).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import ModuleType

from benches.peers.harness import (
    ENTITIES,
    FIELDS,
    W2_EDITS,
    Fields,
    Figures,
    Mirror,
    Server,
    Sizes,
    client,
    confirm_all,
    create_fields,
    missing_keys,
    repeat,
    set_field,
)


async def w2(peer: ModuleType, sizes: Sizes, workdir: Path) -> dict[str, list[float]]:
    server = await Server.start(workdir / "w2")
    try:
        edits = peer.entity_edits(peer.SEED + 2, W2_EDITS, ENTITIES, FIELDS)
        expected = dict(edits)
        writer = await client(server.url)
        ids = await create_fields(writer, ENTITIES)
        live = await Mirror.open(writer, Fields)
        await live.wait_members(ENTITIES)
        t0 = time.perf_counter()
        pending = []
        for key, value in edits:  # one transaction, one commit per edit
            pending.append(await set_field(writer, ids, key, value, wait="local"))
            await asyncio.sleep(0)
        errors = await confirm_all(pending)  # the server holds everything
        build_s = time.perf_counter() - t0
        await live.close()
        await writer.close()
        del pending, live, writer  # the fresh clients measured below hold none of this
        if errors:
            raise RuntimeError(f"W2 build: {len(errors)} commits failed, first: {errors[0]!r}")
        print(
            f"  mycelia W2: {W2_EDITS:,} separate edits ({len(expected):,} distinct keys) "
            f"confirmed in {build_s:.2f} s ({W2_EDITS / build_s:,.0f} edits/s)",
            flush=True,
        )

        async def run(i: int) -> Figures:
            before = await server.wire()
            t0 = time.perf_counter()
            fresh = await client(server.url)
            mirror = await Mirror.open(fresh, Fields)
            await mirror.wait_members(ENTITIES)
            elapsed = time.perf_counter() - t0
            after = await server.wire()
            missing = missing_keys(mirror.views, ids, expected)
            await mirror.close()
            await fresh.close()
            if missing:
                raise RuntimeError(f"W2: {missing} keys missing or stale at the fresh client")
            return {
                "seconds": elapsed,
                "rate": W2_EDITS / elapsed,
                "bytes": after["bytes_out"] - before["bytes_out"],
            }

        return await repeat("W2", sizes, run)
    finally:
        await server.kill()
