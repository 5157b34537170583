"""The ``mycelia`` command line: ``serve``, ``inspect``, ``dump``, ``load``.

Every sub-command documents each flag in ``--help``. Logs go to stderr through
``logging``; data (``dump``) goes to stdout or a file.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import IO

from mycelia.cli.files import open_store, store_to_load
from mycelia.errors import ConfigError, MyceliaError
from mycelia.node import Node
from mycelia.node.server import serve
from mycelia.storage import StorageEngine
from mycelia.storage.dump import DumpProgress, dump_to, load_from

__all__ = ["build_parser", "main", "run"]

log = logging.getLogger("mycelia.cli")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, with every sub-command and flag documented."""
    parser = argparse.ArgumentParser(
        prog="mycelia",
        description="Mycelia: a replicated, event-sourced sync engine.",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="how much to log to stderr (default: INFO)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _serve_parser(sub)
    _data_parsers(sub)
    return parser


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve_cmd = sub.add_parser(
        "serve",
        help="run a durable node that peers reach over websockets",
        description="Run a durable node. It creates its system on first start, logs one line "
        "per peer connect/disconnect, and on SIGINT/SIGTERM stops accepting, finishes "
        "in-flight commits and closes its storage cleanly.",
    )
    serve_cmd.add_argument(
        "--data",
        default="./mycelia-data",
        help="LMDB data directory, created if missing (default: ./mycelia-data)",
    )
    serve_cmd.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve_cmd.add_argument(
        "--port", type=int, default=9797, help="port to listen on; 0 picks a free one"
    )
    serve_cmd.add_argument(
        "--postgres",
        metavar="DSN",
        help="store in PostgreSQL at DSN instead of LMDB (several servers may share one)",
    )
    serve_cmd.add_argument(
        "--deflate",
        action="store_true",
        help="offer permessage-deflate compression to clients (off by default)",
    )


def _data_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    inspect_cmd = sub.add_parser(
        "inspect",
        help="print a summary of a data directory",
        description="Print the node id, system root, change-feed offset and entity counts "
        "per collection of a store.",
    )
    _storage_flags(inspect_cmd)
    dump_cmd = sub.add_parser(
        "dump",
        help="write a store's events and states to a portable file",
        description="Stream every entity (events parents first, then its state) to OUT "
        "(stdout when '-'), with a progress line on stderr. Stop 'mycelia serve' first: an "
        "LMDB store is open in one process at a time.",
    )
    _storage_flags(dump_cmd)
    dump_cmd.add_argument("out", nargs="?", default="-", help="output file ('-': stdout)")
    dump_cmd.add_argument(
        "--ephemeral",
        action="store_true",
        help="dump an ephemeral node's cache (state snapshots without their events); such "
        "a dump loads only with 'mycelia load --ephemeral'",
    )
    load_cmd = sub.add_parser(
        "load",
        help="load a portable dump into a store",
        description="Read a dump written by 'mycelia dump' into a store, all or nothing. "
        "Every event id is recomputed from the event's bytes, every state from its events, "
        "every meta record is checked; a store that holds anything takes only a dump of its "
        "own node and system, and a loaded state merges with the stored one (it never "
        "moves back). The store must not be open in a running 'mycelia serve' (LMDB "
        "refuses a second opener).",
    )
    load_cmd.add_argument("file", help="the dump file ('-': stdin)")
    _storage_flags(load_cmd)
    load_cmd.add_argument(
        "--ephemeral",
        action="store_true",
        help="the store is an ephemeral node's cache: accept the snapshots of an "
        "ephemeral dump (a durable store never takes a state without its events)",
    )


def _storage_flags(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("data", nargs="?", default="./mycelia-data", help="LMDB data directory")
    cmd.add_argument("--postgres", metavar="DSN", help="use the PostgreSQL store at DSN instead")


async def open_storage(data: str, postgres: str | None) -> StorageEngine:
    """The engine the flags name, writable (LMDB in ``data``, created if missing, unless
    ``postgres`` is given). Raises ConfigError if ``data`` is a file."""
    return await open_store(data, postgres, readonly=False)


async def serve_command(args: argparse.Namespace) -> int:
    """``mycelia serve``: run until SIGINT/SIGTERM."""
    storage = await open_storage(args.data, args.postgres)
    node = await Node.open(storage, durable=True)
    root = await node.create_system()
    server = await serve(
        node, args.host, args.port, compression="deflate" if args.deflate else None
    )
    where = args.postgres or os.path.abspath(args.data)  # noqa: ASYNC240 - start-up
    log.info(
        "node %s (system %s) serving ws://%s:%d from %s",
        node.node_id,
        root,
        server.host,
        server.port,
        where,
    )
    print(f"listening on ws://{server.host}:{server.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down: finishing in-flight commits")
    await server.close()
    await node.close()
    log.info("stopped cleanly")
    return 0


async def inspect_command(args: argparse.Namespace) -> int:
    """``mycelia inspect``: a summary of a store."""
    from mycelia.node.identity import KEY_META, NodeKey  # noqa: PLC0415
    from mycelia.node.node import ROOT_KEY  # noqa: PLC0415

    storage = await open_store(args.data, args.postgres, readonly=True)
    try:
        key = await storage.get_meta(KEY_META)
        root = await storage.get_meta(ROOT_KEY)
        print(f"node id       {NodeKey.from_private_bytes(key).node_id if key else '(none yet)'}")
        print(f"system root   {root.hex() if root else '(none yet)'}")
        print(f"feed offset   {await storage.last_offset()}")
        counts: dict[str, int] = {}
        offset = 0
        while batch := await storage.read_since(offset, limit=10_000):
            for row in batch:
                counts[row.collection] = counts.get(row.collection, 0)
            offset = batch[-1].offset
        for collection in sorted(counts):
            print(f"collection    {collection}: {len(await storage.scan(collection))} entities")
    finally:
        await storage.close()
    return 0


async def dump_command(args: argparse.Namespace) -> int:
    """``mycelia dump``: stream a store to a file."""
    storage = await open_store(args.data, args.postgres, readonly=True)
    try:
        with _output(args.out) as out:
            done = await dump_to(
                storage, out, progress=_progress("dumped"), ephemeral=args.ephemeral
            )
    finally:
        await storage.close()
    print(f"\ndumped {done.entities} entities, {done.events} events", file=sys.stderr)
    return 0


async def load_command(args: argparse.Namespace) -> int:
    """``mycelia load``: load a dump into a store."""
    async with store_to_load(args.data, args.postgres) as storage:
        with _input(args.file) as source:
            done = await load_from(
                source, storage, progress=_progress("checked"), durable=not args.ephemeral
            )
    print(f"\nloaded {done.entities} entities, {done.events} events", file=sys.stderr)
    return 0


@contextlib.contextmanager
def _output(name: str) -> Iterator[IO[bytes]]:
    if name == "-":
        yield sys.stdout.buffer
    else:
        with open(name, "wb") as f:
            yield f


@contextlib.contextmanager
def _input(name: str) -> Iterator[IO[bytes]]:
    if name == "-":
        yield sys.stdin.buffer
    else:
        with open(name, "rb") as f:
            yield f


def _progress(verb: str) -> Callable[[DumpProgress], None]:
    """A one-line progress bar on stderr (entities, events, bytes)."""

    def report(done: DumpProgress) -> None:
        size = f", {done.size / 1e6:.1f} MB" if done.size else ""
        print(
            f"\r{verb} {done.entities} entities, {done.events} events{size}",
            end="",
            file=sys.stderr,
            flush=True,
        )

    return report


COMMANDS = {
    "serve": serve_command,
    "inspect": inspect_command,
    "dump": dump_command,
    "load": load_command,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return asyncio.run(COMMANDS[args.command](args))
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    except MyceliaError as exc:
        log.error("%s: %s", type(exc).__name__, exc)
        return 1
    except KeyboardInterrupt:
        return 130


def run() -> None:
    """Console-script wrapper: exit with :func:`main`'s code."""
    sys.exit(main())
