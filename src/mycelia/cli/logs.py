"""Logging for the command line: text for people, JSON lines for log collectors.

Invariants: every record is one line on stderr (a traceback, when there is one, is folded
into the JSON object or follows the text line as logging prints it); JSON records carry
the context the server attaches (``peer``, ``address``, ``subject``, ``reason``) as
fields. The websockets library's own INFO lines (one per listening socket, one per close)
are left out below DEBUG: the server logs one readiness line of its own.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Final

__all__ = ["CONTEXT", "JsonFormatter", "configure"]

CONTEXT: Final = ("peer", "address", "subject", "reason")
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time``, ``level``, ``logger``, ``message``, context."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        item: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in CONTEXT:
            value = record.__dict__.get(key)
            if value is not None:
                item[key] = value
        if record.exc_info:
            item["exception"] = self.formatException(record.exc_info)
        return json.dumps(item, ensure_ascii=False)


def configure(level: str, fmt: str) -> None:
    """Send every log record at ``level`` or above to stderr, as ``text`` or ``json``.

    Like ``logging.basicConfig``, it leaves a process whose root logger already has
    handlers (an application, a test harness running ``main()``) as it is.
    """
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("websockets").setLevel(level if level == "DEBUG" else "WARNING")
