"""Stores for the command line: open the one the flags name; ``inspect``, ``dump``, ``load``.

Invariants:

- An operator's mistake (``--data`` naming a file, a directory this user cannot write, a
  store held by a running server, a missing dump file, an unreachable PostgreSQL) is a
  one-line :class:`~mycelia.errors.ConfigError`, and leaves nothing behind on disk: a
  data directory created by this command is removed again if the command fails before
  it is in use (:meth:`Opened.discard`).
- ``inspect`` and ``dump`` never create a store: a path with no store is a mistake.
- Data (``dump``) goes to stdout or a file, never to a terminal (binary msgpack would only
  garble it); progress and messages go to stderr: a bar on a terminal, plain lines every
  few seconds otherwise (:mod:`mycelia.node.progress`), and one closing line.
- Ids print in one format everywhere: unpadded URL-safe base64 (``str(EntityId)``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import stat
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from mycelia.cli.settings import env_option
from mycelia.errors import (
    ConfigError,
    MyceliaError,
    StorageCorrupt,
    StorageError,
    StorageLocked,
    StorageNotFound,
)
from mycelia.node.progress import Progress
from mycelia.proto import EntityId
from mycelia.storage import StorageEngine
from mycelia.storage.dump import DumpProgress, dump_to, load_from

__all__ = ["Opened", "add_data_commands", "open_storage", "storage_options"]

DEFAULT_DATA = "./mycelia-data"


@dataclass(frozen=True, slots=True)
class Opened:
    """An open store, and the directory this command created for it (if any)."""

    storage: StorageEngine
    where: str
    created: Path | None

    async def discard(self) -> None:
        """Close the store and remove what this command created (a failed start-up)."""
        with contextlib.suppress(StorageError):
            await self.storage.close()
        if self.created is not None:
            shutil.rmtree(self.created, ignore_errors=True)


async def open_storage(data: str, postgres: str | None, *, create: bool) -> Opened:
    """The engine the flags name (LMDB in ``data`` unless ``postgres`` is given).

    ``create``: open it writable, making the LMDB directory if it is missing (``serve``,
    ``load``); otherwise open an existing store read-only, creating nothing (``inspect``,
    ``dump``: a read-only backup can be read). Raises ConfigError.
    """
    if postgres:
        from mycelia.storage.postgres import PostgresStorage  # noqa: PLC0415 - optional extra

        try:
            storage = await PostgresStorage(postgres, create=create).open()
        except StorageError as exc:  # the DSN may hold a password: do not echo it
            raise ConfigError(f"cannot open the PostgreSQL store (--postgres): {exc}") from exc
        return Opened(storage, "PostgreSQL", None)
    from mycelia.storage.lmdb import LmdbStorage  # noqa: PLC0415 - keeps --help fast

    path = Path(data)
    if path.exists() and not path.is_dir():  # noqa: ASYNC240 - once, at start-up
        raise ConfigError(f"--data {path} is a file, not a directory: give a data directory")
    created = _make_directory(path) if create else None
    where = str(path.absolute())  # noqa: ASYNC240 - once, at start-up
    try:
        return Opened(LmdbStorage(path, readonly=not create), where, created)
    except StorageNotFound as exc:
        raise ConfigError(str(exc)) from exc
    except StorageError as exc:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise _explain(path, exc) from exc


def _explain(path: Path, exc: StorageError) -> MyceliaError:
    if isinstance(exc, StorageLocked):
        return ConfigError(
            f"{path} is in use by another process (a running 'mycelia serve'?): stop it first"
        )
    if isinstance(exc, StorageCorrupt):
        return exc  # damage, not a wrong flag: the message says what to do
    return ConfigError(f"cannot open the store in {path}: {_reason(exc)}")


def _reason(exc: StorageError) -> str:
    cause = exc.__cause__
    if isinstance(cause, OSError) and cause.strerror:
        return f"{cause.strerror} (give a directory this user can write)"
    return str(exc)


def _make_directory(path: Path) -> Path | None:
    """Make ``path`` (and missing parents); returns the topmost directory made, if any."""
    if path.exists() and not path.is_dir():
        raise ConfigError(
            f"--data {path} is a file, not a directory: give a directory (it is created if missing)"
        )
    if path.is_dir():
        return None
    top = path.absolute()
    while not top.parent.exists():
        top = top.parent
    if not top.parent.is_dir():
        raise ConfigError(f"cannot create --data {path}: {top.parent} is a file")
    try:
        path.mkdir(parents=True)
    except OSError as exc:
        shutil.rmtree(top, ignore_errors=True)
        raise ConfigError(
            f"cannot create --data {path}: {exc.strerror} (give a directory this user can write)"
        ) from exc
    return top


def storage_options(cmd: argparse.ArgumentParser) -> None:
    """``DATA`` and ``--postgres``, with their environment variables."""
    env_option(
        cmd, "data", env="MYCELIA_DATA", default=DEFAULT_DATA, help="LMDB data directory",
        nargs="?",
    )  # fmt: skip
    env_option(
        cmd, "--postgres", env="MYCELIA_POSTGRES", default=None, metavar="DSN",
        help="use the PostgreSQL store at DSN instead",
    )  # fmt: skip


def add_data_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``inspect``, ``dump`` and ``load``."""
    inspect_cmd = sub.add_parser(
        "inspect",
        help="print a summary of a data directory",
        description="Print the node id, system root, change-feed offset and entity counts "
        "per collection of a store.",
    )
    storage_options(inspect_cmd)
    inspect_cmd.set_defaults(run=inspect_command)
    dump_cmd = sub.add_parser(
        "dump",
        help="write a store's events and states to a portable file",
        description="Stream every entity (events parents first, then its state) to OUT "
        "(stdout when '-'), with a progress line on stderr. Stop 'mycelia serve' first: an "
        "LMDB store is open in one process at a time.",
    )
    storage_options(dump_cmd)
    dump_cmd.add_argument("out", nargs="?", default="-", help="output file ('-': stdout)")
    dump_cmd.add_argument(
        "--ephemeral",
        action="store_true",
        help="dump an ephemeral node's cache (state snapshots without their events); such "
        "a dump loads only with 'mycelia load --ephemeral'",
    )
    dump_cmd.set_defaults(run=dump_command)
    load_cmd = sub.add_parser(
        "load",
        help="load a portable dump into a store",
        description="Read a dump written by 'mycelia dump' into a store, all or nothing. "
        "Every event id is recomputed from the event's bytes, every state from its events, "
        "every meta record is checked; a store that holds anything takes only a dump of its "
        "own node and system, and a loaded state merges with the stored one (it never "
        "moves back). The store must not be open in a running 'mycelia serve' (LMDB "
        "refuses a second opener). A store this command creates is removed again if the "
        "load fails.",
    )
    load_cmd.add_argument("file", help="the dump file ('-': stdin)")
    storage_options(load_cmd)
    load_cmd.add_argument(
        "--ephemeral",
        action="store_true",
        help="the store is an ephemeral node's cache: accept the snapshots of an "
        "ephemeral dump (a durable store never takes a state without its events)",
    )
    load_cmd.set_defaults(run=load_command)


