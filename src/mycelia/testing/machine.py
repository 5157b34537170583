"""A hypothesis state machine over the simulator, to subclass with your own models and rules.

::

    from hypothesis import strategies as st
    from hypothesis.stateful import rule
    from mycelia.testing import SimConfig, SimulationMachine

    class AlbumMachine(SimulationMachine):
        config = SimConfig(durable=2, ephemeral=1, models=(Album,))

        @rule(node=st.integers(0, 2), year=st.integers(1900, 2030))
        def release(self, node: int, year: int) -> None:
            async def body(trx: Transaction) -> bool:
                trx.create(Album, name="x", artist="y", year=year)
                return True
            self.transact(node, body)

    TestAlbums = AlbumMachine.TestCase

Hypothesis draws the rules (creates, edits, deletes with values from
:func:`~mycelia.testing.strategies.model_values` and
:func:`~mycelia.testing.strategies.edit_scripts`; the passage of time; crashes, partitions,
failing writes and intrusions when ``config.faults`` weighs them above zero) and shrinks a
failure to a minimal sequence of steps.

Invariants: after every step, replicas that hold the same events agree, heads are
antichains, durable nodes hold no dangling references; at teardown the simulation heals
and quiesces and every invariant of :mod:`mycelia.testing.invariants` must hold.

Each example runs on its own virtual-time event loop (``asyncio.Runner`` of a
:class:`~mycelia.testing.vloop.VirtualTimeLoop`), so run machines from plain
(synchronous) tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ClassVar, TypeVar

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mycelia.node import Transaction
from mycelia.testing.actions import (
    Action,
    Crash,
    Create,
    Delete,
    Edit,
    FailWrite,
    Intrude,
    Partition,
    Wait,
    literal,
)
from mycelia.testing.invariants import (
    check_convergence,
    check_heads_are_antichains,
    check_no_dangling_references,
)
from mycelia.testing.simulator import SimConfig, Simulation
from mycelia.testing.strategies import edit_scripts, model_values
from mycelia.testing.vloop import VirtualTimeLoop

__all__ = ["SimulationMachine"]

T = TypeVar("T")

_NODE = st.integers(0, 63)
"""Node indices are drawn wide and taken modulo the node count (configs vary)."""


class SimulationMachine(RuleBasedStateMachine):
    """Drives a :class:`~mycelia.testing.simulator.Simulation`; see the module docstring."""

    config: ClassVar[SimConfig] = SimConfig(durable=2, ephemeral=1, operations=0)
    """The simulated system (``operations`` is ignored: hypothesis picks the steps)."""
    seed: ClassVar[int] = 0
    """Seeds node entropy and the network's fault draws."""

    def __init__(self) -> None:
        super().__init__()
        self._runner = asyncio.Runner(loop_factory=VirtualTimeLoop)
        self.actions: list[Action] = []
        self.sim = self.run(Simulation.open(self.config, self.seed))

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on this example's event loop."""
        return self._runner.run(coro)

    def perform(self, action: Action) -> None:
        """Perform a simulator action (noted, so a failing example shows it)."""
        note(literal(action))
        self.actions.append(action)
        self.run(self.sim.perform(action))

    def transact(
        self, node: int, body: Callable[[Transaction], Awaitable[bool]], *, label: str = "rule"
    ) -> bool:
        """Run ``body`` in a transaction on node ``node`` (modulo the node count), then
        acknowledge and push its events; one tick passes. See ``Simulation.transact``."""
        done = self.run(self.sim.transact(node % self.config.nodes, body, label=label))
        self.run(self.sim.advance(1))
        return done

    def teardown(self) -> None:
        """Heal, quiesce and check every invariant (then close the event loop)."""
        try:
            self.run(self.sim.quiesce())
            self.run(self.sim.check())
        finally:
            self._runner.close()

    def _node(self, node: int) -> int:
        return node % self.config.nodes

    def _model(self, model: int) -> int:
        return model % len(self.config.models)

    # -- rules -------------------------------------------------------------------------

    @rule(node=_NODE, model=st.integers(0, 63), data=st.data())
    def create(self, node: int, model: int, data: st.DataObject) -> None:
        """A node creates an entity with drawn values."""
        which = self._model(model)
        values = data.draw(model_values(self.config.models[which]))
        self.perform(Create(self._node(node), which, tuple(sorted(values.items()))))

    @rule(node=_NODE, model=st.integers(0, 63), pick=st.integers(0, 7), data=st.data())
    def edit(self, node: int, model: int, pick: int, data: st.DataObject) -> None:
        """A node edits one of its entities with a drawn edit script."""
        which = self._model(model)
        steps = data.draw(edit_scripts(self.config.models[which], max_size=3))
        self.perform(Edit(self._node(node), which, pick, steps))

    @rule(node=_NODE, model=st.integers(0, 63), pick=st.integers(0, 7))
    def delete(self, node: int, model: int, pick: int) -> None:
        """A node deletes one of its entities."""
        self.perform(Delete(self._node(node), self._model(model), pick))

    @rule(ticks=st.integers(1, 8))
    def wait(self, ticks: int) -> None:
        """Time passes: messages are delivered, nodes gossip."""
        self.perform(Wait(ticks))

    @precondition(lambda self: self.config.faults.crash > 0)
    @rule(node=_NODE, down=st.integers(1, 30), lose_cache=st.booleans())
    def crash(self, *, node: int, down: int, lose_cache: bool) -> None:
        """A node crashes and restarts later (an ephemeral one maybe without its cache)."""
        self.perform(Crash(self._node(node), down, lose_cache))

    @precondition(lambda self: self.config.faults.partition > 0)
    @rule(side=st.sets(_NODE, min_size=1, max_size=3), ticks=st.integers(2, 40))
    def partition(self, side: set[int], ticks: int) -> None:
        """Some nodes are cut off for a while."""
        self.perform(Partition(tuple(sorted({self._node(n) for n in side})), ticks))

    @precondition(lambda self: self.config.faults.write_failure > 0)
    @rule(node=_NODE, crash=st.booleans())
    def fail_write(self, *, node: int, crash: bool) -> None:
        """A node's next storage write fails (and it may crash right after)."""
        self.perform(FailWrite(self._node(node), crash))

    @precondition(lambda self: self.config.faults.foreign > 0)
    @rule(node=_NODE)
    def intrude(self, node: int) -> None:
        """Another system's events are replayed to a node."""
        self.perform(Intrude(self._node(node)))

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def replicas_agree(self) -> None:
        """Same events → same state; heads are antichains; no dangling references."""
        nodes = {sn.name: sn.node for sn in self.sim.nodes if sn.node is not None}
        self.run(check_convergence(nodes))
        self.run(check_heads_are_antichains(nodes))
        self.run(check_no_dangling_references(nodes))
