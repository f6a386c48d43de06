"""Opening a connection to one router: the TCP connection, our hello, its welcome.

Which router a client tries (Å §4.1, as routers do): the endpoints given, the alternatives
each router tells about (asked for every `ClientConfig.alternatives_interval`), and — when no
endpoint is given, or `ClientConfig.discover` says so — the routers heard on the network
(beacons, zeroconf). They go into a `PeerTable`: a router that fails, or whose connection
breaks, is poisoned and tried again after exponentially growing intervals, so a client fails
over to a working router first and comes back to a faulty one less and less often.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from aa.mesh import ConnectionLost, ForeignProtocol, RemoteError, parse_endpoint
from aa.mesh.protocol import Error, Hello, Message, Welcome

from .link import Link, open_link

if TYPE_CHECKING:
    from .config import ClientConfig

__all__ = ["open_router", "refusal", "first_of", "Refusals", "NOTHING_LISTENS"]


class Refusals:
    """The routers that refused a client for a reason trying again will not change (`refusal`),
    and why: when all it may try did, `connect` says so at once instead of waiting it out."""

    def __init__(self, impatient: bool = False) -> None:
        self.why: dict[str, str] = {}
        #: A refused connection counts as a refusal for good, until a router is reached
        #: (`ClientConfig.wait_for_routers`).
        self.impatient = impatient
        #: Set while every router the client may try has refused it for good.
        self.everywhere = asyncio.Event()

    def note(self, endpoint: str, failure: BaseException | None, everyone: Sequence[str]) -> None:
        """Note how opening *endpoint* went (*failure*, or None: it worked); *everyone*: the
        routers the client may try (none when it discovers more)."""
        if failure is None:
            self.impatient = False  # once connected, a lost router is waited for
        why = None if failure is None else refusal(failure, self.impatient)
        if why is None:
            self.why.pop(endpoint, None)
        else:
            self.why[endpoint] = why
        if everyone and self.why.keys() >= set(everyone):
            self.everywhere.set()
        else:
            self.everywhere.clear()

    def __str__(self) -> str:
        return "; ".join(f"{e}: {why}" for e, why in self.why.items())


async def first_of(*waits: Coroutine[Any, Any, Any]) -> None:
    """Return when the first of *waits* returns; the others are cancelled."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


#: Why an impatient client gave up on a router (`ClientConfig.wait_for_routers`).
NOTHING_LISTENS = "nothing listens there (connection refused)"


def refusal(exc: BaseException, impatient: bool = False) -> str | None:
    """Why *exc*, a failure to open a router, will not pass by trying again: the router
    refused us and said why (TLS only, no anonymous clients, not from this address...),
    TLS cannot work with it, or its name does not resolve; *impatient*, also nothing
    listening there. None for a failure that may pass (nothing listening, a timeout, a
    router too busy)."""
    if impatient and isinstance(exc, ConnectionRefusedError):
        return NOTHING_LISTENS
    if isinstance(exc, RemoteError):
        return None if exc.code == "busy" else str(exc)
    if (
        isinstance(exc, socket.gaierror)
        or isinstance(exc, ConnectionLost)
        and isinstance(exc.__cause__, (ssl.SSLError, ForeignProtocol))
    ):
        return str(exc) or type(exc).__name__
    return None


async def open_router(
    endpoint: str,
    hello: Hello,
    on_message: Callable[[Message], None],
    on_writable: Callable[[], None],
    config: ClientConfig | None = None,
) -> tuple[Link, Welcome]:
    """Connect to the router at *endpoint*, say *hello*, and return the link and the
    router's welcome once it came; every later frame goes to *on_message*. Raises `OSError`
    (refused, unreachable), `RemoteError` (the router refused us with an error frame),
    `ConnectionLost` (it closed before welcoming us, or TLS failed: `aa.client.link`). With
    *config*'s CA the connection is TLS. The caller bounds the wait."""
    host, port = parse_endpoint(endpoint)
    loop = asyncio.get_running_loop()
    welcome: asyncio.Future[Welcome] = loop.create_future()

    def first_then_rest(link: Link, msg: Message) -> None:
        if not welcome.done():
            if type(msg) is Welcome:
                welcome.set_result(msg)
            elif type(msg) is Error:
                welcome.set_exception(RemoteError(msg.message, code=msg.code))
            return
        on_message(msg)

    link = await open_link(config, lambda: Link(first_then_rest, on_writable), host, port)
    try:
        link.send(hello)
        either: list[asyncio.Future[Any]] = [welcome, link.lost]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not welcome.done():
            why = link.lost.result() if link.lost.done() else None
            if isinstance(why, ForeignProtocol):  # an HTTP port, a TLS router: said at once
                raise ConnectionLost(str(why)) from why
            raise ConnectionLost(f"router {endpoint} closed before welcoming us")
        return link, welcome.result()
    except BaseException:
        link.close()
        raise
