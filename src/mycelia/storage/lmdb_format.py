"""The LMDB engine's on-disk layout, opening, decoding and error translation (§6).

Layout — named databases, opened once when the engine is constructed:

==================  ===========================================  ============================
database            key                                          value
==================  ===========================================  ============================
``events``          event id                                     generation (8 bytes BE) +
                                                                 canonical event bytes
``by_entity``       entity id + generation (8 BE) + event id     empty (parents-first index)
``states``          entity id                                    len (4 BE) + state bytes +
                                                                 values (msgpack)
``parts``           entity id + backend + NUL + index (4 BE)     one part of a buffer stored
                                                                 aside (see below)
``by_collection``   collection (UTF-8) + NUL + entity id         empty (``scan`` index)
``by_field``        ``encode_key(collection)`` +                 empty (``fetch`` index, see
                    ``encode_key(field)`` + value key + entity   :mod:`.lmdb_index`)
``feed``            offset (8 BE)                                :func:`encode_feed` row
``meta``            key (UTF-8)                                  value
``engine``          ``format``                                   format version
==================  ===========================================  ============================

Invariants:

- **Large buffers stored as parts are stored aside** (layout 4): a state whose buffer is
  given as its parts (:meth:`~mycelia.proto.State.to_stored`, a text's canonical base and
  the updates logged since) of :data:`ASIDE_BYTES` or more keeps, in its ``states`` value,
  the *number* of parts in the buffer's place, and each part under its own ``parts`` key;
  the top bit of the length prefix (:data:`ASIDE`) says a value has such a buffer. A write
  puts only the parts that changed (the writer, :mod:`.lmdb_writer`, knows what it put),
  so a keystroke into a long text writes its update, not the text's base again. A reader
  puts the parts back in place (:func:`stored_state`); one that is missing is
  :class:`~mycelia.errors.StorageCorrupt`.
- The format version is written once and checked on every open. Version 1 (no
  ``by_field``) is migrated by a writable open, in one write transaction that builds the
  field index from the stored states; a read-only open of version 1 is refused. Versions
  2 and 3 read as 4 does (3 added a form of text buffer, its parts; 4 added ``parts``,
  which a read-only open of 2 or 3 goes without: nothing there is stored aside): a
  writable open bumps them, a read-only one reads them as they are.
- A process holds ``mycelia.lock`` (``flock``) while the store is open, so a second opener
  gets :class:`~mycelia.errors.StorageLocked` at once; the lock dies with the process. A
  read-only open takes it shared, and creates nothing: on a store directory that holds
  only ``data.mdb`` (a backup) it opens without the lock files.
- **Nothing is mapped unchecked** (:func:`check_data_file`): before LMDB maps
  ``data.mdb``, its two meta pages are read with plain reads, and a file shorter than the
  pages the newest meta page says are in use is refused with
  :class:`~mycelia.errors.StorageCorrupt` (mapping it would kill the process with SIGBUS
  on the first read past the end). A zero-length ``data.mdb`` is refused too: LMDB writes
  its meta pages when it creates a file, so an empty one is a damaged store, not a new
  one. A missing path, or one that is a file, is
  :class:`~mycelia.errors.StorageNotFound` (a read-only open never creates a store).
- Stored events are re-hashed on read; content that does not match its key, or does not
  decode, raises :class:`~mycelia.errors.StorageCorrupt`.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import lmdb

from mycelia.entity import stored_merge
from mycelia.errors import (
    DecodeError,
    StorageCorrupt,
    StorageError,
    StorageLocked,
    StorageNotFound,
    StorageReadOnly,
)
from mycelia.proto import AdmittedEvent, EntityState, Event, EventId
from mycelia.proto.codec import unpack
from mycelia.retrieval import StoredState
from mycelia.storage.engine import STORED_LIMITS, decode_values

if TYPE_CHECKING:
    Txn = lmdb.Transaction[bytes]

__all__ = [
    "ASIDE",
    "ASIDE_BYTES",
    "FORMAT_VERSION",
    "NAMES",
    "Databases",
    "Gate",
    "admitted",
    "aside_backends",
    "check_data_file",
    "last_feed_offset",
    "open_databases",
    "open_env",
    "part_key",
    "stored",
    "stored_state",
    "stored_values",
    "take_lock",
    "translate",
]

log = logging.getLogger(__name__)

FORMAT_VERSION: Final = b"4"
"""The on-disk layout version (2 added ``by_field``; 3 lets a text state's buffer be stored
as its parts, :meth:`~mycelia.proto.EntityState.to_stored`; 4 stores large ones aside, in
``parts``)."""
_MIGRATABLE: Final = b"1"
_READABLE: Final = (b"2", b"3")
"""Versions this one reads as they are (a writable open bumps them; a read-only one reads
them, without ``parts``)."""
NAMES: Final = (
    b"events", b"by_entity", b"states", b"by_collection", b"by_field", b"feed", b"meta",
    b"engine", b"parts",
)  # fmt: skip
ASIDE: Final = 1 << 31
"""The bit of a ``states`` value's length prefix that says it has a buffer stored aside."""
ASIDE_BYTES: Final = 4096
"""The least size of a buffer's parts that a write stores aside, not in the value."""
Databases = dict[bytes, "lmdb._Database"]


