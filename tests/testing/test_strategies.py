"""The strategies draw what a correct peer could produce, and histories converge on the LWW
oracle in every delivery order."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mycelia import Json, Model, Node, Ref, Text
from mycelia.proto import EntityId
from mycelia.storage import MemoryStorage
from mycelia.testing import (
    EditStep,
    History,
    SetField,
    TextInsert,
    apply_edit,
    check_convergence,
    field_kinds,
)
from mycelia.testing.dags import DagShape
from mycelia.testing.fields import random_edit, random_values
from mycelia.testing.samples import SimLink, SimNote
from mycelia.testing.strategies import (
    dag_shapes,
    edit_scripts,
    histories,
    model_values,
)


class Artist(Model, collection="artists"):
    name: str


class Album(Model, collection="albums"):
    name: Text
    artist: Ref[Artist] | None
    year: int = 1999
    rating: float | None
    live: bool
    cover: bytes | None
    meta: Json
    label: str | None


async def _node() -> Node:
    node = await Node.open(MemoryStorage(), durable=True)
    await node.create_system()
    return node


def test_field_kinds_read_every_declared_field() -> None:
    kinds = {f.name: (f.kind, f.optional, f.required) for f in field_kinds(Album)}
    assert kinds == {
        "name": ("text", False, False),
        "artist": ("ref", True, False),
        "year": ("int", False, False),
        "rating": ("float", True, False),
        "live": ("bool", False, True),
        "cover": ("bytes", True, False),
        "meta": ("json", True, False),
        "label": ("str", True, False),
    }


def _expected(
    values: dict[str, object], script: tuple[EditStep, ...], model: type[Model] = Album
) -> dict[str, object]:
    """What the fields should read after creating with ``values`` and applying ``script``."""
    out: dict[str, object] = {}
    for field in field_kinds(model):
        spec = model._fields[field.name]
        out[field.name] = values.get(field.name, "" if field.kind == "text" else spec.default)
    for step in script:
        if isinstance(step, SetField):
            out[step.name] = step.value
            continue
        text = str(out[step.name])
        i = min(max(step.index, 0), len(text))
        if isinstance(step, TextInsert):
            out[step.name] = text[:i] + step.text + text[i:]
        else:
            out[step.name] = text[:i] + text[i + min(max(step.length, 0), len(text) - i) :]
    return {
        name: None if value is None else model._fields[name].wrap(model._fields[name].check(value))
        for name, value in out.items()
    }


@settings(max_examples=30)
@given(values=model_values(Album), script=edit_scripts(Album))
def test_drawn_values_and_edit_scripts_commit_what_they_say(
    values: dict[str, Any], script: tuple[EditStep, ...]
) -> None:
    async def go() -> None:
        node = await _node()
        async with node.context().transaction() as trx:
            album = trx.create(Album, **values)
        async with node.context().transaction() as trx:
            handle = await trx.edit(Album, album.id)
            for step in script:
                apply_edit(handle, step)
        view = await node.context().get(Album, album.id)
        for name, value in _expected(values, script).items():
            assert getattr(view, name) == value, name

    asyncio.run(go())


def test_seeded_values_and_edits_always_commit_what_they_say() -> None:
    async def go() -> None:
        node = await _node()
        rng = random.Random(5)
        models: tuple[type[Model], ...] = (Album, SimNote, SimLink)
        for model in models:
            for _ in range(30):
                values = random_values(model, rng)
                script = tuple(random_edit(model, rng) for _ in range(3))
                async with node.context().transaction() as trx:
                    handle = trx.create(model, **values)
                    for step in script:
                        apply_edit(handle, step)
                view = await node.context().get(model, handle.id)
                for name, value in _expected(values, script, model).items():
                    assert getattr(view, name) == value, (model.__name__, name, script)

    asyncio.run(go())


@given(history=histories(Album, nodes=3), seed=st.integers(0, 2**32))
def test_histories_converge_on_the_lww_rule_in_any_delivery_order(
    history: History, seed: int
) -> None:
    rng = random.Random(seed)

    async def go() -> None:
        first = await _node()
        nodes = [first]
        for _ in range(2):
            node = await Node.open(MemoryStorage(), durable=True)
            await node.join_system(await first.system_events())
            nodes.append(node)
        assert first.system_root is not None
        events = history.events(first.system_root)
        for node in nodes:  # shuffled, duplicated, children before parents, in batches
            delivery = events + rng.sample(events, len(events) // 2)
            rng.shuffle(delivery)
            cut = rng.randint(0, len(delivery))
            await node.ingest(delivery[:cut])
            await node.ingest(delivery[cut:])
        await check_convergence(nodes, complete=True)
        expected = history.expected_values_in(first.system_root)
        view = await first.context().get(Album, events[0].entity_id)
        for name, value in expected.items():
            spec = Album._fields[name]
            assert getattr(view, name) == spec.wrap(spec.check(value)), name

    asyncio.run(go())


@given(history=histories(SimNote, nodes=2, max_events=6))
def test_by_node_splits_a_history_between_its_authors(history: History) -> None:
    system = EntityId(bytes(32))  # any id will do for minting
    mine = history.by_node(system)
    assert len(mine) == 2
    assert sorted(e.id for part in mine for e in part) == sorted(
        e.id for e in history.events(system)
    )


@given(shape=dag_shapes(max_events=8))
def test_dag_shapes_are_reexported_for_histories(shape: DagShape) -> None:
    dag, events = shape.build()
    assert len(events) == len(shape.parents)
    assert dag.entity_id == events[0].entity_id
