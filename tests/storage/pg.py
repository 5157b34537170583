"""A throwaway PostgreSQL for tests and benchmarks (ARCHITECTURE.md §12).

:func:`postgres_dsn` yields a DSN: ``MYCELIA_TEST_DSN`` if set, else a fresh cluster made
with ``initdb``/``pg_ctl`` (from ``/usr/lib/postgresql/*/bin``, newest first, or ``PATH``)
in a temporary directory, listening on 127.0.0.1 only, on a free port, stopped and deleted
on exit. ``initdb`` and ``pg_ctl`` refuse to run as root, so as root they run as the
``postgres`` OS user (``runuser -u postgres --``) on a directory that user owns.

It raises :class:`PostgresUnavailable` naming what is missing; the fixtures turn that into
a skip, or a failure under ``MYCELIA_REQUIRE_POSTGRES=1``. The benchmarks import it too.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["PostgresUnavailable", "find_bindir", "postgres_dsn"]


class PostgresUnavailable(Exception):
    """No PostgreSQL could be found or started; the message says what is missing."""


def find_bindir() -> Path | None:
    """The newest directory holding both ``initdb`` and ``pg_ctl``, if any."""

    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(p) for p in path.parent.name.split(".") if p.isdigit())

    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version, reverse=True)
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for directory in candidates:
        if (directory / "initdb").is_file() and (directory / "pg_ctl").is_file():
            return directory
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class _Cluster:
    """One temporary cluster; ``start`` returns its DSN."""

    def __init__(self, bindir: Path, *, fsync: bool) -> None:
        self.bindir = bindir
        self.fsync = fsync
        self.root = Path(tempfile.mkdtemp(prefix="mycelia-pg-"))
        self.data = self.root / "data"
        self.prefix: list[str] = []
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam("postgres")
            except KeyError as exc:
                raise PostgresUnavailable(
                    "running as root and there is no 'postgres' OS user to run initdb as"
                ) from exc
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self.prefix = ["runuser", "-u", "postgres", "--"]

    def _run(self, *args: str) -> None:
        command = [*self.prefix, *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise PostgresUnavailable(f"{' '.join(command)} failed: {done.stderr or done.stdout}")

    def start(self) -> str:
        self._run(
            str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
            "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync",
        )  # fmt: skip
        for attempt in range(3):  # another process may take the free port before we do
            port = _free_port()
            options = [
                "-c listen_addresses=127.0.0.1", f"-p {port}", f"-k {self.root}",
                "-c max_connections=300", "-c shared_buffers=128MB",
            ]  # fmt: skip
            if not self.fsync:
                options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
            try:
                self._run(
                    str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"),
                    "-w", "-t", "60", "-o", " ".join(options), "start",
                )  # fmt: skip
                break
            except PostgresUnavailable:
                if attempt == 2:
                    raise
        return f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


@contextmanager
def postgres_dsn(*, fsync: bool = False) -> Iterator[str]:
    """A DSN for a PostgreSQL to test against (see the module docstring).

    ``fsync=False`` (tests) turns off the throwaway cluster's syncs; nothing here kills the
    server, so that costs no correctness. Benchmarks pass ``fsync=True``.
    """
    configured = os.environ.get("MYCELIA_TEST_DSN")
    if configured:
        yield configured
        return
    try:
        import psycopg  # noqa: F401, PLC0415 - only to report its absence clearly
    except ImportError as exc:
        raise PostgresUnavailable(
            "psycopg is not installed (pip install 'mycelia[postgres]')"
        ) from exc
    bindir = find_bindir()
    if bindir is None:
        raise PostgresUnavailable(
            "PostgreSQL server binaries (initdb, pg_ctl) not found in /usr/lib/postgresql/*/bin "
            "or on PATH, and MYCELIA_TEST_DSN is not set"
        )
    cluster = _Cluster(bindir, fsync=fsync)
    try:
        dsn = cluster.start()
        yield dsn
    finally:
        cluster.stop()
