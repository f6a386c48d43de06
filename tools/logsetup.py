"""How `aa router` writes its log: plain text for people (the default), or one JSON object per
line for log shippers (`--log-format json`), at a level that a reload may change.

A JSON line holds ``time`` (ISO 8601, UTC), ``level``, ``logger`` and ``message``, then the
fields the call passed with ``extra=`` (``client_id``, ``user``, ``peer``, ``event_id``, ...)
and ``exc`` with the traceback of a logged exception::

    {"time": "2030-01-02T03:04:05.678Z", "level": "WARNING", "logger": "aa.router.session",
     "message": "closing c1 (bad-frame): ...", "client_id": "c1", "peer": "127.0.0.1:50312"}
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

__all__ = ["LOG_FORMATS", "LOG_LEVELS", "JsonFormatter", "setup_logging", "TEXT_FORMAT"]

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"

#: Attributes every `LogRecord` has: whatever else a record carries came with ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (a message's own newlines are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _iso(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name not in _STANDARD and not name.startswith("_") and name not in out:
                out[name] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        return json.dumps(out, ensure_ascii=False, default=str)


def _iso(created: float) -> str:
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


class _AaHandler(logging.StreamHandler[TextIO]):
    """The handler `setup_logging` installs, found again when it is called again."""


def setup_logging(level: str, fmt: str, stream: TextIO | None = None) -> None:
    """Point the root logger at *stream* (stderr) with *fmt* ("text" or "json") at *level*
    ("debug" … "error"); called again (a reload), it changes both in place."""
    root = logging.getLogger()
    handler = next((h for h in root.handlers if isinstance(h, _AaHandler)), None)
    if handler is None:
        handler = _AaHandler(stream or sys.stderr)
        root.addHandler(handler)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root.setLevel(getattr(logging, level.upper()))
