"""Entry point of the ``mycelia`` command (``[project.scripts]``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, with every sub-command and flag documented."""
    parser = argparse.ArgumentParser(
        prog="mycelia",
        description="Mycelia: a replicated, event-sourced sync engine.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser("serve", help="run a durable node that peers accept over websockets")
    serve.add_argument("--data", default="./mycelia-data", help="LMDB data directory")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=9797, help="port to listen on (0: any free)")
    serve.add_argument("--postgres", metavar="DSN", help="store in PostgreSQL instead of LMDB")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        print(
            "mycelia serve: the node and its websocket server are not built yet "
            f"(would serve {args.data} on {args.host}:{args.port}); see README status.",
            file=sys.stderr,
        )
        return 2
    return 1  # pragma: no cover - argparse rejects unknown commands


def run() -> None:
    """Console-script wrapper: exit with :func:`main`'s code."""
    sys.exit(main())
