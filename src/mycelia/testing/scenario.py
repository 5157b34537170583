"""Running seeds: plan, simulate, heal, check — and, on failure, shrink and print a repro.

::

    from mycelia.testing import SimConfig, run_seed

    result = run_seed(17, SimConfig(durable=3, ephemeral=2, operations=200))
    result.digest        # the trace hash: the same seed gives the same one, byte for byte

A failing seed raises :class:`SimulationFailure` (an AssertionError): it carries the
seed, the config and the **shrunk** action list, and its message is a Python snippet that
replays the failure with :func:`replay`. Shrinking removes chunks of actions, then single
actions, then edit steps, keeping a candidate only if it still fails with the same kind
of error (a simple delta debugging). The network draws its fates from the seed as the run
goes, so a shorter plan may draw differently; that is why every candidate is rerun.

Invariant: a run is a pure function of (seed, config, actions): :func:`replay` of a printed
plan reproduces the failure, byte for byte.

:func:`run_seeds` runs every seed, optionally in worker processes, and reports every
failure (not just the first).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from mycelia.testing.actions import Action, Edit, plan, script
from mycelia.testing.simulator import SimConfig, Simulation
from mycelia.testing.trace import Trace
from mycelia.testing.vloop import run_virtual

__all__ = [
    "SeedsReport",
    "SimResult",
    "SimulationFailure",
    "plan_for",
    "replay",
    "run_seed",
    "run_seeds",
    "shrink",
    "simulate",
]


@dataclass(frozen=True)
class SimResult:
    """What a passing run did."""

    seed: int
    digest: str
    """The trace's SHA-256 (hex)."""
    stats: dict[str, int]
    trace: Trace


class SimulationFailure(AssertionError):
    """A seed broke an invariant (or crashed a node); the message shows how to replay it."""

    def __init__(
        self, seed: int, config: SimConfig, actions: Sequence[Action], error: BaseException
    ) -> None:
        self.seed = seed
        self.config = config
        self.actions = list(actions)
        self.error = error
        super().__init__(self._message())

    def _message(self) -> str:
        modules = sorted({m.__module__ for m in self.config.models})
        lines = [
            *(f"import {module}" for module in modules),
            "from mycelia.testing import *",
            f"config = {self.config.describe()}",
            f"replay({self.seed}, config, {script(self.actions)})",
        ]
        snippet = "\n".join("    " + line for text in lines for line in text.splitlines())
        return (
            f"seed {self.seed} fails with {type(self.error).__name__}: {self.error}\n"
            f"minimal plan: {len(self.actions)} actions; replay it with:\n\n{snippet}\n"
        )


def plan_for(seed: int, config: SimConfig) -> list[Action]:
    """The actions ``seed`` draws under ``config``."""
    return plan(
        seed,
        nodes=config.nodes,
        models=config.models,
        operations=config.operations,
        faults=config.faults,
        contend=0.05 if config.narrow else 0.0,
    )


async def simulate(
    seed: int, config: SimConfig, actions: Sequence[Action], *, keep_trace: bool = False
) -> SimResult:
    """Run ``actions`` on a fresh simulation, heal, quiesce and check every invariant.

    Raises whatever the run or the checks raise (InvariantViolation subclasses for broken
    invariants).
    """
    sim = await Simulation.open(config, seed, trace=Trace(keep=keep_trace))
    for action in actions:
        await sim.perform(action)
    await sim.quiesce()
    await sim.check()
    return SimResult(seed, sim.trace.digest, sim.stats(), sim.trace)


def replay(
    seed: int, config: SimConfig, actions: Sequence[Action], *, keep_trace: bool = True
) -> SimResult:
    """Run exactly ``actions`` (from a failure's message) in a new event loop."""
    return run_virtual(simulate(seed, config, actions, keep_trace=keep_trace))


def run_seed(seed: int, config: SimConfig | None = None, *, shrink_runs: int = 200) -> SimResult:
    """Plan ``seed``, run it in a new event loop; on failure shrink and raise.

    Raises SimulationFailure with the minimal plan found in at most ``shrink_runs`` reruns
    (0: no shrinking).
    """
    config = config or SimConfig()
    actions = plan_for(seed, config)
    try:
        return run_virtual(simulate(seed, config, actions))
    except Exception as exc:
        minimal = shrink(seed, config, actions, type(exc), max_runs=shrink_runs)
        raise SimulationFailure(
            seed, config, minimal, _rerun_error(seed, config, minimal, exc)
        ) from exc