async def inspect_command(args: argparse.Namespace) -> int:
    """``mycelia inspect``: a summary of a store."""
    from mycelia.node.identity import KEY_META, NodeKey  # noqa: PLC0415
    from mycelia.node.node import ROOT_KEY  # noqa: PLC0415

    storage = (await open_storage(args.data, args.postgres, create=False)).storage
    try:
        key = await storage.get_meta(KEY_META)
        root = await storage.get_meta(ROOT_KEY)
        print(f"node id       {NodeKey.from_private_bytes(key).node_id if key else '(none yet)'}")
        print(f"system root   {EntityId(root) if root else '(none yet)'}")
        print(f"feed offset   {await storage.last_offset()}")
        collections: set[str] = set()
        offset = 0
        while batch := await storage.read_since(offset, limit=10_000):
            collections.update(row.collection for row in batch)
            offset = batch[-1].offset
        for collection in sorted(collections):
            print(f"collection    {collection}: {len(await storage.scan(collection))} entities")
    finally:
        await storage.close()
    return 0


async def dump_command(args: argparse.Namespace) -> int:
    """``mycelia dump``: stream a store to a file."""
    if args.out == "-" and sys.stdout.isatty():
        raise ConfigError(
            "refusing to write a binary dump to the terminal: name a file "
            "(mycelia dump DATA out.dump) or redirect stdout (mycelia dump DATA > out.dump)"
        )
    storage = (await open_storage(args.data, args.postgres, create=False)).storage
    progress = Progress.on(sys.stderr, "dumping", unit="entities")
    try:
        with _output(args.out) as out:
            done = await dump_to(
                storage, out, progress=_reporter(progress), ephemeral=args.ephemeral
            )
    except BaseException:
        progress.close("dump failed")
        raise
    finally:
        await storage.close()
    progress.close(f"dumped {done.entities} entities, {done.events} events")
    return 0


