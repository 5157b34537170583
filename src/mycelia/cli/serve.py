"""``mycelia serve``: a durable node people can deploy.

Start-up, in this order, so that a mistake costs nothing: read the settings (flags, then
environment, then defaults) and the key and certificate files they name; **bind the
port**; only then open (or create) the store, the node and its system. Any failure before
serving is one line and exit 2, and a data directory created by this start-up is removed.

Invariants:

- A non-loopback address with ``--auth open`` refuses to start unless
  ``--insecure-open`` says so: an open server reads and writes everything for anyone.
- ``--auth tokens`` refuses every client without a valid token at the handshake.
- The node key comes from ``--key-file``, ``MYCELIA_NODE_KEY`` or ``--node-name`` (kept in
  PostgreSQL), else from the store (:mod:`mycelia.cli.keys`). On PostgreSQL the key and
  the system are made under the schema's start-up lock, so replicas that start together
  on an empty database agree on one system.
- Readiness is one INFO line on stderr, plus ``listening on URL`` on stdout (for
  scripts: it is the only line written to stdout).
- Once serving, what start-up left alive is frozen out of the garbage collector's reach
  (ARCHITECTURE.md §13, "Garbage collection"): the process is this server's own.
- SIGINT/SIGTERM: ``/healthz`` turns 503 and new connections are refused; after
  ``--shutdown-grace`` seconds (a second signal cuts it short) in-flight requests
  finish, every connection closes and the store closes cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import signal
import ssl

from mycelia import compiled
from mycelia.cli.data import DEFAULT_DATA, open_storage
from mycelia.cli.keys import add_key_flags, given_key, named_key
from mycelia.cli.settings import (
    env_option,
    parse_choice,
    parse_count,
    parse_port,
    parse_seconds,
)
from mycelia.errors import ConfigError
from mycelia.node import Node
from mycelia.node.listen import bind, is_loopback, server_tls
from mycelia.node.server import MAX_CONNECTIONS, Server, serve
from mycelia.node.tokens import TokenAgent, TokenIssuer, load_public_key
from mycelia.storage import StorageEngine

__all__ = ["add_serve_command", "policy_from", "serve_command"]

log = logging.getLogger("mycelia.cli")


def add_serve_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``mycelia serve`` and its flags (each with its environment variable)."""
    cmd = sub.add_parser(
        "serve",
        help="run a durable node that peers reach over websockets",
        description="Run a durable node. It creates its system on first start, logs one "
        "line per peer connect/refusal, answers GET /healthz and GET /metrics on the same "
        "port, and on SIGINT/SIGTERM stops accepting, finishes in-flight commits and "
        "closes its storage cleanly. Every flag can also be set by the environment "
        "variable named in its help; a flag wins over its variable.",
    )
    _store_flags(cmd)
    add_key_flags(cmd)
    _auth_flags(cmd)
    _http_flags(cmd)
    _limit_flags(cmd)
    cmd.set_defaults(run=serve_command)


def _store_flags(cmd: argparse.ArgumentParser) -> None:
    env_option(
        cmd, "--data", env="MYCELIA_DATA", default=DEFAULT_DATA, metavar="DIR",
        help="LMDB data directory, created if missing",
    )  # fmt: skip
    env_option(
        cmd, "--postgres", env="MYCELIA_POSTGRES", default=None, metavar="DSN",
        help="store in PostgreSQL at DSN instead of LMDB (several servers may share one)",
    )  # fmt: skip
    env_option(
        cmd, "--host", env="MYCELIA_HOST", default="127.0.0.1",
        help="address to listen on; any but a loopback address needs --auth tokens "
        "(or --insecure-open)",
    )  # fmt: skip
    env_option(
        cmd, "--port", env="MYCELIA_PORT", default=9797, parse=parse_port,
        help="port to listen on; 0 picks a free one",
    )  # fmt: skip
    env_option(
        cmd, "--drain-timeout", env="MYCELIA_DRAIN_TIMEOUT", default=10.0,
        parse=parse_seconds, metavar="SECONDS",
        help="on shutdown, how long in-flight requests may take to finish",
    )  # fmt: skip
    env_option(
        cmd, "--shutdown-grace", env="MYCELIA_SHUTDOWN_GRACE", default=0.0,
        parse=parse_seconds, metavar="SECONDS",
        help="on SIGTERM, answer /healthz with 503 and refuse new connections for this "
        "long before draining, so a load balancer can stop routing here (a second "
        "signal cuts it short)",
    )  # fmt: skip


