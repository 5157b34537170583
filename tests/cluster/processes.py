"""Real ``mycelia serve --postgres`` processes on one database, and clients to use them.

:func:`cluster_database` makes a fresh database on the session's PostgreSQL (dropped at
the end), so every test starts with an empty store in the default schema, exactly as an
operator's servers would. :class:`Cluster` starts server processes on it (each named,
so each keeps its own node key in the database) and hands out client URL lists that
prefer one server and fail over to the others.
"""

from __future__ import annotations

import contextlib
import signal
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

import mycelia
from mycelia import Node
from mycelia.storage import MemoryStorage
from tests.deploy.servers import Served, start_serve


@contextlib.contextmanager
def cluster_database(dsn: str) -> Iterator[str]:
    """A DSN for a new, empty database on the server ``dsn`` names (dropped after)."""
    name = f"c_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    parts = urlsplit(dsn)
    try:
        yield urlunsplit(parts._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def with_application_name(dsn: str, name: str) -> str:
    """``dsn`` with ``application_name=name`` (so its connections can be found)."""
    parts = urlsplit(dsn)
    query = f"{parts.query}&application_name={name}" if parts.query else f"application_name={name}"
    return urlunsplit(parts._replace(query=query))


@dataclass
class Cluster:
    """Server processes on one database (see the module docstring)."""

    dsn: str
    tmp: Path
    servers: dict[int, Served] = field(default_factory=dict)
    ports: dict[int, int] = field(default_factory=dict)
    clients: list[Node] = field(default_factory=list)

    def start(self, index: int, *, dsn: str | None = None) -> Served:
        """Start server ``index`` (again on its old port, if it ran before)."""
        where = self.tmp / f"server{index}"
        where.mkdir(parents=True, exist_ok=True)
        flags = ["--postgres", dsn or self.dsn, "--node-name", f"server{index}"]
        if index in self.ports:
            flags += ["--port", str(self.ports[index])]
        served = start_serve(where, *flags)
        self.servers[index] = served
        self.ports[index] = int(urlsplit(served.url).port or 0)
        return served

    def urls(self, first: int) -> list[str]:
        """Every server's URL, starting with server ``first`` (then in turn)."""
        order = sorted(self.ports)
        at = order.index(first)
        return [f"ws://127.0.0.1:{self.ports[i]}" for i in order[at:] + order[:at]]

    async def client(self, first: int, **options: float) -> Node:
        """An ephemeral client node connected to server ``first``, failing over to the rest."""
        node = await Node.open(MemoryStorage(), durable=False)
        self.clients.append(node)
        await mycelia.connect(node, self.urls(first), min_backoff=0.02, max_backoff=0.5, **options)  # type: ignore[arg-type]
        await node.wait_ready(timeout=30)
        return node

    def kill(self, index: int) -> None:
        """kill -9 server ``index``."""
        self.servers.pop(index).stop(signal.SIGKILL)

    async def close(self) -> None:
        for node in self.clients:
            await node.close()
        for served in self.servers.values():
            served.stop()
        self.servers.clear()
