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

HTTPS is this protocol's own business, not the listening socket's: a connection is counted
against its address from its first moment, then its TLS handshake is run here (asyncio's TLS
protocol, as `loop.start_tls` uses it) with a deadline of `tls_timeout` seconds. Left to the
server, TLS would run before the protocol sees the connection, so connections that never start
TLS would be neither counted nor closed for a minute. One refused before TLS is just closed: it
would not read an HTTP answer.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from asyncio import sslproto
from collections import Counter
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = [
    "HeadDeadlineProtocol",
    "MAX_CONNECTIONS_PER_ADDRESS",
    "REQUEST_HEAD_DEADLINE",
    "TLS_HANDSHAKE_TIMEOUT",
    "with_deadline",
]

log = logging.getLogger("aa.http_api")

#: Seconds a connection has to send a request's line and headers (as the router's own port
#: gives a connection to say hello, `aa.router.security.HELLO_DEADLINE`).
REQUEST_HEAD_DEADLINE = 10.0
#: HTTP connections one address may hold at once: a quarter of uvicorn's 1,000 in all, so one
#: address (a NAT of many phones, or an attacker) cannot take the port from everybody else.
MAX_CONNECTIONS_PER_ADDRESS = 250
#: Seconds an HTTPS connection has to finish its TLS handshake (a phone on a slow link needs
#: a few round trips; a connection that says nothing is closed).
TLS_HANDSHAKE_TIMEOUT = 10.0


class HeadDeadlineProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol`, closing connections whose request head does not come in time."""

    head_deadline = REQUEST_HEAD_DEADLINE
    per_address = MAX_CONNECTIONS_PER_ADDRESS
    #: Connections held per address (one table per server: `with_deadline` makes the class).
    held: Counter[str] = Counter()
    #: The server's TLS context (None: plain HTTP), and its handshake deadline in seconds.
    tls: ssl.SSLContext | None = None
    tls_timeout = TLS_HANDSHAKE_TIMEOUT
    #: Handshakes under way (the endpoint cancels them when it closes).
    handshakes: set[asyncio.Task[None]] = set()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._address: str | None = None
        self._handshake: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # a stream's: a Transport
        if self.tls is not None and self._handshake is None:
            self._before_tls(transport)
            return
        super().connection_made(transport)
        if self.tls is not None:
            self._arm()  # counted already, before its handshake
            return
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

    def _before_tls(self, raw: asyncio.Transport) -> None:
        """Count the connection, then run its TLS handshake under the deadline."""
        peer = raw.get_extra_info("peername")
        address = str(peer[0]) if peer else None
        if address is not None and self.held[address] >= self.per_address:
            log.debug(
                "refusing an HTTPS connection from %s: %d held already", address, self.per_address
            )
            self._handshake = _DONE
            raw.close()
            return
        if address is not None:
            self._address = address
            self.held[address] += 1
        # TLS goes in place here, synchronously: the transport's protocol becomes TLS's before
        # a byte is read, so a client's hello sent at once can neither reach the HTTP parser
        # nor be lost (`loop.start_tls` swaps it only when its task first runs, and uvloop
        # reads before that). asyncio's own TLS protocol, as start_tls uses it; it calls our
        # `connection_made` with the TLS transport once the handshake is done, before any
        # request byte.
        assert self.tls is not None
        waiter = self.loop.create_future()
        tls = sslproto.SSLProtocol(
            self.loop,
            self,
            self.tls,
            waiter,
            server_side=True,
            call_connection_made=True,
            ssl_handshake_timeout=self.tls_timeout,  # type: ignore[arg-type]  # a float works
        )
        raw.set_protocol(tls)
        tls.connection_made(raw)
        self._handshake = task = self.loop.create_task(self._handshake_done(waiter, raw))
        self.handshakes.add(task)
        task.add_done_callback(self.handshakes.discard)

    async def _handshake_done(self, waiter: asyncio.Future[None], raw: asyncio.Transport) -> None:
        try:
            await waiter
        except BaseException as exc:
            # the TLS protocol closed the connection; our connection_lost is not called for it
            log.debug("closing an HTTPS connection from %s: no TLS (%r)", self._address, exc)
            self._release()
            if not isinstance(exc, Exception):  # cancelled: the endpoint is closing
                raw.abort()
                raise

    def on_message_begin(self) -> None:
        self._arm()
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._release()
        if getattr(self, "transport", None) is None:  # lost before TLS let uvicorn in
            return
        super().connection_lost(exc)

    def _release(self) -> None:
        address, self._address = self._address, None
        if address is not None:
            self.held[address] -= 1
            if self.held[address] <= 0:
                del self.held[address]

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
    seconds: float,
    per_address: int = MAX_CONNECTIONS_PER_ADDRESS,
    *,
    tls: ssl.SSLContext | None = None,
    tls_timeout: float = TLS_HANDSHAKE_TIMEOUT,
) -> type[HeadDeadlineProtocol]:
    """The protocol class of one server: a deadline of *seconds*, *per_address* connections
    at most from one address, HTTPS with *tls* and a handshake deadline of *tls_timeout*
    (uvicorn takes a class; give it no TLS of its own then)."""
    return type(
        "HeadDeadlineProtocol",
        (HeadDeadlineProtocol,),
        {
            "head_deadline": seconds,
            "per_address": per_address,
            "held": Counter(),
            "tls": tls,
            "tls_timeout": tls_timeout,
            "handshakes": set(),
        },
    )


#: The marker of a connection refused before its handshake began.
_DONE: Any = object()
