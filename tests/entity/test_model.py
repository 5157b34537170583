"""Views are frozen values, handles write a transaction's fork: two types, one set of fields."""

from __future__ import annotations

import random

import pytest

from mycelia.entity.backends import ClientIds
from mycelia.entity.draft import Draft
from mycelia.entity.entity import Entity, Snapshot
from mycelia.entity.fieldtypes import Json, Ref, Text
from mycelia.entity.model import Handle, Model, View
from mycelia.errors import InvalidArgument, TransactionClosed
from mycelia.proto import Clock, EntityId, EventId

ID = EntityId(b"\x03" * 32)


class Track(Model, collection="tracks"):
    title: Text
    length: int = 180
    next: Ref[Later] | None  # a forward reference: fields resolve on first use


class Later(Model, collection="laters"):
    n: int


def _handle(alive: list[bool] | None = None) -> Track:
    flag = [True] if alive is None else alive
    entity = Entity.empty(ID, "tracks", text_ids=ClientIds(random.Random(1)))
    return Track._handle(Draft(Track, entity, entity.snapshot(), lambda: flag[0]))


def _view(head: int = 1, **values: object) -> Track:
    return Track._view(Snapshot(ID, "tracks", Clock([EventId(bytes([head]) * 32)]), values))


def test_a_view_and_a_handle_are_instances_of_their_model_and_of_one_kind_each() -> None:
    handle = _handle()
    view = _view()
    assert isinstance(view, Track)
    assert isinstance(handle, Track)
    assert isinstance(view, View)
    assert not isinstance(view, Handle)
    assert isinstance(handle, Handle)
    assert not isinstance(handle, View)
    assert type(view).__dict__["length"] is type(handle).__dict__["length"]  # shared field


def test_a_handle_reads_and_writes_the_fork() -> None:
    handle = _handle()
    assert handle.length == 180  # the declared default, until it is written
    handle.length = 200
    handle.title.insert(0, "Kiss")
    assert (handle.length, str(handle.title)) == (200, "Kiss")
    handle.title.replace_all("Girls & Boys")
    handle.title.delete(0, 8)
    assert str(handle.title) == "Boys"
    draft: Draft = handle.__dict__["_draft"]
    assert draft.entity.take_operations().keys() == {"lww", "text"}
    assert handle.head == draft.entity.head
    assert handle.id == ID


def test_a_view_reads_its_snapshot_with_defaults_for_what_it_lacks() -> None:
    view = _view(length=7, title="Kiss")
    assert (view.length, view.title, view.next, view.id) == (7, "Kiss", None, ID)
    assert isinstance(view.title, Text)
    assert (_view().length, _view().title) == (180, "")


def test_views_compare_equal_by_value_and_are_unhashable() -> None:
    a, b = _view(length=7), _view(length=7)
    assert a == b
    assert a is not b
    assert _view(length=8) != a
    assert _view(2, length=7) != a  # another head
    with pytest.raises(TypeError):
        hash(a)


def test_a_view_fills_a_field_when_it_is_first_read_and_keeps_it() -> None:
    view = _view(length=7, title="Kiss")
    assert "title" not in vars(view)  # building a view decodes and wraps nothing
    title = view.title
    assert view.title is title  # one Text per view, however often it is read
    assert view == _view(length=7, title="Kiss")  # whatever either has read so far


def test_views_equal_by_their_fields_even_when_one_snapshot_spells_out_a_default() -> None:
    explicit, implicit = _view(length=180, title=""), _view()
    assert explicit == implicit
    assert implicit == explicit
    assert _view(length=181) != implicit
    nan = float("nan")  # one object: equal to itself here, as in a dict
    assert _view(length=nan, title="") == _view(length=nan)


@pytest.mark.parametrize("name", ["length", "title", "id", "head", "undeclared"])
def test_nothing_can_be_set_or_deleted_on_a_view(name: str) -> None:
    view = _view()
    with pytest.raises(InvalidArgument, match="read-only"):
        setattr(view, name, 1)
    with pytest.raises(InvalidArgument, match="read-only"):
        delattr(view, name)


def test_a_views_text_cannot_be_edited() -> None:
    view = _view(title="x")
    with pytest.raises(InvalidArgument, match="read-only"):
        view.title.insert(0, "x")
    with pytest.raises(InvalidArgument, match="read-only"):
        view.title.replace_all("x")


def test_a_handle_refuses_undeclared_names_and_bad_values() -> None:
    handle = _handle()
    with pytest.raises(InvalidArgument, match="no field 'lenght'"):
        handle.lenght = 1  # type: ignore[attr-defined]
    with pytest.raises(InvalidArgument, match="length"):
        handle.length = "long"  # type: ignore[assignment]
    assert "lenght" not in handle.__dict__


def test_a_value_too_large_for_a_peer_is_refused_at_assignment_naming_the_field() -> None:
    handle = _handle()
    with pytest.raises(InvalidArgument, match=r"Track\.length: integer .* 64 bits"):
        handle.length = 2**64
    with pytest.raises(InvalidArgument, match=r"Track\.title takes str"):
        handle.title = 3  # type: ignore[assignment]
    with pytest.raises(InvalidArgument, match=r"Notes\.notes: a string may hold at most"):
        Notes._handle(_draft_of(Notes)).notes = "x" * 70_000
    with pytest.raises(InvalidArgument, match=r"Notes\.extra: a list may hold at most"):
        Notes._handle(_draft_of(Notes)).extra = list(range(10_001))


def test_a_text_field_takes_any_length() -> None:
    """A Text field is a Yrs document: the limits of an LWW value are not its own."""
    handle = _handle()
    handle.title = "é" * 100_000
    assert handle.title == "é" * 100_000


class Notes(Model, collection="notes"):
    notes: str
    extra: Json


def _draft_of(model: type[Model]) -> Draft:
    entity = Entity.empty(ID, model.__collection__, text_ids=ClientIds(random.Random(1)))
    return Draft(model, entity, entity.snapshot(), lambda: True)


def test_a_handle_is_closed_with_its_transaction() -> None:
    alive = [True]
    handle = _handle(alive)
    alive[0] = False
    with pytest.raises(TransactionClosed):
        _ = handle.length
    with pytest.raises(TransactionClosed):
        handle.length = 1
    with pytest.raises(TransactionClosed):
        _ = handle.head
    with pytest.raises(TransactionClosed):
        handle.undeclared = 1  # type: ignore[attr-defined]


def test_reprs_name_the_model_and_the_kind() -> None:
    assert repr(_handle()) == f"Track<Mutable {ID}>(title='', length=180, next=None)"
    assert repr(_view(length=1)) == f"Track<View {ID}>(title='', length=1, next=None)"


def test_a_forward_reference_resolves_and_a_model_is_never_built_directly() -> None:
    handle = _handle()
    handle.next = Ref(EntityId(b"\x04" * 32))
    assert handle.next == EntityId(b"\x04" * 32)
    assert isinstance(_view(next=b"\x04" * 32).next, Ref)
    with pytest.raises(InvalidArgument, match=r"trx\.create"):
        Track()  # type: ignore[call-arg]  # mypy knows it too: title and next are required
