"""Plain HTTP beside the websocket, on the same port: ``/healthz`` and ``/metrics``.

:class:`HttpEndpoints` is sans-I/O: it is given a method, a path and an
``Authorization`` header and returns an :class:`HttpAnswer` (or ``None``: not an HTTP
endpoint, go on with the websocket handshake). The websockets server calls it from
``process_request``; anything else that speaks HTTP can too.

Invariants:

- ``GET /healthz`` answers 200 while the node serves (storage open, accepting) and 503
  while it drains or stops; when health is off it is not an endpoint at all.
- ``GET /metrics`` answers ``prometheus_client``'s text format (never a hand-written
  one). With a ``metrics_auth`` check, it wants ``Authorization: Bearer TOKEN`` and
  answers 401 without one and 403 for a token that does not allow it.
- Every other request is left to the websocket handshake (which answers a plain GET
  with 426 Upgrade Required).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from mycelia.errors import DecodeError
from mycelia.node.metrics import CONTENT_TYPE, Metrics
from mycelia.node.tokens import decode_token

__all__ = ["HEALTH_PATH", "METRICS_PATH", "HttpAnswer", "HttpEndpoints"]

HEALTH_PATH: Final = "/healthz"
METRICS_PATH: Final = "/metrics"
TEXT: Final = "text/plain; charset=utf-8"


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    """A complete HTTP response: status, content type, body, extra headers."""

    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


class HttpEndpoints:
    """Decides the HTTP answers; see the module docstring."""

    def __init__(
        self,
        *,
        serving: Callable[[], bool],
        metrics: Metrics | None,
        health: bool = True,
        metrics_auth: Callable[[bytes], bool] | None = None,
    ) -> None:
        self._serving = serving
        self._metrics = metrics
        self._health = health
        self._metrics_auth = metrics_auth

    @property
    def paths(self) -> tuple[str, ...]:
        """The paths answered here."""
        return tuple(
            path for path, on in ((HEALTH_PATH, self._health), (METRICS_PATH, self._metrics)) if on
        )

    def answer(self, method: str, target: str, authorization: str | None) -> HttpAnswer | None:
        """The answer to ``method target``, or ``None`` if it is not one of ours."""
        path = target.split("?", 1)[0]
        if path not in self.paths:
            return None
        if method not in ("GET", "HEAD"):
            return HttpAnswer(405, TEXT, b"only GET\n", (("Allow", "GET, HEAD"),))
        if path == HEALTH_PATH:
            if self._serving():
                return HttpAnswer(200, TEXT, b"serving\n")
            return HttpAnswer(503, TEXT, b"draining\n", (("Retry-After", "5"),))
        return self._scrape(authorization)

    def _scrape(self, authorization: str | None) -> HttpAnswer:
        assert self._metrics is not None
        if self._metrics_auth is not None:
            scheme, _, credentials = (authorization or "").partition(" ")
            if scheme.lower() != "bearer" or not credentials:
                return HttpAnswer(
                    401,
                    TEXT,
                    b"metrics need 'Authorization: Bearer TOKEN' with the metrics grant\n",
                    (("WWW-Authenticate", 'Bearer realm="mycelia"'),),
                )
            try:
                allowed = self._metrics_auth(decode_token(credentials))
            except DecodeError:
                allowed = False
            if not allowed:
                return HttpAnswer(403, TEXT, b"this token does not grant metrics\n")
        return HttpAnswer(200, CONTENT_TYPE, self._metrics.exposition())