class Gate:
    """Shared for reads, exclusive for a map resize or close (a readers-writer lock)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._exclusive = False

    @contextmanager
    def shared(self) -> Iterator[None]:
        """Hold the gate shared (many readers at once)."""
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive)
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the gate alone (waits for the readers to leave)."""
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive)
            self._exclusive = True
            self._cond.wait_for(lambda: not self._readers)
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


def translate(exc: BaseException, what: str) -> StorageError:
    """The typed error for an lmdb (or OS) failure."""
    if isinstance(exc, StorageError):
        return exc
    if isinstance(exc, (lmdb.InvalidError, lmdb.CorruptedError, lmdb.VersionMismatchError)):
        return StorageCorrupt(f"{what}: the store is damaged or not an LMDB store: {exc}")
    if isinstance(exc, lmdb.ReadonlyError) or (
        isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EROFS, errno.EPERM)
    ):
        return StorageReadOnly(f"{what}: the store cannot be written: {exc}")
    if isinstance(exc, lmdb.LockError):
        return StorageLocked(f"{what}: {exc}")
    return StorageError(f"{what}: {exc}")


def take_lock(path: Path, *, readonly: bool) -> int | None:
    """Open and ``flock`` ``path/mycelia.lock``; returns the descriptor (the caller closes).

    A read-only open takes the lock shared and creates nothing: if the lock file is missing
    (a backup of ``data.mdb`` alone) it returns None, and no writer holds the store then
    (a writer creates the file before anything else). Raises StorageNotFound for a missing
    path (read-only) or a path that is a file, StorageLocked if a writer holds the store.
    """
    if path.exists() and not path.is_dir():
        raise StorageNotFound(f"{path} is a file, not a store directory: give a directory")
    if readonly and not (path / "data.mdb").exists():
        raise StorageNotFound(
            f"there is no store in {path} (no data.mdb): give the data directory of a store"
        )
    try:
        if not readonly:
            path.mkdir(parents=True, exist_ok=True)
        fd = os.open(
            path / "mycelia.lock", os.O_RDONLY if readonly else os.O_RDWR | os.O_CREAT, 0o644
        )
    except FileNotFoundError:
        if readonly:
            return None
        raise StorageNotFound(f"cannot create a store in {path}: a parent is missing") from None
    except OSError as exc:
        raise translate(exc, f"cannot open {path}") from exc
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if readonly else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        raise StorageLocked(f"{path} is open in another engine (maybe another process)") from exc
    return fd


_META: Final = struct.Struct("<II8xQIH2x40x48xQQ")
"""An LMDB 0.9 meta page (64-bit) after its 16-byte page header: magic, version,
(address), mapsize, the free database's ``md_pad`` (which holds the page size) and
``md_flags``, (the rest of both database records), ``mm_last_pg`` and ``mm_txnid``."""
_PAGE_HEADER: Final = 16
_MAGIC: Final = 0xBEEFC0DE
_DATA_VERSION: Final = 1


def check_data_file(path: Path) -> None:
    """Refuse a ``data.mdb`` that LMDB cannot map safely (see the module docstring).

    Reads the two meta pages with plain reads (never through a map); a missing file is a
    new store and passes. Raises StorageCorrupt for an empty or cut file, a meta page that
    is not LMDB's, or meta pages whose used size exceeds their own map size.
    """
    data = path / "data.mdb"
    try:
        with data.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            first = f.read(_PAGE_HEADER + _META.size)
            page = _page_size(data, first, size)
            f.seek(page)
            second = f.read(_PAGE_HEADER + _META.size)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise translate(exc, f"cannot read {data}") from exc
    metas = [_meta(data, raw, size) for raw in (first, second)]
    mapsize, last_page = max(metas, key=lambda m: m[2])[:2]  # LMDB uses the newest
    used = (last_page + 1) * page
    if size < used:
        raise StorageCorrupt(
            f"{data} is cut short: it has {size} bytes but its pages in use end at {used} "
            "(a full disk or an interrupted copy?); restore the store from a backup or a "
            "dump, as opening it would read past its end"
        )
    if mapsize < used:
        raise StorageCorrupt(
            f"{data} is damaged: its meta page claims a map of {mapsize} bytes, smaller "
            f"than the {used} bytes of pages it uses"
        )


