"""The datagram transport discovery talks to, and its real UDP implementation.

Discovery needs very little of the network: the machine's interfaces, and sockets that send
and receive datagrams. `DatagramNetwork` is that much, so tests can put an in-memory LAN
(`aa.mesh.testing.FakeLan`) in place of the machine's, and `UdpNetwork` is the real thing.

Broadcasts on Linux, checked on loopback (two sockets, one machine): several sockets, in one
process or several, can bind the same discovery port if each sets SO_REUSEADDR and
SO_REUSEPORT; every one of them then receives each broadcast datagram sent to that port
(SO_REUSEPORT balances only unicast among them). A socket bound to a subnet's broadcast
address (127.255.255.255) or to the wildcard address ('') receives the broadcasts sent to
127.255.255.255, its own included; one bound to 127.0.0.1 does not. All the sockets send from
the same port, so the sender's address does not tell routers apart: beacons carry router ids.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Protocol

from .interfaces import Interface, system_interfaces

__all__ = ["DatagramHandler", "DatagramSocket", "DatagramNetwork", "UdpNetwork"]

log = logging.getLogger(__name__)

#: Called with (data, (host, port) of the sender) for each datagram received.
DatagramHandler = Callable[[bytes, tuple[str, int]], None]


class DatagramSocket(Protocol):
    """An open datagram socket."""

    @property
    def local_address(self) -> tuple[str, int]:
        """The (host, port) it is bound to."""
        ...

    def sendto(self, data: bytes, address: tuple[str, int]) -> None:
        """Send one datagram; errors (an unreachable network) are logged, not raised."""
        ...

    def close(self) -> None: ...


class DatagramNetwork(Protocol):
    """What discovery needs of a network."""

    def interfaces(self) -> list[Interface]:
        """This machine's IPv4 interface addresses."""
        ...

    async def open(self, bind: tuple[str, int], on_datagram: DatagramHandler) -> DatagramSocket:
        """A socket bound to *bind* that may send broadcasts and that shares its port with
        other such sockets (several routers on one machine). Raises `OSError` if it cannot
        bind."""
        ...


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, handler: DatagramHandler) -> None:
        self.handler = handler

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            self.handler(data, (addr[0], addr[1]))
        except Exception:  # one bad handler call must not end the socket
            log.exception("datagram handler failed")

    def error_received(self, exc: Exception) -> None:
        log.debug("datagram socket error: %s", exc)


class UdpSocket:
    """A UDP socket in the running event loop (see `UdpNetwork.open`)."""

    __slots__ = ("_transport",)

    def __init__(self, transport: asyncio.DatagramTransport) -> None:
        self._transport = transport

    @property
    def local_address(self) -> tuple[str, int]:
        host, port = self._transport.get_extra_info("sockname")[:2]
        return host, port

    def sendto(self, data: bytes, address: tuple[str, int]) -> None:
        if self._transport.is_closing():
            return
        self._transport.sendto(data, address)  # OS errors reach _Protocol.error_received

    def close(self) -> None:
        self._transport.close()


class UdpNetwork:
    """The machine's own network."""

    def interfaces(self) -> list[Interface]:
        return system_interfaces()

    async def open(self, bind: tuple[str, int], on_datagram: DatagramHandler) -> UdpSocket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if hasattr(socket, "SO_REUSEPORT"):  # Linux, BSD, macOS; Windows shares with REUSEADDR
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
            sock.setblocking(False)
            sock.bind(bind)
            loop = asyncio.get_running_loop()
            transport, _ = await loop.create_datagram_endpoint(
                lambda: _Protocol(on_datagram), sock=sock
            )
        except BaseException:
            sock.close()
            raise
        return UdpSocket(transport)
