"""A kit that cannot fail is worthless: with a bug planted, it must fail.

``broken_lww()`` makes LWW keep the last applied write instead of the largest
(generation, event id). The simulator must report a divergence for some seed, print a
minimal plan, and rerunning that seed (or that plan) must fail the same way; without the
planted bug the same seed passes. ``dropped_deltas()`` makes clients lose some updates
their server sends: the simulator, which runs the real client and server code, must
catch that too.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings

from mycelia.testing import (
    Divergence,
    Faults,
    SimConfig,
    SimulationFailure,
    SimulationMachine,
    broken_lww,
    dropped_deltas,
    replay,
    run_seed,
)
from mycelia.testing.samples import SimNote

CONFIG = SimConfig(durable=2, ephemeral=1, operations=60, watch=False)


def _first_failing_seed(limit: int = 30) -> SimulationFailure:
    for seed in range(limit):
        try:
            run_seed(seed, CONFIG, shrink_runs=80)
        except SimulationFailure as failure:
            return failure
    pytest.fail(f"the planted bug went unnoticed for {limit} seeds")


def test_a_broken_merge_rule_is_reported_as_a_divergence_with_a_reproducible_seed() -> None:
    with broken_lww():
        failure = _first_failing_seed()
        assert isinstance(failure.error, Divergence), failure
        # Rerunning the seed fails the same way, and so does the printed minimal plan.
        with pytest.raises(SimulationFailure) as again:
            run_seed(failure.seed, CONFIG, shrink_runs=0)
        assert type(again.value.error) is type(failure.error)
        with pytest.raises(Divergence) as replayed:
            replay(failure.seed, CONFIG, failure.actions)
        assert str(replayed.value) == str(failure.error)
    # Without the planted bug, the very same plan converges.
    replay(failure.seed, CONFIG, failure.actions)
    run_seed(failure.seed, CONFIG)


CLIENTS = SimConfig(durable=1, ephemeral=2, operations=60, faults=Faults.none(), watch=True)


def test_a_client_that_drops_updates_is_caught_with_a_reproducible_seed() -> None:
    with dropped_deltas(every=4):
        failure = None
        for seed in range(20):
            try:
                run_seed(seed, CLIENTS, shrink_runs=0)
            except SimulationFailure as found:
                failure = found
                break
        assert failure is not None, "a client losing every 4th update went unnoticed"
        with pytest.raises(SimulationFailure) as again:
            run_seed(failure.seed, CLIENTS, shrink_runs=0)
        assert str(again.value.error) == str(failure.error)  # the same failure, byte for byte
    run_seed(failure.seed, CLIENTS)  # without the planted bug, the seed converges


def test_the_failure_message_is_a_runnable_minimal_reproduction() -> None:
    with broken_lww():
        failure = _first_failing_seed()
        message = str(failure)
        assert f"seed {failure.seed} fails with Divergence" in message
        assert "replay(" in message
        assert len(failure.actions) < CONFIG.operations // 4, "the plan was not shrunk"
        snippet = "\n".join(
            line.removeprefix("    ") for line in message.splitlines() if line.startswith("    ")
        )
        with pytest.raises(Divergence):
            exec(snippet, {})


class ConflictMachine(SimulationMachine):
    """One model and a reordering network: concurrent writes to one field are common."""

    config = SimConfig(
        durable=2,
        ephemeral=1,
        operations=0,
        models=(SimNote,),
        faults=Faults(max_delay=6, duplicate=0.1),
        watch=False,
    )


ConflictMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,  # the same examples every run: the test cannot flake
    database=None,
    phases=(Phase.generate,),  # finding it is the point here; shrinking takes minutes
    suppress_health_check=list(HealthCheck),
)


class HealthyConflicts(ConflictMachine):
    """The same machine, fewer examples: without the planted bug it passes."""


HealthyConflicts.TestCase.settings = settings(
    ConflictMachine.TestCase.settings, max_examples=10, stateful_step_count=20
)


def test_the_state_machine_also_finds_the_planted_bug() -> None:
    with broken_lww(), pytest.raises(Divergence):
        ConflictMachine.TestCase("runTest").runTest()
    HealthyConflicts.TestCase("runTest").runTest()
