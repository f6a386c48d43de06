"""`HttpEndpoint`: the HTTP API served by uvicorn inside the router's own event loop.

Compose it with a router (the router never imports this package)::

    async with Router(RouterConfig(port=0), endpoints=[HttpEndpoint(port=0)]) as router:
        print(router.endpoints[0].url)      # http://127.0.0.1:<real port>/

Ready means ready: `start()` binds the listening socket itself, hands it to uvicorn, and
returns once uvicorn has started serving on it, so `address` is the real one and a
connection made right after is answered. uvicorn's own signal handling is switched off (the
program that runs the router owns SIGINT/SIGTERM), as are its proxy headers (the address
check must see the real peer) and its logging set-up. HTTP is parsed by httptools (C, a
dependency) rather than h11 (pure Python): a third less of the router's CPU per feed poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

from aa.mesh import UsageError

from .app import create_app
from .guard import Guard, parse_ranges
from .limits import DEFAULT_ALLOW, DEFAULT_HTTP_PORT, MAX_BODY_BYTES
from .protocol import (
    MAX_CONNECTIONS_PER_ADDRESS,
    REQUEST_HEAD_DEADLINE,
    TLS_HANDSHAKE_TIMEOUT,
    with_deadline,
)
from .stream import close_streams

__all__ = ["HttpConfig", "HttpEndpoint"]

log = logging.getLogger("aa.http_api")

#: Seconds between sweeps that forget HTTP clients whose keep-alive lapsed.
_SWEEP_INTERVAL = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpConfig:
    """How the HTTP endpoint runs.

    >>> HttpConfig(port=0).allow
    ('127.0.0.0/8', '::1/128')
    """

    #: Address to listen on. Loopback unless the operator says otherwise.
    host: str = "127.0.0.1"
    #: TCP port; 0 picks a free one (the real one is `HttpEndpoint.address` after start).
    port: int = DEFAULT_HTTP_PORT
    #: CIDR ranges of callers allowed in; others get 403. Loopback only by default.
    allow: tuple[str, ...] = field(default=DEFAULT_ALLOW)
    #: Host names (DNS names or addresses, no port) requests may name in ``Host`` besides
    #: loopback's and `host`; others get 421, so a web page cannot reach the endpoint through
    #: a name of its own that it points at this machine (DNS rebinding).
    names: tuple[str, ...] = ()
    #: Largest request body in bytes; larger ones get 413.
    max_body: int = MAX_BODY_BYTES
    #: Seconds a connection has to send each request's line and headers (`aa.http_api.protocol`).
    request_head_deadline: float = REQUEST_HEAD_DEADLINE
    #: Connections one address may hold at once (past it: 503, closed); 1,000 in all. On
    #: HTTPS, connections still in their TLS handshake count too.
    max_connections_per_address: int = MAX_CONNECTIONS_PER_ADDRESS
    #: Seconds an HTTPS connection has to finish its TLS handshake before it is closed.
    tls_handshake_timeout: float = TLS_HANDSHAKE_TIMEOUT
    #: Seconds a closing endpoint waits for requests in flight.
    shutdown_grace: float = 2.0
    #: HTTPS certificate and key (PEM); None: plain HTTP. `aa router` passes its own.
    cert: Path | None = None
    key: Path | None = None

    def __post_init__(self) -> None:
        if type(self.port) is not int or not 0 <= self.port <= 65535:
            raise UsageError(f"HTTP port must be 0..65535, not {self.port!r}")
        if isinstance(self.allow, str):
            object.__setattr__(self, "allow", (self.allow,))
        object.__setattr__(self, "allow", tuple(self.allow))
        parse_ranges(self.allow)  # raises UsageError for a bad range
        if isinstance(self.names, str):
            object.__setattr__(self, "names", (self.names,))
        object.__setattr__(self, "names", tuple(self.names))
        Guard(_nothing, names=self.names)  # raises UsageError for a bad name
        if not isinstance(
            self.tls_handshake_timeout, (int, float)
        ) or not 0 < self.tls_handshake_timeout < float("inf"):
            raise UsageError("tls_handshake_timeout must be a positive number of seconds")
        if (
            not isinstance(self.request_head_deadline, (int, float))
            or not self.request_head_deadline > 0
        ):
            raise UsageError("request_head_deadline must be a positive number of seconds")
        if (
            type(self.max_connections_per_address) is not int
            or self.max_connections_per_address < 1
        ):
            raise UsageError("max_connections_per_address must be a positive number")
        if type(self.max_body) is not int or self.max_body < 1:
            raise UsageError("max_body must be a positive number of bytes")
        if (self.cert is None) != (self.key is None):
            raise UsageError("give the HTTPS certificate and its key together")


def _tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """The HTTPS server's context: TLS 1.2 or later, the endpoint's certificate. Raises
    `UsageError` for files that cannot be read."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"cannot use HTTPS certificate {cert} with key {key}: {exc}") from None
    return ctx


