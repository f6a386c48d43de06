"""uvicorn's HTTP protocol (httptools), with a deadline for every request's head.

uvicorn bounds the idle time between two requests of a keep-alive connection
(`timeout_keep_alive`), but not the time before the first request, nor the time a request's
head may take to arrive: a connection that says nothing, or trickles a header byte now and
then, held a file descriptor for good (the router's TCP port shares the process's open-file
limit, `aa.router.security.admission`). Here a connection whose request line and headers are
not all in within `head_deadline` seconds of its start (or of the request's first byte) is
closed. Bodies are not timed: the body cap bounds them, and a slow uploader is not silent.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["HeadDeadlineProtocol", "REQUEST_HEAD_DEADLINE", "with_deadline"]

log = logging.getLogger("aa.http_api")

#: Seconds a connection has to send a request's line and headers (as the router's own port
#: gives a connection to say hello, `aa.router.security.HELLO_DEADLINE`).
REQUEST_HEAD_DEADLINE = 10.0


class HeadDeadlineProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol`, closing connections whose request head does not come in time."""

    head_deadline = REQUEST_HEAD_DEADLINE

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        self._arm()
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.head_deadline, self._too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _too_slow(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            log.debug("closing an HTTP connection from %s: no request head within %g s", self.client, self.head_deadline)
            self.transport.close()


def with_deadline(seconds: float) -> type[HeadDeadlineProtocol]:
    """The protocol class with a deadline of *seconds* (uvicorn takes a class)."""
    return type("HeadDeadlineProtocol", (HeadDeadlineProtocol,), {"head_deadline": seconds})
