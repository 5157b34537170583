"""A real ``mycelia serve`` process and a raw websocket peer that speaks the protocol by hand.

The raw peer (:class:`RawPeer`) completes the handshake with a :class:`PeerSession` and then
sends whatever frames a test wants, reading the server's frames as they come: what a
hostile client can do. Real clients use ``mycelia.connect``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed as WsClosed

from mycelia.node.identity import NodeKey
from mycelia.node.session import PeerSession, SessionState
from mycelia.node.tokens import TokenIssuer
from mycelia.proto import DEFAULT_LIMITS
from mycelia.proto.messages import Message, decode_frame, encode_frame

TIMEOUT = 20.0


class Served:
    """A ``mycelia serve`` child process (LMDB in ``data``), stopped by :meth:`stop`."""

    def __init__(self, process: asyncio.subprocess.Process, url: str) -> None:
        self.process = process
        self.url = url

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def http(self) -> str:
        return "http" + self.url[2:]

    def rss(self) -> int:
        """The server's resident memory now, in bytes (VmRSS)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")  # pragma: no cover

    def rss_parts(self) -> dict[str, int]:
        """The server's resident memory by kind (RssAnon, RssFile, RssShmem), in bytes."""
        parts = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("Rss"):
                name, value = line.split(":", 1)
                parts[name] = int(value.split()[0]) * 1024
        return parts

    def cpu(self) -> float:
        """The server's CPU time so far, in seconds (user and system)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    async def metric(self, name: str, **labels: str) -> float:
        """One sample of ``/metrics`` (0 when absent)."""
        text = await asyncio.to_thread(_get, f"{self.http}/metrics")
        wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in text.splitlines():
            if line.startswith(f"{name}{{{wanted}}} ") or (
                not labels and line.startswith(name + " ")
            ):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 30)
            except TimeoutError:  # pragma: no cover - a wedged server
                self.process.kill()
                await self.process.wait()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
        body: bytes = response.read()
    return body.decode()


async def start(data: Path, *args: str) -> Served:
    """``mycelia serve --data data --port 0 *args``, once it says it listens."""
    with (data.parent / f"{data.name}.log").open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "mycelia.cli",
            "serve",
            "--data",
            str(data),
            "--port",
            "0",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
        )
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 60)
    assert line.startswith(b"listening on "), line
    return Served(process, line.decode().split()[-1])


def decode_bomb(size: int) -> bytes:
    """A Presence-tagged frame of ``size`` bytes: nested empty arrays, one per byte (what
    cost a server 2 s and 290 MB to decode before issue 16)."""
    inner = b"\xdc" + (400).to_bytes(2, "big") + b"\x90" * 400
    count = size // len(inner)
    return b"\x92\x01\xdc" + count.to_bytes(2, "big") + inner * count


def issuer_file(path: Path) -> TokenIssuer:
    """A token issuer whose secret is written to ``path`` (for ``--token-secret-file``)."""
    issuer = TokenIssuer()
    issuer.write_secret_file(path)
    return issuer


class RawPeer:
    """A websocket to the server, driven by hand (see the module docstring)."""

    def __init__(self, ws: ClientConnection, session: PeerSession) -> None:
        self.ws = ws
        self.session = session

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        token: bytes | None = None,
        key: NodeKey | None = None,
        handshake: bool = True,
        max_queue: int | None = 16,
    ) -> RawPeer:
        ws = await connect(url, max_size=None, compression=None, max_queue=max_queue)
        session = PeerSession(
            key=key or NodeKey.generate(),
            durable=False,
            system_root=None,
            limits=DEFAULT_LIMITS,
            token=token,
        )
        peer = cls(ws, session)
        if handshake:
            await peer.handshake()
        return peer

    async def handshake(self) -> None:
        for frame in self.session.start():
            await self.ws.send(frame)
        async with asyncio.timeout(TIMEOUT):
            while self.session.state is not SessionState.READY:
                self.session.receive(await self.ws.recv())  # type: ignore[arg-type]
                for frame in self.session.take_outgoing():
                    await self.ws.send(frame)

    def rid(self) -> int:
        return self.session.next_request_id()

    async def send(self, msg: Message) -> None:
        await self.ws.send(encode_frame(msg))

    async def recv(self, timeout: float = TIMEOUT) -> Message:
        async with asyncio.timeout(timeout):
            return decode_frame(await self.ws.recv())  # type: ignore[arg-type]

    async def until(
        self, done: Callable[[Message], bool], timeout: float = TIMEOUT
    ) -> list[Message]:
        """Every frame up to and including the first ``done`` accepts."""
        seen: list[Message] = []
        deadline = time.monotonic() + timeout
        while True:
            seen.append(await self.recv(max(0.01, deadline - time.monotonic())))
            if done(seen[-1]):
                return seen

    async def closed(self, timeout: float = TIMEOUT) -> tuple[int | None, str]:
        """Wait for the server to close; its close code and reason."""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    await self.ws.recv()
        except WsClosed as exc:
            received = exc.rcvd
            return (None, "") if received is None else (received.code, received.reason)

    async def close(self) -> None:
        await self.ws.close()
