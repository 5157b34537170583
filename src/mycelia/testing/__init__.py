"""``mycelia.testing``: prove that replicas converge (ARCHITECTURE.md §12, use 4).

Needs hypothesis (a dev dependency). The kit, from the smallest piece to the largest:

- :mod:`~mycelia.testing.strategies` — hypothesis strategies for protocol values, for your
  models (:func:`~mycelia.testing.strategies.model_values`, edit scripts) and for whole
  concurrent histories and DAG shapes;
- :mod:`~mycelia.testing.invariants` — checkers you can call on any nodes: convergence, no
  acknowledged commit lost, antichain heads, no dangling references, system membership,
  live queries equal to fresh fetches; each raises an :class:`InvariantViolation`;
- :mod:`~mycelia.testing.simulator` — a deterministic simulator: real nodes on virtual
  time (:func:`run_virtual`), clients speaking the real peering protocol to durable nodes
  over faulty streams, durable nodes gossiping over a faulty network (resets, drops,
  duplication, reordering, delay, corruption, partitions, crashes, failing writes,
  intrusions); :func:`run_seed` runs a seed and, on failure, shrinks it and prints a
  replayable plan;
- :class:`SimulationMachine` — a hypothesis state machine over the simulator, to subclass
  with your own models and rules;
- :func:`broken_lww` and :func:`dropped_deltas` — planted bugs (a merge rule, a lost
  update on a client), to check that your tests can fail.

The guide is ``docs/testing-guide.md``.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mycelia.testing.actions import (
        Action,
        Contend,
        Crash,
        Create,
        Delete,
        Edit,
        FailWrite,
        Intrude,
        Partition,
        Wait,
    )
    from mycelia.testing.faults import FaultyStorage, broken_lww, dropped_deltas
    from mycelia.testing.fields import (
        EditStep,
        FieldKind,
        SetField,
        TextDelete,
        TextInsert,
        apply_edit,
        field_kinds,
    )
    from mycelia.testing.histories import History
    from mycelia.testing.invariants import (
        DanglingReference,
        Divergence,
        ForeignEntity,
        HeadNotAntichain,
        InvariantViolation,
        LiveQueryMismatch,
        LostCommit,
        MemoryAhead,
        Unconverged,
        UnexpectedError,
        WatchedQuery,
        check_convergence,
        check_heads_are_antichains,
        check_no_dangling_references,
        check_no_lost_commits,
        check_system_membership,
    )
    from mycelia.testing.machine import SimulationMachine
    from mycelia.testing.network import Faults
    from mycelia.testing.scenario import (
        SeedsReport,
        SimResult,
        SimulationFailure,
        plan_for,
        replay,
        run_seed,
        run_seeds,
        shrink,
        simulate,
    )
    from mycelia.testing.simulator import SimConfig, Simulation
    from mycelia.testing.vloop import Deadlock, VirtualTimeLoop, run_virtual

_LAZY = {
    "Action": "mycelia.testing.actions",
    "Contend": "mycelia.testing.actions",
    "Crash": "mycelia.testing.actions",
    "Create": "mycelia.testing.actions",
    "Delete": "mycelia.testing.actions",
    "Edit": "mycelia.testing.actions",
    "FailWrite": "mycelia.testing.actions",
    "Intrude": "mycelia.testing.actions",
    "Partition": "mycelia.testing.actions",
    "Wait": "mycelia.testing.actions",
    "FaultyStorage": "mycelia.testing.faults",
    "broken_lww": "mycelia.testing.faults",
    "dropped_deltas": "mycelia.testing.faults",
    "EditStep": "mycelia.testing.fields",
    "FieldKind": "mycelia.testing.fields",
    "SetField": "mycelia.testing.fields",
    "TextDelete": "mycelia.testing.fields",
    "TextInsert": "mycelia.testing.fields",
    "apply_edit": "mycelia.testing.fields",
    "field_kinds": "mycelia.testing.fields",
    "History": "mycelia.testing.histories",
    "DanglingReference": "mycelia.testing.invariants",
    "Divergence": "mycelia.testing.invariants",
    "ForeignEntity": "mycelia.testing.invariants",
    "HeadNotAntichain": "mycelia.testing.invariants",
    "InvariantViolation": "mycelia.testing.invariants",
    "LiveQueryMismatch": "mycelia.testing.invariants",
    "LostCommit": "mycelia.testing.invariants",
    "MemoryAhead": "mycelia.testing.invariants",
    "Unconverged": "mycelia.testing.invariants",
    "UnexpectedError": "mycelia.testing.invariants",
    "WatchedQuery": "mycelia.testing.invariants",
    "check_convergence": "mycelia.testing.invariants",
    "check_heads_are_antichains": "mycelia.testing.invariants",
    "check_no_dangling_references": "mycelia.testing.invariants",
    "check_no_lost_commits": "mycelia.testing.invariants",
    "check_system_membership": "mycelia.testing.invariants",
    "SimulationMachine": "mycelia.testing.machine",
    "Faults": "mycelia.testing.network",
    "SeedsReport": "mycelia.testing.scenario",
    "SimResult": "mycelia.testing.scenario",
    "SimulationFailure": "mycelia.testing.scenario",
    "plan_for": "mycelia.testing.scenario",
    "replay": "mycelia.testing.scenario",
    "run_seed": "mycelia.testing.scenario",
    "run_seeds": "mycelia.testing.scenario",
    "shrink": "mycelia.testing.scenario",
    "simulate": "mycelia.testing.scenario",
    "SimConfig": "mycelia.testing.simulator",
    "Deadlock": "mycelia.testing.vloop",
    "VirtualTimeLoop": "mycelia.testing.vloop",
    "run_virtual": "mycelia.testing.vloop",
    "Simulation": "mycelia.testing.simulator",
}
"""Where each public name lives: modules load on first use, so importing one helper
(``mycelia.testing.dags``) does not import the whole kit."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mycelia.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "Action",
    "Contend",
    "Crash",
    "Create",
    "DanglingReference",
    "Deadlock",
    "Delete",
    "Divergence",
    "Edit",
    "EditStep",
    "FailWrite",
    "Faults",
    "FaultyStorage",
    "FieldKind",
    "ForeignEntity",
    "HeadNotAntichain",
    "History",
    "Intrude",
    "InvariantViolation",
    "LiveQueryMismatch",
    "LostCommit",
    "MemoryAhead",
    "Partition",
    "SeedsReport",
    "SetField",
    "SimConfig",
    "SimResult",
    "Simulation",
    "SimulationFailure",
    "SimulationMachine",
    "TextDelete",
    "TextInsert",
    "Unconverged",
    "UnexpectedError",
    "VirtualTimeLoop",
    "Wait",
    "WatchedQuery",
    "apply_edit",
    "broken_lww",
    "check_convergence",
    "check_heads_are_antichains",
    "check_no_dangling_references",
    "check_no_lost_commits",
    "check_system_membership",
    "dropped_deltas",
    "field_kinds",
    "plan_for",
    "replay",
    "run_seed",
    "run_seeds",
    "run_virtual",
    "shrink",
    "simulate",
]
