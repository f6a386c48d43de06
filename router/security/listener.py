"""The one TCP port with TLS: accept, check the address, sniff, hand over.

Why not `loop.create_server(ssl=...)`: a plaintext client on a TLS port would then only see
the connection drop mid-handshake. Here the first byte is peeked (`MSG_PEEK`, so it stays in
the socket for TLS): a TLS record starts with 0x16; anything else gets one plaintext error
frame in the mesh's own framing — "this router requires TLS" — and the connection closes.
The address is checked against the allow-list before anything is read.

What a stranger can cost (the port is open to strangers): a connection that sends nothing,
or half a handshake, holds one socket for at most `HANDSHAKE_TIMEOUT`; at most
`MAX_PENDING` connections may be unidentified at once, and past it the *oldest* is closed to
make room (counted, `evicted_pending`). An address whose connections keep being refused
(failed or plaintext handshakes, refused hellos) has its new ones closed as they are
accepted until it has earned a refusal back (`RefusalBudget`; counted, `held_back`). Real
clients finish their handshake in milliseconds, so they are never the oldest: stalling them
would take a stranger opening `MAX_PENDING` connections every few milliseconds, and garbage
and stalled handshakes never hold the loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import ssl
import time
from collections.abc import Callable

from aa.mesh import Connection
from aa.mesh.protocol import Error

from .guard import AllowList
from .refusals import RefusalBudget
from .tls import HANDSHAKE_TIMEOUT

__all__ = ["Listener", "MAX_PENDING", "TLS_REQUIRED"]

log = logging.getLogger("aa.router.security")

#: Connections accepted whose first byte or TLS handshake has not come yet; past it the oldest
#: is closed (see the module docstring). Below the usual 1024 open files of a process.
MAX_PENDING = 512
#: The error code a plaintext caller gets on a TLS port.
TLS_REQUIRED = "tls-required"
_TLS_RECORD_HANDSHAKE = 0x16
#: Bytes of a plaintext caller's data read and dropped before it is closed (see
#: `_refuse_plaintext`): enough for a client's first frames, bounded for a flood.
_DRAIN_BYTES = 1024 * 1024


class Listener:
    """Serves *factory* on *sock* (bound and listening) with *tls*; duck-types the parts of
    `asyncio.Server` the router uses (`sockets`, `close`, `wait_closed`)."""

    def __init__(
        self,
        sock: socket.socket,
        factory: Callable[[], asyncio.Protocol],
        *,
        tls: ssl.SSLContext | None,
        allow: Callable[[str], bool] = AllowList().allows,
        counters: dict[str, int] | None = None,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        max_pending: int = MAX_PENDING,
        note: Callable[[str, str, float, int], object] | None = None,
        budget: RefusalBudget | None = None,
    ) -> None:
        self.sockets = [sock]
        self._sock = sock
        self._factory = factory
        self._tls = tls
        self._allow = allow
        self._timeout = handshake_timeout
        self._max_pending = max_pending
        #: How a refusal is logged: ``note(source, message, now, level)``, once per source
        #: per interval with a count (`aa.router.security.gate.RefusalLog`); None: every one.
        self._note = note
        #: Refusals per address (`RefusalBudget`): a spent address's connections are closed
        #: as they are accepted, before a byte is read or a key exchanged.
        self.budget = budget if budget is not None else RefusalBudget()
        self.counters: dict[str, int] = counters if counters is not None else {}
        self._pending: dict[asyncio.Task[None], None] = {}  # oldest first
        self._accepting: asyncio.Task[None] | None = None

    @property
    def pending(self) -> int:
        """Connections accepted and not yet identified (first byte, TLS handshake)."""
        return len(self._pending)

    def start(self) -> None:
        self._sock.setblocking(False)
        self._accepting = asyncio.get_running_loop().create_task(self._accept(), name="aa-accept")

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, addr = await loop.sock_accept(self._sock)
            except asyncio.CancelledError:
                raise
            except OSError as exc:  # EMFILE and friends: back off a moment, keep serving
                log.warning("accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            if not self._allow(addr[0]):
                self._count("refused_address")
                self._log(
                    addr[0], "address", f"refusing {addr[0]}: not in the allowed address ranges"
                )
                conn.close()
                continue
            now = time.monotonic()
            if self.budget.wait(addr[0], now) > 0:  # held back: it must stop to get back in
                self._count("held_back")
                self.budget.hold(addr[0], now)
                self._log(
                    addr[0],
                    "held back",
                    f"holding back {addr[0]}: too many of its connections refused",
                )
                conn.close()
                continue
            if len(self._pending) >= self._max_pending:
                self._count("evicted_pending")
                oldest = next(iter(self._pending))
                del self._pending[oldest]
                oldest.cancel()  # its socket is closed when the cancellation lands
            task = loop.create_task(self._admit(conn, addr[0]))
            self._pending[task] = None
            task.add_done_callback(functools.partial(self._done, conn))

    def _log(self, host: str, kind: str, message: str) -> None:
        if self._note is None:
            log.info("%s", message)
        else:
            self._note(f"{host} ({kind})", message, time.monotonic(), logging.INFO)

    async def _admit(self, conn: socket.socket, host: str) -> None:
        loop = asyncio.get_running_loop()
        conn.setblocking(False)
        try:
            async with asyncio.timeout(self._timeout):
                if self._tls is not None:
                    first = await _peek(loop, conn)
                    if first is None:
                        conn.close()
                        return
                    if first != _TLS_RECORD_HANDSHAKE:
                        self._count("refused_plaintext")
                        self.budget.refused(host, time.monotonic())
                        await _refuse_plaintext(loop, conn)
                        return
                await loop.connect_accepted_socket(
                    self._factory,
                    conn,
                    ssl=self._tls,
                    ssl_handshake_timeout=self._timeout if self._tls else None,
                )
        except (TimeoutError, OSError, ssl.SSLError) as exc:
            # A stalled or failed handshake (a foreign or expired certificate, garbage): only
            # this connection is affected. Logged at info, once per address per interval with
            # a count: strangers must not flood the log.
            self._count("refused_handshake")
            self.budget.refused(host, time.monotonic())
            self._log(
                host, "handshake", f"handshake from {host} failed: {exc or type(exc).__name__}"
            )
            conn.close()
            return
        except asyncio.CancelledError:
            conn.close()
            raise

    def _done(self, conn: socket.socket, task: asyncio.Task[None]) -> None:
        self._pending.pop(task, None)
        if task.cancelled():
            conn.close()  # also when cancelled before it ran; idempotent otherwise

    def close(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            self._accepting = None
        for task in list(self._pending):
            task.cancel()
        self._sock.close()

    async def wait_closed(self) -> None:
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)


async def _readable(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> None:
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(conn.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(conn.fileno())


async def _peek(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> int | None:
    """The first byte the caller sent, left in the socket; None if it closed first."""
    while True:
        try:
            data = conn.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            await _readable(loop, conn)
            continue
        return data[0] if data else None


async def _refuse_plaintext(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> None:
    """Tell a plaintext caller why, in its own framing, then close. What it sent is read and
    dropped first (at most `_DRAIN_BYTES`, within the caller's handshake time): closing a
    socket with unread data resets it, and the reset would discard our answer unread."""
    frame = Connection().send(
        Error(
            code=TLS_REQUIRED,
            fatal=True,
            message="this router accepts TLS only: connect with the mesh's CA certificate "
            "(--ca or AA_CA; and --cert/--key or AA_CERT/AA_KEY to be a user)",
        )
    )
    try:
        conn.send(frame)  # a few hundred bytes into an empty socket buffer: never blocks
        conn.shutdown(socket.SHUT_WR)
        drained = 0
        while drained < _DRAIN_BYTES:
            try:
                data = conn.recv(65536)
            except BlockingIOError:
                await _readable(loop, conn)
                continue
            if not data:
                break
            drained += len(data)
    except OSError:
        pass
    finally:
        conn.close()
