"""Stopping a background task without losing the caller's own cancellation.

The usual idiom, ``task.cancel()`` then ``with suppress(CancelledError): await task``,
cannot tell the task's CancelledError (expected: we cancelled it) from the *caller's*
(someone cancelled the code that is stopping the task). It swallows both, and the caller
carries on as if it had not been cancelled: a ``node.close()`` cancelled by
``asyncio.run``'s shutdown, a ``TaskGroup`` or a ``wait_for`` timeout returned normally,
and a loop around it never ended. :func:`stop` waits without taking the task's outcome
as its own, so only the caller's cancellation can interrupt it.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["stop"]


async def stop(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` and wait until it has ended.

    Its cancellation is the expected end and raises nothing; an exception it ended with
    instead is raised here. If the caller is cancelled while it waits, the
    CancelledError propagates (the task has been asked to stop all the same).
    """
    task.cancel()
    await asyncio.wait({task})  # (raises only the caller's own cancellation)
    if not task.cancelled():
        task.result()
