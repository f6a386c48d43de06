"""The poll of a feed, ``GET``/``HEAD /clients/{id}/feed``, answered without FastAPI's
routing and parameter machinery.

A phone polls once a second or so and most polls find nothing new, so a poll's cost is
mostly the framework's: matching some thirty routes and validating four parameters through
pydantic takes more CPU than finding and rendering the page. This ASGI layer, in front of the
FastAPI application, recognises the one path, reads its three query parameters by hand
(with the bounds the route declares, and the same 422 answer for a bad one) and calls the
route's own function (`routes_clients.answer_feed`). Everything else, and the OpenAPI
document, stays FastAPI's; errors go to the application's own exception handlers.
"""

from __future__ import annotations

import inspect
import re
from typing import Any
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request

from .guard import Receive, Scope, Send
from .limits import DEFAULT_PAGE, MAX_PAGE
from .routes_clients import FEED_FORMATS, answer_feed
from .web import error

__all__ = ["FeedFastPath"]

_FEED = re.compile(r"/clients/([^/]+)/feed")
_INT = re.compile(r"[0-9]{1,19}")  # what fits a 64-bit cursor; longer is refused, not parsed


class _BadQuery(Exception):
    pass


def _int(
    params: dict[str, str], name: str, default: int | None, low: int, high: int | None
) -> int | None:
    text = params.get(name)
    if text is None:
        return default
    if not _INT.fullmatch(text):
        raise _BadQuery(
            f"{name}: Input should be a valid integer, unable to parse string as an integer"
        )
    value = int(text)
    if value < low:
        raise _BadQuery(f"{name}: Input should be greater than or equal to {low}")
    if high is not None and value > high:
        raise _BadQuery(f"{name}: Input should be less than or equal to {high}")
    return value


class FeedFastPath:
    """ASGI middleware: feed polls straight to `answer_feed` (see the module docstring)."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    @property
    def state(self) -> Any:
        """The application's state (what `HttpEndpoint` reaches for through the layers)."""
        return self.app.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = None
        if scope["type"] == "http" and scope["method"] in ("GET", "HEAD"):
            match = _FEED.fullmatch(scope["path"])
        if match is None:
            await self.app(scope, receive, send)
            return
        scope["app"] = self.app  # what Request.app reads, as FastAPI's router would set it
        request = Request(scope, receive)
        try:
            params = dict(
                parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True)
            )
            fmt = params.get("format")
            if fmt is not None and fmt not in FEED_FORMATS:
                raise _BadQuery("format: Input should be 'atom' or 'json'")
            after = _int(params, "after", None, 0, None)
            limit = _int(params, "limit", DEFAULT_PAGE, 1, MAX_PAGE)
            assert limit is not None
            response: Any = answer_feed(
                request, match.group(1), after=after, limit=limit, format=fmt
            )
        except _BadQuery as exc:
            response = error(422, "invalid-request", str(exc))
        except Exception as exc:
            handler = next(
                (
                    self.app.exception_handlers[c]
                    for c in type(exc).__mro__
                    if c in self.app.exception_handlers
                ),
                None,
            )
            if handler is None:
                raise
            response = handler(request, exc)
            if inspect.isawaitable(response):
                response = await response
        cycle: Any = getattr(send, "__self__", None)  # uvicorn's RequestResponseCycle
        transport = getattr(cycle, "transport", None)
        if transport is None or not hasattr(transport, "write"):  # another server: as it comes
            await response(scope, receive, send)
            return
        cycle.transport = once = _OneWrite(transport)
        try:
            await response(scope, receive, send)
        finally:
            cycle.transport = transport
            once.flush()


class _OneWrite:
    """A transport that gathers what uvicorn writes for one answer and writes it at once.

    uvicorn writes an answer's head and body with two `write` calls, each a `send` system
    call and, on a TCP_NODELAY socket, a packet of its own; on loopback the kernel's work
    for a packet (the receiver's side included) is done in the sender's call, and two such
    writes would be the largest part of a feed poll's CPU under load. Everything else is the
    real transport's; closing flushes first."""

    __slots__ = ("_transport", "_parts")

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> None:
        self._parts.append(data)

    def flush(self) -> None:
        if self._parts:
            data = b"".join(self._parts)
            self._parts.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
