"""Test helpers: an in-memory LAN that implements `aa.mesh.datagram.DatagramNetwork`.

No sockets. Each `FakeHost` has a private loopback (127.0.0.1/8) and the addresses it was given
on the LAN. Datagrams follow Linux's rules, as `aa.mesh.datagram` describes them:

- a datagram to a subnet's broadcast address reaches every socket bound to that broadcast
  address or to the wildcard address ('') on that port, on every host on that subnet (the
  sender's host included); loopback broadcasts (127.255.255.255) stay on the sending host;
- a datagram to a unicast address reaches one socket bound to that address or to '';
- any number of sockets may share a port (SO_REUSEADDR and SO_REUSEPORT are assumed);
- the source is the sender's address on the network used, and its socket's port;
- delivery is asynchronous (`loop.call_soon`), as from a real socket.

>>> lan = FakeLan()
>>> a, b = lan.host("10.0.0.1"), lan.host("10.0.0.2")
>>> [i.broadcast for i in a.interfaces()]
['127.255.255.255', '10.0.0.255']
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import itertools
from dataclasses import dataclass

from .datagram import DatagramHandler
from .interfaces import Interface

__all__ = ["FakeLan", "FakeHost", "FakeSocket", "SentDatagram"]


@dataclass(frozen=True, slots=True)
class SentDatagram:
    source: tuple[str, int]
    destination: tuple[str, int]
    data: bytes


class FakeSocket:
    """A socket on a `FakeHost` (implements `aa.mesh.datagram.DatagramSocket`)."""

    def __init__(self, host: FakeHost, bind: tuple[str, int], handler: DatagramHandler) -> None:
        self.host = host
        self.bind = bind
        self.handler = handler
        self.closed = False

    @property
    def local_address(self) -> tuple[str, int]:
        return self.bind

    def sendto(self, data: bytes, address: tuple[str, int]) -> None:
        if not self.closed:
            self.host.lan.carry(self, bytes(data), address)

    def close(self) -> None:
        self.closed = True
        self.host.lan.unplug(self)


class FakeHost:
    """One machine on a `FakeLan` (implements `aa.mesh.datagram.DatagramNetwork`)."""

    def __init__(self, lan: FakeLan, name: str, interfaces: list[Interface]) -> None:
        self.lan = lan
        self.name = name
        self._interfaces = interfaces
        self._ports = itertools.count(40000)

    def interfaces(self) -> list[Interface]:
        return list(self._interfaces)

    def owns(self, address: str) -> bool:
        return any(i.address == address for i in self._interfaces)

    async def open(self, bind: tuple[str, int], on_datagram: DatagramHandler) -> FakeSocket:
        host, port = bind
        if (
            host not in ("", "0.0.0.0")
            and not self.owns(host)
            and not any(i.broadcast == host for i in self._interfaces)
        ):
            raise OSError(errno.EADDRNOTAVAIL, f"cannot assign requested address {host}")
        if port == 0:
            port = next(self._ports)
        sock = FakeSocket(self, ("0.0.0.0" if host == "" else host, port), on_datagram)
        self.lan.plug(sock)
        return sock


class FakeLan:
    """An in-memory LAN. `sent` records every datagram sent, in order."""

    def __init__(self) -> None:
        self.hosts: list[FakeHost] = []
        self.sent: list[SentDatagram] = []
        self._sockets: set[FakeSocket] = set()

    def host(self, *addresses: str, prefix: int = 24, name: str | None = None) -> FakeHost:
        """A new host with a loopback interface and *addresses* (each /prefix) on "eth0"..."""
        interfaces = [Interface(name="lo", address="127.0.0.1", prefix=8)]
        interfaces += [
            Interface(name=f"eth{n}", address=a, prefix=prefix) for n, a in enumerate(addresses)
        ]
        h = FakeHost(self, name or f"host{len(self.hosts)}", interfaces)
        self.hosts.append(h)
        return h

    def inject(
        self, data: bytes, *, to: tuple[str, int], source: tuple[str, int] = ("10.0.0.99", 9999)
    ) -> None:
        """Deliver *data* as if a host outside our control sent it (garbage, foreign beacons)."""
        self.sent.append(SentDatagram(source, to, data))
        for sock in self._receivers(None, to):
            self._deliver(sock, data, source)

    def plug(self, sock: FakeSocket) -> None:
        """*sock* is bound on a host of this LAN."""
        self._sockets.add(sock)

    def unplug(self, sock: FakeSocket) -> None:
        """*sock* was closed."""
        self._sockets.discard(sock)

    def carry(self, sender: FakeSocket, data: bytes, to: tuple[str, int]) -> None:
        source = (self._source_address(sender.host, to[0]), sender.bind[1])
        self.sent.append(SentDatagram(source, to, data))
        for sock in self._receivers(sender.host, to):
            self._deliver(sock, data, source)

    def _source_address(self, host: FakeHost, dst: str) -> str:
        for i in host.interfaces():
            if i.broadcast == dst or i.address == dst or _in_subnet(dst, i):
                return i.address
        lan = [i for i in host.interfaces() if i.name != "lo"]
        return lan[0].address if lan else "127.0.0.1"

    def _receivers(self, sender: FakeHost | None, to: tuple[str, int]) -> list[FakeSocket]:
        dst, port = to
        loopback = dst.startswith("127.")
        out: list[FakeSocket] = []
        for sock in sorted(self._sockets, key=id):
            if sock.bind[1] != port or sock.closed:
                continue
            if loopback and sock.host is not sender:
                continue  # each host's loopback is its own
            bound = sock.bind[0]
            if bound != dst and bound != "0.0.0.0":
                continue
            ifaces = sock.host.interfaces()
            if any(i.broadcast == dst for i in ifaces):
                out.append(sock)  # broadcast: every socket on that subnet
            elif sock.host.owns(dst) and not any(s.host is sock.host for s in out):
                out.append(sock)  # unicast: one socket of the host that owns the address
        return out

    @staticmethod
    def _deliver(sock: FakeSocket, data: bytes, source: tuple[str, int]) -> None:
        def deliver() -> None:
            if not sock.closed:
                sock.handler(data, source)

        asyncio.get_running_loop().call_soon(deliver)


def _in_subnet(address: str, interface: Interface) -> bool:
    try:
        net = ipaddress.IPv4Network(f"{interface.address}/{interface.prefix}", strict=False)
        return ipaddress.IPv4Address(address) in net
    except ValueError:
        return False