def _page_size(data: Path, first: bytes, size: int) -> int:
    if size == 0:
        raise StorageCorrupt(
            f"{data} is empty: a store's file always holds its meta pages, so this one was "
            "cut (a full disk?) or never finished; restore it from a backup or a dump, or "
            "delete the directory to start a new, empty store"
        )
    if len(first) < _PAGE_HEADER + _META.size:
        raise StorageCorrupt(f"{data} is cut short: {size} bytes hold no LMDB meta page")
    page: int = _META.unpack_from(first, _PAGE_HEADER)[3]
    if page < 512 or page > 1 << 16 or page & (page - 1):
        raise StorageCorrupt(f"{data} is not an LMDB file (page size {page})")
    if size < 2 * page:
        raise StorageCorrupt(
            f"{data} is cut short: {size} bytes cannot hold its two meta pages of {page}"
        )
    return page


def _meta(data: Path, raw: bytes, size: int) -> tuple[int, int, int]:
    """(mapsize, last page, txnid) of one meta page; raises StorageCorrupt."""
    if len(raw) < _PAGE_HEADER + _META.size:
        raise StorageCorrupt(f"{data} is cut short: {size} bytes hold no second meta page")
    magic, version, mapsize, _, _, last_page, txnid = _META.unpack_from(raw, _PAGE_HEADER)
    if magic != _MAGIC or version != _DATA_VERSION:
        raise StorageCorrupt(
            f"{data} is not an LMDB {_DATA_VERSION} file, or its meta page is damaged "
            f"(magic {magic:#x}, version {version})"
        )
    return mapsize, last_page, txnid


def open_env(
    path: Path, *, map_size: int, max_readers: int, readonly: bool, durable: bool
) -> lmdb.Environment:
    """The LMDB environment at ``path``, after :func:`check_data_file`; raises a
    StorageError subclass.

    A read-only open uses LMDB's reader table (``lock.mdb``) only if that file exists and
    can be written; otherwise (a backup, a read-only copy) it opens without it, which is
    safe because the shared ``mycelia.lock`` keeps writers out.
    """
    check_data_file(path)
    lock = not readonly or os.access(path / "lock.mdb", os.W_OK)
    try:
        return lmdb.open(
            str(path), map_size=map_size, max_dbs=len(NAMES), readonly=readonly,
            sync=durable, metasync=durable, readahead=False, max_readers=max_readers,
            create=not readonly, lock=lock,
        )  # fmt: skip
    except (lmdb.Error, OSError) as exc:
        raise translate(exc, f"cannot open {path}") from exc


def open_databases(
    env: lmdb.Environment,
    path: Path,
    *,
    readonly: bool,
    migrate: Callable[[Txn, Databases], None],
) -> Databases:
    """Open every named database, creating the layout or migrating version 1 (``migrate``
    fills ``by_field`` inside the write transaction that bumps the version); closes ``env``
    and raises (StorageCorrupt for another layout version) on failure."""
    try:
        engine = env.open_db(b"engine", create=not readonly)
        with env.begin() as txn:
            found = txn.get(b"format", db=engine)
        if readonly and found == _MIGRATABLE:
            raise StorageReadOnly(
                f"{path} has layout version 1: open it writable once to migrate it to "
                f"{FORMAT_VERSION.decode()}"
            )
        if found not in (FORMAT_VERSION, *_READABLE) and (
            readonly or found not in (None, _MIGRATABLE)
        ):
            if found is not None and found.isdigit() and int(found) > int(FORMAT_VERSION):
                raise StorageCorrupt(
                    f"{path} has layout version {found.decode()}, newer than this Mycelia's "
                    f"{FORMAT_VERSION.decode()}: open it with the version that wrote it, or newer"
                )
            raise StorageCorrupt(f"{path} has layout version {found!r}, not {FORMAT_VERSION!r}")
        older = readonly and found != FORMAT_VERSION  # (it has no ``parts``, nor needs one)
        names = [name for name in NAMES if not (older and name == b"parts")]
        dbs = {name: env.open_db(name, create=not readonly) for name in names}
        if found != FORMAT_VERSION and not readonly:
            with env.begin(write=True) as txn:
                if found == _MIGRATABLE:
                    log.info("migrating the LMDB store %s to layout %s", path, FORMAT_VERSION)
                    migrate(txn, dbs)
                txn.put(b"format", FORMAT_VERSION, db=dbs[b"engine"])
    except (lmdb.Error, OSError, StorageError) as exc:
        env.close()
        raise translate(exc, f"cannot open the databases in {path}") from exc
    return dbs


