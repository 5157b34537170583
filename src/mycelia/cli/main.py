"""The ``mycelia`` command line: ``serve``, ``token``, ``inspect``, ``dump``, ``load``.

Every sub-command documents each flag in ``--help``, with the environment variable that
can set it and its default (a flag wins over its variable). Logs go to stderr through
``logging`` (``--log-format json`` for one JSON object a line); data (``dump``, tokens)
goes to stdout or a file.

Exit codes: 0 done; 1 the command failed (a refused token, a damaged dump: the log says
why); 2 an operator's mistake (a bad flag or variable, a port in use, a data directory
that cannot be used, a missing file) — one line, and nothing left behind on disk.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence

from mycelia.cli.data import add_data_commands
from mycelia.cli.logs import configure
from mycelia.cli.serve import add_serve_command
from mycelia.cli.settings import env_option, parse_choice, resolve
from mycelia.cli.token import add_token_command
from mycelia.errors import ConfigError, MyceliaError

__all__ = ["build_parser", "main", "run"]

log = logging.getLogger("mycelia.cli")

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS = ("text", "json")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, with every sub-command and flag documented."""
    from mycelia import __version__  # noqa: PLC0415 - the package imports the CLI lazily

    parser = argparse.ArgumentParser(
        prog="mycelia",
        description="Mycelia: a replicated, event-sourced sync engine.",
    )
    parser.add_argument("--version", action="version", version=f"mycelia {__version__}")
    _log_flags(parser, root=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_serve_command(sub)
    add_token_command(sub)
    add_data_commands(sub)
    for cmd in sub.choices.values():
        _log_flags(cmd, root=False)
    return parser


def _log_flags(parser: argparse.ArgumentParser, *, root: bool) -> None:
    if not root:  # the same flags after the command; the top-level ones stay defaults
        parser.add_argument(
            "--log-level",
            default=argparse.SUPPRESS,
            choices=LEVELS,
            help="how much to log (env MYCELIA_LOG_LEVEL; default: INFO)",
        )
        parser.add_argument(
            "--log-format",
            default=argparse.SUPPRESS,
            choices=FORMATS,
            help="'text' or 'json' logs (env MYCELIA_LOG_FORMAT; default: text)",
        )
        return
    env_option(
        parser, "--log-level", env="MYCELIA_LOG_LEVEL", default="INFO", root=True,
        parse=parse_choice(*LEVELS), help="how much to log to stderr (DEBUG: every commit)",
    )  # fmt: skip
    env_option(
        parser, "--log-format", env="MYCELIA_LOG_FORMAT", default="text", root=True,
        parse=parse_choice(*FORMATS), help="'text' for people, 'json' for log collectors",
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    args = build_parser().parse_args(argv)
    try:
        resolve(args, os.environ)
    except ConfigError as exc:
        configure("INFO", "text")
        log.error("%s", exc)
        return 2
    configure(args.log_level, args.log_format)
    try:
        code: int = asyncio.run(args.run(args))
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    except MyceliaError as exc:
        log.error("%s: %s", type(exc).__name__, exc)
        return 1
    except KeyboardInterrupt:
        return 130
    return code


def run() -> None:
    """Console-script wrapper: exit with :func:`main`'s code."""
    sys.exit(main())
