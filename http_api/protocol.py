"""uvicorn's HTTP protocol (httptools), with a deadline for every request's head.

uvicorn bounds the idle time between two requests of a keep-alive connection
(`timeout_keep_alive`), but not the time before the first request, nor the time a request's
head may take to arrive: a connection that says nothing, or trickles a header byte now and
then, held a file descriptor for good (the router's TCP port shares the process's open-file
limit, `aa.router.security.admission`). Here a connection whose request line and headers are
not all in within `head_deadline` seconds of its start (or of the request's first byte) is
closed. Bodies are not timed: the body cap bounds them, and a slow uploader is not silent.

And a cap per address: uvicorn holds at most 1,000 connections in all (past it, 503s), so one
address could take them all and leave every phone with 503s. A connection from an address
that holds `per_address` already gets a 503 saying so, and is closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = [
    "HeadDeadlineProtocol",
    "MAX_CONNECTIONS_PER_ADDRESS",
    "REQUEST_HEAD_DEADLINE",
    "with_deadline",
]

log = logging.getLogger("aa.http_api")

#: Seconds a connection has to send a request's line and headers (as the router's own port
#: gives a connection to say hello, `aa.router.security.HELLO_DEADLINE`).
REQUEST_HEAD_DEADLINE = 10.0
#: HTTP connections one address may hold at once: a quarter of uvicorn's 1,000 in all, so one
#: address (a NAT of many phones, or an attacker) cannot take the port from everybody else.
MAX_CONNECTIONS_PER_ADDRESS = 250


class HeadDeadlineProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol`, closing connections whose request head does not come in time."""

    head_deadline = REQUEST_HEAD_DEADLINE
    per_address = MAX_CONNECTIONS_PER_ADDRESS
    #: Connections held per address (one table per server: `with_deadline` makes the class).
    held: Counter[str] = Counter()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._address: str | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        address = str(self.client[0]) if self.client else None
        if address is not None and self.held[address] >= self.per_address:
            log.debug(
                "refusing an HTTP connection from %s: %d held already", address, self.per_address
            )
            body = (
                f"{self.per_address} connections from {address} already, the limit per address\n"
            ).encode()
            transport.write(
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
                b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
            )
            transport.close()
            return
        if address is not None:
            self._address = address
            self.held[address] += 1
        self._arm()

    def on_message_begin(self) -> None:
        self._arm()
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        address, self._address = self._address, None
        if address is not None:
            self.held[address] -= 1
            if self.held[address] <= 0:
                del self.held[address]
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
            log.debug(
                "closing an HTTP connection from %s: no request head within %g s",
                self.client,
                self.head_deadline,
            )
            self.transport.close()


def with_deadline(
    seconds: float, per_address: int = MAX_CONNECTIONS_PER_ADDRESS
) -> type[HeadDeadlineProtocol]:
    """The protocol class of one server: a deadline of *seconds*, *per_address* connections
    at most from one address (uvicorn takes a class)."""
    return type(
        "HeadDeadlineProtocol",
        (HeadDeadlineProtocol,),
        {"head_deadline": seconds, "per_address": per_address, "held": Counter()},
    )