async def _nothing(scope: Any, receive: Any, send: Any) -> None:
    """An application that is never called (to check a config's names with the Guard's rules)."""


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket. Made with ``IPPROTO_TCP`` named, not 0 as
    `socket.create_server` does: asyncio sets TCP_NODELAY only on sockets that say they are
    TCP, and without it every response written in two parts (headers, body) waits some
    40 ms for the peer's delayed ACK."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(2048)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class _Server(uvicorn.Server):
    """uvicorn, told when it has started, and leaving signals to the program."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.ready.set()


class HttpEndpoint:
    """The router's RESTful endpoint (Å §4.8), an `aa.router.Endpoint`.

    ``HttpEndpoint(host="127.0.0.1", port=8080, allow=("192.168.0.0/16",))``; keyword
    arguments are `HttpConfig`'s. Raises `UsageError` for a bad port or range.
    """

    def __init__(self, config: HttpConfig | None = None, **options: Any) -> None:
        if config is not None and options:
            raise UsageError("pass an HttpConfig or keyword options, not both")
        self.config = config or HttpConfig(**options)
        self.app: Any = None
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._address: tuple[str, int] | None = None
        self._protocol: Any = None

    @property
    def address(self) -> tuple[str, int]:
        """The (host, port) bound; known once `start()` returned."""
        if self._address is None:
            raise UsageError("the HTTP endpoint has not been started")
        return self._address

    @property
    def url(self) -> str:
        host, port = self.address
        scheme = "https" if self.config.cert else "http"
        return f"{scheme}://[{host}]:{port}/" if ":" in host else f"{scheme}://{host}:{port}/"

    async def start(self, router: Any) -> None:
        """Bind, start serving *router*, return once requests are answered. Raises OSError
        when the port is taken."""
        cfg = self.config
        self.app = create_app(
            router, allow=cfg.allow, max_body=cfg.max_body, names=(cfg.host, *cfg.names)
        )
        tls = _tls_context(cfg.cert, cfg.key) if cfg.cert and cfg.key else None
        self._protocol = protocol = with_deadline(
            cfg.request_head_deadline,
            cfg.max_connections_per_address,
            tls=tls,
            tls_timeout=cfg.tls_handshake_timeout,
        )  # httptools, head timed, TLS run by the protocol (`aa.http_api.protocol`)
        sock = _listen(cfg.host, cfg.port)
        server = _Server(
            uvicorn.Config(
                self.app,
                lifespan="off",
                log_config=None,
                log_level="warning",
                access_log=False,
                proxy_headers=False,
                server_header=False,
                ws="none",
                http=protocol,
                timeout_graceful_shutdown=int(cfg.shutdown_grace) or 1,
                # Idle keep-alive connections closed after 5 s; past 1,000 connections new
                # requests get 503 (an fd each: the router's port shares the open-file limit).
                timeout_keep_alive=5,
                limit_concurrency=1_000,
            )
        )
        task = asyncio.create_task(server.serve(sockets=[sock]), name="aa-http")
        ready = asyncio.create_task(server.ready.wait())
        await asyncio.wait([task, ready], return_when=asyncio.FIRST_COMPLETED)
        if not server.ready.is_set():
            ready.cancel()
            sock.close()
            exc = task.exception() if not task.cancelled() else None
            raise OSError(f"the HTTP endpoint did not start: {exc!r}") from exc
        self._server, self._task = server, task
        self._address = sock.getsockname()[:2]
        state = self.app.app.state
        state.closing = asyncio.Event()
        self._sweeper = asyncio.create_task(self._sweep(state), name="aa-http-sweep")
        log.info("HTTP endpoint on %s", self.url)

    async def _sweep(self, state: Any) -> None:
        while True:
            await asyncio.sleep(_SWEEP_INTERVAL)
            try:
                state.clients.expire(state.clock())
            except Exception:
                log.exception("sweeping HTTP clients failed")

    async def aclose(self) -> None:
        """Stop serving: end streams, let requests in flight finish, close. Idempotent."""
        server, task = self._server, self._task
        if server is None or task is None:
            return
        self._server = self._task = None
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        state = self.app.app.state
        state.closing.set()
        close_streams(state)
        for handshake in list(self._protocol.handshakes):
            handshake.cancel()
        server.should_exit = True
        try:
            await task
        except Exception:
            log.exception("the HTTP server failed while closing")
