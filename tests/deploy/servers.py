"""Real server processes for the deployment tests: ``mycelia serve`` and uvicorn.

Each process's output is copied line by line to a log file by a reader thread, which
also wakes anyone waiting for a line to appear (an event with a timeout, never a sleep).
Processes start with no ``MYCELIA_*`` variable from the test run's environment unless a
test passes one.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 30.0


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment without MYCELIA_* variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MYCELIA_")}
    return {**env, **(extra or {})}


class Tee:
    """Copies a pipe to a file, line by line; :meth:`wait_for` waits for a pattern."""

    def __init__(self, stream: IO[bytes], path: Path) -> None:
        self.path = path
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._done = False
        self._thread = threading.Thread(target=self._copy, args=(stream,), daemon=True)
        self._thread.start()

    def _copy(self, stream: IO[bytes]) -> None:
        with stream, self.path.open("a", encoding="utf-8") as out:
            for raw in stream:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                out.write(line + "\n")
                out.flush()
                with self._changed:
                    self.lines.append(line)
                    self._changed.notify_all()
        with self._changed:
            self._done = True
            self._changed.notify_all()

    def wait_for(self, pattern: str, timeout: float = START_TIMEOUT) -> re.Match[str]:
        """The first line matching ``pattern``; AssertionError after ``timeout`` or EOF."""
        regex = re.compile(pattern)
        found: list[re.Match[str]] = []

        def seen() -> bool:
            found[:] = [m for m in map(regex.search, self.lines) if m][:1]
            return bool(found) or self._done

        with self._changed:
            self._changed.wait_for(seen, timeout)
        assert found, f"no line matching {pattern!r} in {self.path}:\n" + "\n".join(self.lines)
        return found[0]

    def join(self, timeout: float = 10.0) -> None:
        self._thread.join(timeout)


@dataclass
class Served:
    """A server process: its sync URL, its HTTP base URL and its output."""

    process: subprocess.Popen[bytes]
    url: str
    http: str
    out: Tee
    err: Tee
    extra: dict[str, object] = field(default_factory=dict)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Signal the process and return its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        code = self.process.wait(timeout)
        self.out.join()
        self.err.join()
        return code

    def log(self) -> str:
        """Everything the process wrote to stderr so far."""
        return "\n".join(self.err.lines)


def _spawn(
    argv: list[str], log: Path, *, env: dict[str, str] | None, ready: tuple[str, str]
) -> tuple[subprocess.Popen[bytes], Tee, Tee, str]:
    """Start ``argv`` with its output teed to ``log``.out/.log; wait for the ``ready``
    pattern on (``"out"`` or ``"err"``) and return its first group."""
    process = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env(env)
    )
    assert process.stdout is not None
    assert process.stderr is not None
    out = Tee(process.stdout, log.with_suffix(".out"))
    err = Tee(process.stderr, log.with_suffix(".log"))
    stream, pattern = ready
    try:
        found = (out if stream == "out" else err).wait_for(pattern).group(1)
    except AssertionError:
        process.kill()
        raise AssertionError(f"{argv[2]} did not start:\n" + "\n".join(err.lines)) from None
    return process, out, err, found


def start_serve(tmp: Path, *flags: str, env: dict[str, str] | None = None) -> Served:
    """``mycelia serve --port 0 FLAGS`` (``--data tmp/data`` unless given), once ready."""
    data = [] if "--data" in flags or "--postgres" in flags else ["--data", str(tmp / "data")]
    argv = [sys.executable, "-m", "mycelia.cli", "serve", "--port", "0", *data, *flags]
    process, out, err, url = _spawn(
        argv, tmp / "serve", env=env, ready=("out", r"^listening on (\S+)$")
    )
    http = url.replace("wss://", "https://").replace("ws://", "http://")
    return Served(process, url, http, out, err)


def start_uvicorn(tmp: Path, *, public_key_file: Path) -> Served:
    """uvicorn serving :mod:`tests.deploy.asgi_app` (``/sync`` and ``/hello``), once ready."""
    (tmp / "asgi-data").mkdir()
    argv = [sys.executable, "-m", "uvicorn", "tests.deploy.asgi_app:app", "--port", "0"]
    env = {
        "MYCELIA_DATA": str(tmp / "asgi-data"),
        "MYCELIA_TOKEN_PUBLIC_KEY_FILE": str(public_key_file),
    }
    process, out, err, address = _spawn(
        argv, tmp / "uvicorn", env=env, ready=("err", r"Uvicorn running on http://(\S+) ")
    )
    return Served(process, f"ws://{address}/sync", f"http://{address}", out, err)


def assert_operator_error(done: subprocess.CompletedProcess[str], says: str) -> None:
    """Exit 2 and exactly one line on stderr, saying ``says``; nothing on stdout."""
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert says in lines[0], lines[0]
    assert done.stdout == ""


def run_cli(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    prefix: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """``mycelia ARGS`` to completion (run through ``prefix``), output captured as text."""
    return subprocess.run(
        [*prefix, sys.executable, "-m", "mycelia.cli", *args],
        capture_output=True,
        text=True,
        env=clean_env(env),
        cwd=cwd,
        timeout=60,
        check=False,
    )