def _auth_flags(cmd: argparse.ArgumentParser) -> None:
    env_option(
        cmd, "--auth", env="MYCELIA_AUTH", default="open",
        parse=parse_choice("open", "tokens"), metavar="{open,tokens}",
        help="'open': anyone who reaches the port reads and writes everything; 'tokens': "
        "a client needs a token ('mycelia token issue') and may read and write the "
        "collections it grants",
    )  # fmt: skip
    env_option(
        cmd, "--token-secret-file", env="MYCELIA_TOKEN_SECRET_FILE", default=None,
        metavar="FILE", help="with --auth tokens: the issuer's secret key (PEM), as "
        "'mycelia token keygen' writes it",
    )  # fmt: skip
    env_option(
        cmd, "--token-public-key-file", env="MYCELIA_TOKEN_PUBLIC_KEY_FILE", default=None,
        metavar="FILE", help="with --auth tokens: verify tokens issued elsewhere with this "
        "public key (PEM) instead",
    )  # fmt: skip
    env_option(
        cmd, "--insecure-open", env="MYCELIA_INSECURE_OPEN", default=False, switch=True,
        help="allow --auth open on an address other machines can reach",
    )  # fmt: skip
    env_option(
        cmd, "--tls-cert", env="MYCELIA_TLS_CERT", default=None, metavar="FILE",
        help="PEM certificate chain: serve wss:// (with --tls-key)",
    )  # fmt: skip
    env_option(
        cmd, "--tls-key", env="MYCELIA_TLS_KEY", default=None, metavar="FILE",
        help="PEM private key of --tls-cert",
    )  # fmt: skip


def _http_flags(cmd: argparse.ArgumentParser) -> None:
    env_option(
        cmd, "--health", env="MYCELIA_HEALTH", default="on", parse=parse_choice("on", "off"),
        metavar="{on,off}",
        help="GET /healthz: 200 while serving, 503 while draining; 'off' removes it",
    )  # fmt: skip
    env_option(
        cmd, "--metrics", env="MYCELIA_METRICS", default="on",
        parse=parse_choice("on", "token", "off"), metavar="{on,token,off}",
        help="GET /metrics in the Prometheus text format: 'on', 'token' (a bearer token "
        "with the metrics grant is needed; needs --auth tokens) or 'off'",
    )  # fmt: skip
    env_option(
        cmd, "--deflate", env="MYCELIA_DEFLATE", default=False, switch=True,
        help="offer permessage-deflate compression to clients",
    )  # fmt: skip


def _limit_flags(cmd: argparse.ArgumentParser) -> None:
    env_option(
        cmd, "--max-connections", env="MYCELIA_MAX_CONNECTIONS", default=MAX_CONNECTIONS,
        parse=parse_count, metavar="N",
        help="connections held at once, handshaking or ready; one more is closed with 1013 "
        "(Overloaded)",
    )  # fmt: skip
    env_option(
        cmd, "--max-connections-per-ip", env="MYCELIA_MAX_CONNECTIONS_PER_IP", default=None,
        parse=parse_count, metavar="N",
        help="connections held at once from one address (none: only --max-connections)",
    )  # fmt: skip


def policy_from(args: argparse.Namespace) -> TokenAgent | None:
    """The token agent ``--auth tokens`` asks for (``None``: open). Raises ConfigError."""
    keys = [k for k in (args.token_secret_file, args.token_public_key_file) if k is not None]
    if args.auth == "open":
        if keys:
            raise ConfigError("a token key file was given but --auth is open: add --auth tokens")
        if args.metrics == "token":
            raise ConfigError("--metrics token needs --auth tokens (to verify the token)")
        if not is_loopback(args.host) and not args.insecure_open:
            raise ConfigError(
                f"refusing to serve {args.host} without authentication: anyone who reaches "
                "it could read and write everything; add --auth tokens (or --insecure-open)"
            )
        return None
    if len(keys) != 1:
        raise ConfigError(
            "--auth tokens needs exactly one of --token-secret-file or --token-public-key-file"
        )
    if args.token_secret_file is not None:
        public_key = TokenIssuer.from_secret_file(args.token_secret_file).public_key
    else:
        public_key = load_public_key(args.token_public_key_file)
    return TokenAgent(public_key, require_token=True)


