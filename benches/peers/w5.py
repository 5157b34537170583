"""W5, the automerge-paper trace, one op per transaction, until B's text is its end.

A replays the trace's first ``--w5-trace-ops`` ops on a new Text field (delete, then
insert), ``wait="local"``, yielding after each op; the clock stops when B's live query
shows the trace's end text, and A's own text must equal it too. Each run also replays the
trace 100 ops per transaction (Mycelia only: the peer has no such case).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from benches.peers.harness import (
    TRACE,
    Doc,
    Figures,
    Mirror,
    Server,
    Sizes,
    client,
    confirm_all,
    repeat,
    within,
)
from mycelia import Node


async def replay(a: Node, b: Node, trace: Any, per: int) -> tuple[float, float]:
    """A replays ``trace`` on a new Doc, ``per`` ops per transaction (``wait="local"``),
    yielding after each; (seconds at A, seconds until B's live query shows the end text)."""
    async with a.context().transaction() as trx:
        doc = trx.create(Doc, body="").id
    a_live = await Mirror.open(a, Doc)
    await a_live.wait_members(1)
    done = asyncio.get_running_loop().create_future()
    end, end_len = trace.end, len(trace.end)

    def check(view: Any) -> None:
        body = view.body
        if view.id == doc and len(body) == end_len and not done.done() and str(body) == end:
            done.set_result(time.perf_counter())

    b_live = await Mirror.open(b, Doc, check)
    await b_live.wait_members(1)
    ctx, pending = a.context(), []
    t0 = time.perf_counter()
    for first in range(0, len(trace.ops), per):
        trx = ctx.transaction(wait="local")
        async with trx:
            body = (await trx.edit(Doc, doc)).body
            for pos, ndel, ins in trace.ops[first : first + per]:  # delete, then insert
                if ndel:
                    body.delete(pos, ndel)
                if ins:
                    body.insert(pos, ins)
        pending.append(trx)
        await asyncio.sleep(0)  # live typing: let the commits stream as we go
    local_s = time.perf_counter() - t0
    conv_s = await within(done, "W5 remote convergence") - t0
    errors = await confirm_all(pending)
    if errors:
        raise RuntimeError(f"W5: {len(errors)} commits failed, first: {errors[0]!r}")
    if str(a_live.views[doc].body) != end:
        raise RuntimeError("W5: A's text differs from the trace's end text")
    await a_live.close()
    await b_live.close()
    return local_s, conv_s


async def w5(peer: ModuleType, sizes: Sizes, workdir: Path) -> dict[str, list[float]]:
    trace = peer.load_automerge_trace(TRACE, sizes.w5_trace_ops)
    print(f"  mycelia W5: {trace.name}", flush=True)

    async def run(i: int) -> Figures:
        server = await Server.start(workdir / f"w5-{i}")
        a, b = await client(server.url), await client(server.url)
        try:
            wire0, cpu0 = await server.wire(), (server.cpu(peer), peer.cpu_seconds())
            local_s, conv_s = await replay(a, b, trace, 1)  # one op, one transaction
            server_cpu, client_cpu = server.cpu(peer) - cpu0[0], peer.cpu_seconds() - cpu0[1]
            wire1 = await server.wire()
            _, batched_s = await replay(a, b, trace, 100)  # the second case
        finally:
            await a.close()
            await b.close()
            await server.kill()
        n = len(trace.ops)
        return {
            "local_rate": n / local_s,
            "conv_s": conv_s,
            "conv_rate": n / conv_s,
            "msgs_in": wire1["frames_in"] - wire0["frames_in"],
            "msgs_out": wire1["frames_out"] - wire0["frames_out"],
            "server_cpu_pct": 100 * server_cpu / conv_s,
            "client_cpu_pct": 100 * client_cpu / conv_s,
            "batched_rate": n / batched_s,
        }

    return await repeat("W5", sizes, run)
