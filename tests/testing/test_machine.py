"""The exported state machine runs with every fault, and subclasses add models and rules."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import rule

from mycelia import Model, Transaction
from mycelia.testing import Faults, SimConfig, SimulationMachine
from mycelia.testing.samples import SimLink, SimNote


class EveryFault(SimulationMachine):
    config = SimConfig(
        durable=2,
        ephemeral=2,
        operations=0,
        models=(SimNote, SimLink),
        faults=Faults.all(),
    )


EveryFault.TestCase.settings = settings(max_examples=15, stateful_step_count=25, deadline=None)
TestEveryFault = EveryFault.TestCase


class Counter(Model, collection="counters"):
    label: str
    hits: int = 0


class CounterMachine(SimulationMachine):
    """A user's machine: its own model and a rule that reads before it writes."""

    config = SimConfig(durable=1, ephemeral=2, operations=0, models=(Counter,))

    @rule(node=st.integers(0, 2))
    def hit_everything(self, node: int) -> None:
        held = self.sim.nodes[node].alive("counters")

        async def body(trx: Transaction) -> bool:
            for counter_id in held:
                counter = await trx.edit(Counter, counter_id)
                counter.hits = counter.hits + 1 if counter.hits < 2**62 else 0  # stays int64
            return bool(held)

        self.transact(node, body, label="hit_everything")


CounterMachine.TestCase.settings = settings(max_examples=10, stateful_step_count=20, deadline=None)
TestCounterMachine = CounterMachine.TestCase
