"""Waiting for conditions without sleeping: re-check on every change a node commits."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from mycelia import Node


async def until(node: Node, check: Callable[[], Awaitable[bool]], *, timeout: float = 10) -> None:
    """Wait until ``check()`` holds, re-checking after each commit on ``node``."""
    changed = asyncio.Event()
    remove = node.on_change(lambda _: changed.set())
    try:
        async with asyncio.timeout(timeout):
            while not await check():
                await changed.wait()
                changed.clear()
    finally:
        remove()
