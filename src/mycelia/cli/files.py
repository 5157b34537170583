"""Opening the store a command names: what ``serve``, ``inspect``, ``dump`` and ``load`` may
do to a path (issue 16).

Invariants:

- ``inspect`` and ``dump`` open the store **read-only** and never create anything: a
  missing path, or one with no store in it, is a one-line :class:`ConfigError` (exit 2);
  a store on a read-only file system, or a backup holding ``data.mdb`` alone, is read as
  it is. On PostgreSQL they neither create nor migrate the schema.
- ``serve`` and ``load`` open the store writable and create its directory if missing; a
  directory ``load`` created is removed again if the load fails (:func:`store_to_load`),
  so a refused load leaves nothing behind, not even an empty store.
- A path that is a file (``--data FILE``) is a one-line :class:`ConfigError` (exit 2),
  whatever the command.
- Damage (a cut or empty ``data.mdb``) stays :class:`~mycelia.errors.StorageCorrupt`: it is
  not the operator's flag that is wrong, and the message says what to do.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from mycelia.errors import ConfigError, StorageNotFound
from mycelia.storage import StorageEngine

__all__ = ["open_store", "store_to_load"]


async def open_store(data: str, postgres: str | None, *, readonly: bool) -> StorageEngine:
    """The engine the flags name: LMDB in ``data``, or PostgreSQL at ``postgres``.

    ``readonly``: open it read-only, creating nothing (``inspect``, ``dump``). Raises
    ConfigError for a path that names no store (read-only) or is a file.
    """
    try:
        if postgres:
            from mycelia.storage.postgres import PostgresStorage  # noqa: PLC0415 - optional

            return await PostgresStorage(postgres, create=not readonly).open()
        from mycelia.storage.lmdb import LmdbStorage  # noqa: PLC0415 - keeps --help fast

        return LmdbStorage(data, readonly=readonly)
    except StorageNotFound as exc:
        raise ConfigError(str(exc)) from exc


@contextlib.asynccontextmanager
async def store_to_load(data: str, postgres: str | None) -> AsyncIterator[StorageEngine]:
    """The store ``load`` writes, closed on exit; if the body fails, the LMDB directory
    this opening created is removed again. Raises ConfigError like :func:`open_store`."""
    made = not postgres and not Path(data).exists()  # noqa: ASYNC240 - once, at start-up
    storage = await open_store(data, postgres, readonly=False)
    try:
        yield storage
    except BaseException:
        print(file=sys.stderr)  # end the progress line before the error
        await storage.close()
        if made:
            shutil.rmtree(data, ignore_errors=True)
        raise
    await storage.close()
