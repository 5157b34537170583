"""Peers' commits combined: those that arrive while a write is in flight go together in the
next staging run, one storage write for all of them (group commit across connections).

A staging run holds its entities' locks until its write is durable (ARCHITECTURE.md §5), so
commits of many peers to one entity used to queue behind each other's fsync, one
transaction each: two hundred clients editing one entity paid a transaction and an fsync
per commit. Now the commits that queue while one run writes are planned one after
another in the next run, each against the entity as the one before left it, and written
in one transaction.

Invariants:

- **A lone commit waits for nothing.** When no run of this combiner is in flight, a
  submission runs at once, in its caller's coroutine, as it did before combining.
- **Submissions that arrive meanwhile go together**, in arrival order, in the next run,
  up to :data:`COMBINED_EVENTS` events (a submission larger than that goes alone). That
  run is a task of its own: a caller that stops waiting (its peer went away) takes no
  other peer's commits with it. A submission whose caller stopped waiting before its run
  began is dropped.
- **One peer's refusal is never another's.** A submission is one peer's commits, all or
  nothing, each checked with that peer's credentials. A combined run that fails wrote
  nothing. If a commit of it was refused, its submission gets that verdict (reached
  against the entities as the submissions before it left them, as if run after them);
  those before it are written together, and those after it go together next. So a peer
  whose commits are always refused costs the others one planning each time, never a
  write of their own. Any other failure (the write itself) commits each submission
  alone, concurrently, so each gets its own verdict.
- **Nothing is acknowledged before it is durable**: each caller resumes after the run that
  holds its commits wrote them.
- **Listeners hear of each submission apart**, as if it had been written alone (the
  reactor's change sets, the pushes to subscribers, the metrics' commit count).
- **Closing ends the waiting**: a run in a task of its own that is cancelled (the node
  closes its tasks) cancels its own submissions and every one still waiting, and starts
  no other run.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Final

from mycelia.entity import EventCheck, IngestResult, Refused
from mycelia.errors import MyceliaError
from mycelia.proto import Event

__all__ = ["COMBINED_EVENTS", "CommitCombiner"]

COMBINED_EVENTS: Final = 64
"""At most this many events go in one combined run. Its changes reach every subscriber at
once, so this bounds the burst the subscriber feeds take: W3 (200 clients, each
subscribed to all) with 4,096 left the server at 95–134 MiB after converging, with 64 at
74–78 (as without combining), in the same time; 64 commits still share one fsync."""

CommitMany = Callable[
    [list[list[Event]], Sequence[EventCheck | None], Sequence[int]], Awaitable[IngestResult]
]
"""Commit commits in one run, each checked by its own check, listeners told of each part
(a count of commits: one peer's) apart; writes nothing if it raises: a commit's own
refusal as :class:`~mycelia.entity.Refused` if parts were given, else as it came
(:meth:`mycelia.entity.Applier.commit_many`)."""


@dataclass(slots=True)
class _Submission:
    """One caller's commits (one peer's, in order) and where its outcome goes."""

    commits: list[list[Event]]
    check: EventCheck
    outcome: asyncio.Future[IngestResult]
    events: int


class CommitCombiner:
    """Commits peers' commits, combining those that arrive while a run writes (see the
    module docstring). ``spawn`` runs a task the node keeps."""

    __slots__ = ("_busy", "_commit_many", "_spawn", "_waiting")

    def __init__(
        self,
        commit_many: CommitMany,
        spawn: Callable[[Coroutine[object, object, None]], None],
    ) -> None:
        self._commit_many = commit_many
        self._spawn = spawn
        self._waiting: deque[_Submission] = deque()
        self._busy = False
        """Whether a run of this combiner is in flight (its callers' or a task's)."""

    async def commit(self, commits: list[list[Event]], check: EventCheck) -> IngestResult:
        """Commit one peer's ``commits`` in order, each all-or-nothing and checked by
        ``check``; raises the first refusal (none of them is written then). The result may
        hold other peers' commits of the same run."""
        if not self._busy:
            self._busy = True
            try:
                return await self._commit_many(commits, [check] * len(commits), ())
            finally:
                self._next()
        outcome: asyncio.Future[IngestResult] = asyncio.get_running_loop().create_future()
        events = sum(len(c) for c in commits)
        self._waiting.append(_Submission(commits, check, outcome, events))
        return await outcome

    def _next(self) -> None:
        """After a run: start the next with what waits, or stand idle."""
        taken: list[_Submission] = []
        events = 0
        waiting = self._waiting
        while waiting and (not taken or events + waiting[0].events <= COMBINED_EVENTS):
            submission = waiting.popleft()
            if not submission.outcome.done():  # (its caller stopped waiting: dropped)
                taken.append(submission)
                events += submission.events
        if taken:
            self._spawn(self._run(taken))
        else:
            self._busy = False

    async def _run(self, taken: list[_Submission]) -> None:
        try:
            await self._combined(taken)
        except asyncio.CancelledError as exc:
            for submission in (*taken, *self._waiting):
                _fail(submission.outcome, exc)
            self._waiting.clear()
            self._busy = False
            raise
        except BaseException as exc:
            for submission in taken:
                _fail(submission.outcome, exc)
            self._next()
            raise
        self._next()

    async def _combined(self, taken: list[_Submission]) -> None:
        """Commit ``taken`` in one run; if a commit of it is refused, refuse its submission
        and commit those before it and those after it, each group in one run; if the run
        fails otherwise, each alone."""
        while len(taken) > 1:
            commits = [c for s in taken for c in s.commits]
            checks = [s.check for s in taken for _ in s.commits]
            parts = [len(s.commits) for s in taken]
            try:
                result = await self._commit_many(commits, checks, parts)
            except Refused as refused:
                culprit = bisect.bisect_right(list(itertools.accumulate(parts)), refused.index)
                _fail(taken[culprit].outcome, refused.error)
                await self._combined(taken[:culprit])  # (they passed: one run, once more)
                taken = taken[culprit + 1 :]
            except MyceliaError:  # not one commit's: each alone gets its own verdict
                await asyncio.gather(*(self._alone(s) for s in taken))
                return
            else:
                for submission in taken:
                    _settle(submission.outcome, result)
                return
        if taken:
            await self._alone(taken[0])

    async def _alone(self, submission: _Submission) -> None:
        checks = [submission.check] * len(submission.commits)
        try:
            result = await self._commit_many(submission.commits, checks, ())
        except MyceliaError as exc:
            _fail(submission.outcome, exc)
        else:
            _settle(submission.outcome, result)


def _settle(outcome: asyncio.Future[IngestResult], result: IngestResult) -> None:
    if not outcome.done():
        outcome.set_result(result)


def _fail(outcome: asyncio.Future[IngestResult], exc: BaseException) -> None:
    if outcome.done():
        return
    if isinstance(exc, asyncio.CancelledError):
        outcome.cancel()
    else:
        outcome.set_exception(exc)