def _rerun_error(
    seed: int, config: SimConfig, actions: Sequence[Action], fallback: BaseException
) -> BaseException:
    try:
        run_virtual(simulate(seed, config, actions))
    except Exception as exc:  # noqa: BLE001 - the error the minimal plan gives
        return exc
    return fallback


def _fails(
    seed: int, config: SimConfig, kind: type[BaseException]
) -> Callable[[list[Action]], bool]:
    def still(actions: list[Action]) -> bool:
        try:
            run_virtual(simulate(seed, config, actions))
        except kind:
            return True
        except Exception:  # noqa: BLE001 - another failure is not the one being shrunk
            return False
        return False

    return still


def shrink(
    seed: int,
    config: SimConfig,
    actions: Sequence[Action],
    kind: type[BaseException],
    *,
    max_runs: int = 200,
) -> list[Action]:
    """A shorter plan that still fails with ``kind`` (at most ``max_runs`` reruns)."""
    fails = _fails(seed, config, kind)
    current = list(actions)
    budget = [max_runs]

    def attempt(candidate: list[Action]) -> bool:
        if budget[0] <= 0:
            return False
        budget[0] -= 1
        return fails(candidate)

    chunk = max(1, len(current) // 2)
    while chunk >= 1 and budget[0] > 0:
        i, removed = 0, False
        while i < len(current) and budget[0] > 0:
            candidate = current[:i] + current[i + chunk :]
            if candidate and attempt(candidate):
                current, removed = candidate, True
            else:
                i += chunk
        if not removed:
            chunk //= 2
    return _shrink_steps(current, attempt)


def _shrink_steps(actions: list[Action], attempt: Callable[[list[Action]], bool]) -> list[Action]:
    """Drop edit steps one at a time where the failure survives it."""
    for index, action in enumerate(actions):
        if not isinstance(action, Edit):
            continue
        steps = list(action.steps)
        j = 0
        while len(steps) > 1 and j < len(steps):
            fewer = steps[:j] + steps[j + 1 :]
            candidate = dataclasses.replace(action, steps=tuple(fewer))
            if attempt([*actions[:index], candidate, *actions[index + 1 :]]):
                steps = fewer
                actions = [*actions[:index], candidate, *actions[index + 1 :]]
            else:
                j += 1
    return actions


@dataclass(frozen=True)
class SeedsReport:
    """What :func:`run_seeds` found."""

    results: dict[int, str]
    """Seed → trace digest, for the seeds that passed."""
    failures: dict[int, str]
    """Seed → the failure's message (with its minimal plan)."""
    seconds: float
    operations: int
    """Actions performed by the seeds that passed."""

    def raise_first(self) -> None:
        """Raise AssertionError listing every failing seed (first message in full)."""
        if self.failures:
            first = min(self.failures)
            raise AssertionError(
                f"{len(self.failures)} seeds failed: {sorted(self.failures)}\n"
                + self.failures[first]
            )


def _one(seed: int, config: SimConfig, shrink_runs: int) -> tuple[int, str, bool]:
    try:
        result = run_seed(seed, config, shrink_runs=shrink_runs)
    except SimulationFailure as failure:
        return seed, str(failure), False
    return seed, result.digest, True


def run_seeds(
    seeds: Iterable[int],
    config: SimConfig | None = None,
    *,
    workers: int = 1,
    shrink_runs: int = 100,
) -> SeedsReport:
    """Run every seed (in ``workers`` processes when > 1) and report passes and failures.

    Worker processes are started with ``spawn``: they import the config's models by name
    (models must live in importable modules), and a script calling this must guard its
    entry point with ``if __name__ == "__main__":``.
    """
    config = config or SimConfig()
    seeds = list(seeds)
    start = time.perf_counter()
    if workers <= 1:
        outcomes = [_one(seed, config, shrink_runs) for seed in seeds]
    else:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            outcomes = list(
                pool.map(_one, seeds, [config] * len(seeds), [shrink_runs] * len(seeds))
            )
    seconds = time.perf_counter() - start
    passed = {s: text for s, text, ok in outcomes if ok}
    failed = {s: text for s, text, ok in outcomes if not ok}
    return SeedsReport(passed, failed, seconds, len(passed) * config.operations)