def tls_from(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The TLS context ``--tls-cert``/``--tls-key`` name (``None``: plain ws://)."""
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ConfigError("TLS needs both --tls-cert and --tls-key")
    return None if args.tls_cert is None else server_tls(args.tls_cert, args.tls_key)


async def serve_command(args: argparse.Namespace) -> int:
    """``mycelia serve``: run until SIGINT/SIGTERM (see the module docstring)."""
    signals = _catch_signals()  # from here on a signal means "stop cleanly", never a kill
    key = given_key(args)
    policy = policy_from(args)
    tls = tls_from(args)
    sock = bind(args.host, args.port)
    try:
        opened = await open_storage(args.data, args.postgres, create=True)
    except BaseException:
        sock.close()
        raise
    try:
        async with _start_up_lock(opened.storage):  # replicas starting together: one system
            key = key or await named_key(args, opened.storage)
            node = await Node.open(opened.storage, durable=True, policy=policy, key=key)
            root = await node.create_system()
        server = await serve(
            node,
            sock=sock,
            ssl=tls,
            compression="deflate" if args.deflate else None,
            health=args.health == "on",
            metrics_endpoint=args.metrics != "off",
            metrics_auth=policy.allows_metrics if policy and args.metrics == "token" else None,
            max_connections=args.max_connections,
            max_connections_per_ip=args.max_connections_per_ip,
        )
    except BaseException:
        sock.close()
        await opened.discard()
        raise
    _freeze_start_up()
    _ready(args, server, root=str(root), where=opened.where)
    await _run_until_stopped(server, signals, grace=args.shutdown_grace)
    await server.close(drain_timeout=args.drain_timeout)
    await node.close()
    log.info("stopped cleanly")
    return 0


def _freeze_start_up() -> None:
    """Collect once, then move every object alive (modules, classes, the node's parts) to
    the permanent generation: later full collections no longer walk them (§13)."""
    gc.collect()
    gc.freeze()


def _start_up_lock(storage: StorageEngine) -> contextlib.AbstractAsyncContextManager[None]:
    """A store shared by several servers (PostgreSQL) is locked while one of them creates
    its node key and system; any other store needs no lock."""
    exclusive = getattr(storage, "exclusive", None)
    return contextlib.nullcontext() if exclusive is None else exclusive()


def _ready(args: argparse.Namespace, server: Server, *, root: str, where: str) -> None:
    from mycelia import __version__  # noqa: PLC0415 - the package imports the CLI lazily

    metrics = "/metrics (token)" if args.metrics == "token" else "/metrics"
    endpoints = (("/healthz", args.health == "on"), (metrics, args.metrics != "off"))
    paths = [path for path, on in endpoints if on]
    log.info(
        "mycelia %s serving %s: node %s, system %s, store %s, auth %s, http %s, hot path %s",
        __version__,
        server.url,
        server.node.node_id,
        root,
        where,
        args.auth,
        ", ".join(paths) or "off",
        compiled.form(),
    )
    if not compiled.loaded() and not compiled.asked_pure():
        log.warning("this server runs slower than it could: its hot path is %s", compiled.form())
    print(f"listening on {server.url}", flush=True)


def _catch_signals() -> asyncio.Queue[int]:
    """SIGINT and SIGTERM, queued (they are handled once the server is up)."""
    signals: asyncio.Queue[int] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, signals.put_nowait, sig)
    return signals


async def _run_until_stopped(server: Server, signals: asyncio.Queue[int], *, grace: float) -> None:
    """Wait for a signal, then drain for ``grace`` seconds or until a second one."""
    received = await signals.get()
    log.info("%s: shutting down", signal.Signals(received).name)
    server.start_draining()
    if grace > 0:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await signals.get()
    log.info("finishing in-flight requests")
