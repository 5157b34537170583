"""What a simulation does: actions, and the seeded plan that lists them.

An action is a frozen value naming nodes and entities by index, never by id, so any
sub-list of a plan is still a valid plan (what shrinking needs): an edit picks the
``pick``-th live entity of its model that the node holds (sorted by id, modulo how many
there are) and is skipped if there is none; an action on a node that is down is skipped.

:func:`plan` draws a plan from a seed (a string-seeded :class:`random.Random`, so the plan
does not depend on the process's hash seed). :func:`script` prints actions as Python
source that rebuilds them exactly (floats, bytes and text included).
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass

from mycelia.entity.model import Model
from mycelia.testing.fields import EditStep, random_edit, random_values
from mycelia.testing.network import Faults

__all__ = [
    "Action",
    "Contend",
    "Crash",
    "Create",
    "Delete",
    "Edit",
    "FailWrite",
    "Intrude",
    "Partition",
    "Wait",
    "literal",
    "plan",
    "script",
]


@dataclass(frozen=True, slots=True)
class Create:
    """Node ``node`` creates an entity of model ``model`` with ``values``."""

    node: int
    model: int
    values: tuple[tuple[str, object], ...]


@dataclass(frozen=True, slots=True)
class Edit:
    """Node ``node`` edits the ``pick``-th live entity of ``model`` it holds."""

    node: int
    model: int
    pick: int
    steps: tuple[EditStep, ...]


@dataclass(frozen=True, slots=True)
class Delete:
    """Node ``node`` deletes the ``pick``-th live entity of ``model`` it holds."""

    node: int
    model: int
    pick: int


@dataclass(frozen=True, slots=True)
class Wait:
    """Let ``ticks`` ticks pass (messages are delivered, gossip runs)."""

    ticks: int


@dataclass(frozen=True, slots=True)
class Crash:
    """Node ``node`` stops; it restarts ``down`` ticks later.

    A durable node keeps its storage. An ephemeral node keeps it too unless
    ``lose_cache``: then it restarts empty and rejoins the system.
    """

    node: int
    down: int
    lose_cache: bool


@dataclass(frozen=True, slots=True)
class Partition:
    """Cut the nodes in ``side`` off from the others for ``ticks`` ticks."""

    side: tuple[int, ...]
    ticks: int


@dataclass(frozen=True, slots=True)
class FailWrite:
    """Node ``node``'s next storage write fails; with ``crash``, the node then crashes."""

    node: int
    crash: bool


@dataclass(frozen=True, slots=True)
class Intrude:
    """Replay another system's events to node ``node`` (it must refuse them)."""

    node: int


@dataclass(frozen=True, slots=True)
class Contend:
    """Node ``node`` reads the ``pick``-th entity it holds to set its first numeric field
    below zero; before it commits, node ``rival`` sets that field to 1 twice (two
    generations on: the rival's write wins the merge). A client watching only the field's
    negative range (``SimConfig(narrow=True)``) shows its own write until its server says
    the merge moved the row out."""

    node: int
    rival: int
    model: int
    pick: int


Action = Create | Edit | Delete | Wait | Crash | Partition | FailWrite | Intrude | Contend

_KINDS = (
    "create",
    "edit",
    "delete",
    "wait",
    "crash",
    "partition",
    "fail_write",
    "intrude",
    "contend",  # (last, and weighed 0 unless asked for: the other plans stay as they were)
)


def plan(
    seed: int,
    *,
    nodes: int,
    models: tuple[type[Model], ...],
    operations: int,
    faults: Faults,
    contend: float = 0.0,
) -> list[Action]:
    """``operations`` actions drawn from ``seed`` (see the module docstring); ``contend``
    weighs :class:`Contend` (0: none, and the plan is what it was before that action)."""
    rng = random.Random(f"mycelia-sim/plan/{seed}")
    weights = [0.15, 0.55, 0.02, 0.08, faults.crash, faults.partition]
    weights += [faults.write_failure, faults.foreign, contend]
    actions: list[Action] = []
    for i in range(operations):
        kind = "create" if i == 0 else rng.choices(_KINDS, weights)[0]
        actions.append(_draw(kind, rng, nodes, models))
    return actions


def _draw(kind: str, rng: random.Random, nodes: int, models: tuple[type[Model], ...]) -> Action:
    node = rng.randrange(nodes)
    which = rng.randrange(len(models))
    model = models[which]
    # Small picks are likely, so a few entities get most edits: concurrent writes collide.
    pick = min(int(rng.expovariate(0.4)), 40)
    if kind == "create":
        return Create(node, which, tuple(sorted(random_values(model, rng).items())))
    if kind == "edit":
        steps = tuple(random_edit(model, rng) for _ in range(rng.randint(1, 3)))
        return Edit(node, which, pick, steps)
    if kind == "delete":
        return Delete(node, which, pick)
    if kind == "wait":
        return Wait(rng.randint(1, 8))
    if kind == "crash":
        return Crash(node, rng.randint(1, 30), rng.random() < 0.5)
    if kind == "partition":
        side = tuple(sorted(rng.sample(range(nodes), rng.randint(1, max(1, nodes - 1)))))
        return Partition(side, rng.randint(2, 40))
    if kind == "fail_write":
        return FailWrite(node, rng.random() < 0.5)
    if kind == "contend":
        return Contend(node, rng.randrange(nodes), which, pick)
    return Intrude(node)


def literal(value: object) -> str:
    """Python source for ``value`` (actions, edit steps, and the values they carry)."""
    if isinstance(value, float):
        if math.isinf(value):
            return "float('inf')" if value > 0 else "float('-inf')"
        return repr(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ", ".join(
            f"{f.name}={literal(getattr(value, f.name))}" for f in dataclasses.fields(value)
        )
        return f"{type(value).__name__}({fields})"
    if isinstance(value, tuple):
        inner = ", ".join(literal(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, bytes):
        return repr(bytes(value))
    return repr(value)


def script(actions: list[Action]) -> str:
    """The actions as a Python list literal, one per line."""
    body = "".join(f"    {literal(a)},\n" for a in actions)
    return "[\n" + body + "]"
