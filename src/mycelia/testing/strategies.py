"""Hypothesis strategies for Mycelia values (public: use them in your own property tests).

Every strategy builds valid values through the public constructors, so what they draw is
what a correct peer could send (ARCHITECTURE.md §12):

- protocol values: :func:`event_ids`, :func:`entity_ids`, :func:`clocks`, :func:`events`...;
- a user's models: :func:`field_values`, :func:`model_values` (valid ``trx.create``
  arguments for any :class:`~mycelia.Model`), :func:`edit_steps` and :func:`edit_scripts`
  (apply them with :func:`~mycelia.testing.fields.apply_edit`);
- whole histories: :func:`histories` (several nodes' concurrent events for one entity) and
  :func:`dag_shapes` (forks, merges, long chains, diamonds).

Invariant: whatever these draw passes the model's own checks, so a test failing on drawn
input has found a bug, not a bad example.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from mycelia.entity.model import Model
from mycelia.proto.clock import Clock
from mycelia.proto.event import NONCE_LENGTH, Event, Operations, normalize_operations
from mycelia.proto.ids import EntityId, EventId
from mycelia.testing.dags import DagShape, dag_shapes
from mycelia.testing.fields import (
    EditStep,
    FieldKind,
    SetField,
    TextDelete,
    TextInsert,
    field_kinds,
)
from mycelia.testing.histories import History

__all__ = [
    "backend_names",
    "clocks",
    "collection_names",
    "dag_shapes",
    "edit_scripts",
    "edit_steps",
    "entity_ids",
    "event_ids",
    "events",
    "field_values",
    "genesis_events",
    "histories",
    "model_values",
    "operations",
    "update_events",
]


def event_ids() -> st.SearchStrategy[EventId]:
    """Any event id."""
    return st.binary(min_size=32, max_size=32).map(EventId)


def entity_ids() -> st.SearchStrategy[EntityId]:
    """Any entity id."""
    return st.binary(min_size=32, max_size=32).map(EntityId)


def clocks(*, min_size: int = 0, max_size: int = 8) -> st.SearchStrategy[Clock]:
    """Clocks of ``min_size`` to ``max_size`` distinct ids."""
    return st.lists(event_ids(), min_size=min_size, max_size=max_size, unique=True).map(Clock)


def collection_names() -> st.SearchStrategy[str]:
    """Valid collection names (never the reserved ``_mycelia_`` prefix)."""
    return st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True)


def backend_names() -> st.SearchStrategy[str]:
    """Valid backend names."""
    return st.sampled_from(["lww", "text", "x_future"])


def operations() -> st.SearchStrategy[Operations]:
    """Normalised operations: a few backends, each a few opaque diffs."""
    return st.dictionaries(
        backend_names(), st.lists(st.binary(max_size=64), min_size=1, max_size=3), max_size=3
    ).map(normalize_operations)


def genesis_events(*, system: EntityId | None = None) -> st.SearchStrategy[Event]:
    """Genesis events (bound to ``system``, or to a random one when ``None``)."""
    systems = st.just(system) if system is not None else st.none() | entity_ids()
    return st.builds(
        lambda c, s, o, n: Event.genesis(collection=c, system=s, operations=o, nonce=n),
        collection_names(),
        systems,
        operations(),
        st.binary(min_size=NONCE_LENGTH, max_size=NONCE_LENGTH),
    )


def update_events() -> st.SearchStrategy[Event]:
    """Updates with random (not necessarily existing) parents."""
    return st.builds(
        lambda e, c, p, o: Event.update(entity_id=e, collection=c, parent=p, operations=o),
        entity_ids(),
        collection_names(),
        clocks(min_size=1, max_size=5),
        operations(),
    )


def events() -> st.SearchStrategy[Event]:
    """Genesis and update events."""
    return genesis_events() | update_events()


# -- a user's models -------------------------------------------------------------------------


def _json_values() -> st.SearchStrategy[object]:
    leaves = (
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**63 - 1)
        | st.floats(allow_nan=False)
        | st.text(max_size=8)
    )
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
        max_leaves=8,
    )


def field_values(field: FieldKind) -> st.SearchStrategy[object]:
    """Valid values for one declared field (see :func:`~mycelia.testing.fields.field_kinds`)."""
    by_kind: dict[str, st.SearchStrategy[object]] = {
        "text": st.text(max_size=12),
        "str": st.text(max_size=12),
        "int": st.integers(-(2**63), 2**63 - 1),
        "float": st.floats(allow_nan=False),
        "bool": st.booleans(),
        "bytes": st.binary(max_size=12),
        "json": _json_values(),
        "ref": st.binary(min_size=32, max_size=32),
    }
    values = by_kind[field.kind]
    return st.none() | values if field.optional and field.kind != "text" else values


@st.composite
def model_values(draw: st.DrawFn, model: type[Model]) -> dict[str, Any]:
    """Keyword arguments for ``trx.create(model, **values)``: every required field and a
    drawn subset of the others (typed ``Any``: they fit the model at run time)."""
    values: dict[str, Any] = {}
    for field in field_kinds(model):
        if field.required or draw(st.booleans()):
            values[field.name] = draw(field_values(field))
    return values


@st.composite
def edit_steps(draw: st.DrawFn, model: type[Model]) -> EditStep:
    """One edit of one field of ``model`` (text fields also get inserts and deletes)."""
    field = draw(st.sampled_from(field_kinds(model)))
    if field.kind == "text":
        index = st.integers(0, 64)
        return draw(
            st.builds(TextInsert, st.just(field.name), index, st.text(min_size=1, max_size=6))
            | st.builds(TextDelete, st.just(field.name), index, st.integers(1, 8))
            | st.builds(SetField, st.just(field.name), st.text(max_size=12))
        )
    return SetField(field.name, draw(field_values(field)))


def edit_scripts(
    model: type[Model], *, min_size: int = 1, max_size: int = 5
) -> st.SearchStrategy[tuple[EditStep, ...]]:
    """A transaction's worth of edits to one entity of ``model``."""
    return st.lists(edit_steps(model), min_size=min_size, max_size=max_size).map(tuple)


@st.composite
def histories(
    draw: st.DrawFn, model: type[Model], *, nodes: int = 3, max_events: int = 12
) -> History:
    """Concurrent histories of one entity of ``model``: a DAG shape (one root) whose events
    ``nodes`` nodes made, each carrying LWW writes. Mint them with ``History.events(system)``
    or ``History.by_node(system)``."""
    shape: DagShape = draw(dag_shapes(max_events=max_events, extra_roots=False))
    lww = [f for f in field_kinds(model) if f.kind != "text"]
    writes = [
        tuple((f.name, draw(field_values(f))) for f in lww if f.required or draw(st.booleans()))
    ]
    for _ in shape.parents[1:]:
        chosen = draw(st.lists(st.sampled_from(lww), max_size=3, unique=True)) if lww else []
        writes.append(tuple((f.name, draw(field_values(f))) for f in chosen))
    return History(
        model=model,
        shape=shape,
        authors=tuple(draw(st.integers(0, nodes - 1)) for _ in shape.parents),
        writes=tuple(writes),
        nonce=draw(st.binary(min_size=NONCE_LENGTH, max_size=NONCE_LENGTH)),
        nodes=nodes,
    )