def last_feed_offset(env: lmdb.Environment, dbs: Databases) -> int:
    """The largest feed offset stored (0 for an empty feed)."""
    txn: Txn = env.begin()
    with txn:
        cursor = txn.cursor(db=dbs[b"feed"])
        return int.from_bytes(cursor.key(), "big") if cursor.last() else 0


def admitted(event_id: bytes, value: bytes) -> AdmittedEvent:
    """Decode an ``events`` value, checking that its content hashes to its key."""
    try:
        event = Event.from_bytes(
            value[8:], limits=STORED_LIMITS, expect_id=EventId._trusted(event_id)
        )
    except DecodeError as exc:
        raise StorageCorrupt(f"stored event {event_id.hex()} is damaged: {exc}") from exc
    return AdmittedEvent(event, int.from_bytes(value[:8], "big"))


def part_key(entity_id: bytes, backend: str, index: int) -> bytes:
    """The ``parts`` key of part ``index`` of ``entity_id``'s ``backend`` buffer."""
    return entity_id + backend.encode() + b"\0" + index.to_bytes(4, "big")


def stored_state(value: bytes, txn: Txn, dbs: Databases) -> EntityState:
    """Decode the state of a ``states`` value (length-prefixed, then the values), with the
    parts of a buffer stored aside read back in place. A state with no parts keeps its
    stored bytes (``EntityState.wire``: the writer encoded them canonically), which an
    answer's pages carry as they are."""
    prefix = int.from_bytes(value[:4])
    try:
        raw = value[4 : 4 + (prefix & ~ASIDE)]
        if not prefix & ASIDE:
            return EntityState.from_bytes(raw, limits=STORED_LIMITS, merge=stored_merge, keep=True)
        obj = unpack(raw, limits=STORED_LIMITS, what="entity state")
        _parts_in_place(obj, txn, dbs)
        return EntityState.from_wire(obj, limits=STORED_LIMITS, merge=stored_merge)
    except DecodeError as exc:
        raise StorageCorrupt(f"a stored state is damaged: {exc}") from exc


def _parts_in_place(obj: object, txn: Txn, dbs: Databases) -> None:
    """Replace each buffer's count of parts stored aside by those parts (a stored state's
    shape: ``[entity id, collection, [head, generations, [[backend, buffer], ...]]]``)."""
    try:
        entity_id: bytes = obj[0]  # type: ignore[index]
        buffers: list[list[Any]] = obj[2][2]  # type: ignore[index]
        aside = [item for item in buffers if type(item[1]) is int]
        if type(entity_id) is not bytes or any(type(item[0]) is not str for item in aside):
            raise TypeError("an entity id or a backend name of another type")
    except (TypeError, ValueError, IndexError) as exc:
        raise DecodeError(f"a state with parts stored aside has another shape: {exc}") from exc
    db = dbs.get(b"parts")
    for item in aside:
        parts: list[bytes] = []
        for index in range(item[1]):
            part = None if db is None else txn.get(part_key(entity_id, item[0], index), db=db)
            if part is None:
                raise StorageCorrupt(
                    f"part {index} of the {item[0]!r} buffer of a stored state is missing"
                )
            parts.append(part)
        item[1] = parts


def stored_values(value: bytes) -> dict[str, object]:
    """Decode the values of a ``states`` value."""
    return decode_values(value[4 + (int.from_bytes(value[:4]) & ~ASIDE) :])


def aside_backends(value: bytes) -> list[str]:
    """The backends whose buffer a ``states`` value has stored aside (none, nearly always:
    read without decoding the state)."""
    prefix = int.from_bytes(value[:4])
    if not prefix & ASIDE:
        return []
    try:
        obj = unpack(value[4 : 4 + (prefix & ~ASIDE)], limits=STORED_LIMITS, what="entity state")
        return [item[0] for item in obj[2][2] if type(item[1]) is int]  # type: ignore[index]
    except (DecodeError, TypeError, IndexError) as exc:
        raise StorageCorrupt(f"a stored state is damaged: {exc}") from exc


def stored(value: bytes, txn: Txn, dbs: Databases) -> StoredState:
    """Decode a ``states`` value whole."""
    return StoredState(stored_state(value, txn, dbs), stored_values(value))