async def load_command(args: argparse.Namespace) -> int:
    """``mycelia load``: load a dump into a store."""
    with _input(args.file) as raw:  # before the store: a missing file creates nothing
        source = _Counted(raw)
        opened = await open_storage(args.data, args.postgres, create=True)
        progress = Progress.on(sys.stderr, "checking", unit="bytes", total=_size(raw))
        try:
            done = await load_from(
                source,  # type: ignore[arg-type]  # reads only; IO's other methods unused
                opened.storage,
                progress=_reporter(progress, read=source),
                durable=not args.ephemeral,
            )
        except BaseException:
            progress.close("load failed: nothing was loaded")
            await opened.discard()
            raise
        await opened.storage.close()
    progress.close(f"loaded {done.entities} entities, {done.events} events")
    return 0


@contextlib.contextmanager
def _output(name: str) -> Iterator[IO[bytes]]:
    if name == "-":
        yield sys.stdout.buffer
        return
    try:
        f = open(name, "wb")  # noqa: SIM115 - closed below, after the translation
    except OSError as exc:
        raise ConfigError(f"cannot write the dump to {name}: {exc.strerror}") from exc
    with f:
        yield f


@contextlib.contextmanager
def _input(name: str) -> Iterator[IO[bytes]]:
    if name == "-":
        yield sys.stdin.buffer
        return
    if os.path.isdir(name):
        raise ConfigError(f"the dump file {name} is a directory: give the file 'dump' wrote")
    try:
        f = open(name, "rb")  # noqa: SIM115 - closed below, after the translation
    except FileNotFoundError as exc:
        raise ConfigError(f"the dump file {name} does not exist") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read the dump file {name}: {exc.strerror}") from exc
    with f:
        yield f


def _reporter(
    progress: Progress, *, read: _Counted | None = None
) -> Callable[[DumpProgress], None]:
    """A dump/load callback feeding ``progress``: entities written (dump) or bytes read
    (load, of the file's size when it is known)."""

    def report(done: DumpProgress) -> None:
        if read is None:
            size = f", {done.size / 1e6:.1f} MB" if done.size else ""
            progress.update(done.entities, detail=f"{done.events} events{size}")
        else:
            progress.update(read.count, detail=f"{done.entities} entities, {done.events} events")

    return report


class _Counted:
    """A binary file that counts the bytes read from it (load's progress)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        chunk = self._raw.read(size)
        self.count += len(chunk)
        return chunk


def _size(raw: IO[bytes]) -> int | None:
    """The size of a regular file (``None`` for a pipe or stdin)."""
    try:
        info = os.fstat(raw.fileno())
    except (OSError, ValueError):
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None
