"""Finding routers: UDP broadcast beacons, zeroconf, and well-known endpoints.

Å §4.1: "Discovery takes place by broadcasting UDP packets on available or predefined network
subnets and by attempting to connect to well-known router endpoints if they are defined."
Routers announce themselves and listen; clients only listen (they pass no beacon). Whatever is
found is reported through one callback, `on_found(RouterInfo)`; the owner puts it in its
`PeerTable` and dials it. Reports repeat with every beacon heard, so the callback must be cheap
and idempotent.

    >>> async def main():                                       # doctest: +SKIP
    ...     config = DiscoveryConfig(interfaces=("lo",), port=47474)
    ...     me = Beacon(router_id="r1", name="lab", peer="127.0.0.1:7447")
    ...     async with Discovery(config, beacon=me, on_found=print) as d:
    ...         print(d.addresses)                              # bound and beaconing
    ...         await asyncio.sleep(60)

Sockets go through a `DatagramNetwork` (`UdpNetwork` by default) so that tests can use the
in-memory `aa.mesh.testing.FakeLan`. Zeroconf always uses the machine's network.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Final

from .beacon import Beacon, RouterInfo, decode_beacon, encode_beacon
from .datagram import DatagramNetwork, DatagramSocket, UdpNetwork
from .endpoints import check_endpoint
from .errors import MalformedFrame, UsageError
from .interfaces import (
    ENV_INTERFACES,
    BroadcastTarget,
    check_selection,
    select_targets,
    selected_addresses,
    selection_from_env,
)
from .mdns import ZeroconfDiscovery

__all__ = [
    "DiscoveryConfig",
    "Discovery",
    "BroadcastDiscovery",
    "ZeroconfDiscovery",
    "OnFound",
    "DISCOVERY_PORT",
    "BROADCAST_INTERVAL",
]

log = logging.getLogger(__name__)

#: UDP port of the beacons. Every router and client of a mesh must use the same one, so it is
#: fixed in advance (tests override it). Unassigned by IANA.
DISCOVERY_PORT: Final = 47474
#: Seconds between two beacons of one router: a new router is found within this time, and a
#: LAN carries one ~100-byte datagram per router per interval.
BROADCAST_INTERVAL: Final = 10.0
#: Shortest gap between two beacons sent out of turn, in seconds. A router answers a router it
#: has not heard before with a beacon at once, so a newcomer learns the mesh in a round trip
#: instead of an interval; the gap bounds those answers when many routers start together.
REPLY_MIN_GAP: Final = 1.0
#: Router ids remembered as heard (to answer only newcomers), in ids.
MAX_HEARD_IDS: Final = 1024
#: Seconds between two warnings about datagrams that are not beacons (the first is at once):
#: a noisy neighbour on the port must not flood the log.
GARBAGE_LOG_INTERVAL: Final = 60.0

#: The callback that receives each router found.
OnFound = Callable[[RouterInfo], None]

# Linux lets a socket bind a subnet's broadcast address, and such a socket hears only the
# broadcasts of that subnet: discovery then listens exactly on the selected interfaces. Other
# systems refuse or ignore that; there one wildcard socket serves all interfaces.
_BIND_BROADCAST_ADDRESS: Final = sys.platform.startswith("linux")


@dataclass(frozen=True, slots=True, kw_only=True)
class DiscoveryConfig:
    """How a router (or client) finds routers.

    >>> DiscoveryConfig(interfaces=("lo",), port=50000).port
    50000
    """

    #: Look for routers on the network at all (broadcast and zeroconf). The well-known `peers`
    #: are reported even when this is off.
    enabled: bool = True
    #: UDP port of the beacons, the same across the mesh.
    port: int = DISCOVERY_PORT
    #: Where to broadcast and listen: interface names ("lo", "eth0"), IPv4 addresses of this
    #: machine, or subnets ("10.1.2.0/24", broadcast to from afar). None means the items in
    #: the environment variable `AA_DISCOVERY_INTERFACES`, or else every interface.
    interfaces: tuple[str, ...] | None = None
    #: Send and hear UDP broadcast beacons.
    broadcast: bool = True
    #: Seconds between two beacons.
    broadcast_interval: float = BROADCAST_INTERVAL
    #: Also announce and browse with zeroconf (mDNS, `_aa-router._tcp.local.`) on the selected
    #: interfaces. Off by default: it costs a socket on port 5353 and mDNS traffic, and
    #: broadcasts find the same routers; turn it on where broadcasts are filtered.
    zeroconf: bool = False
    #: Well-known router endpoints ("host:port") to dial whatever discovery finds.
    peers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("enabled", "broadcast", "zeroconf"):
            if type(getattr(self, name)) is not bool:
                raise UsageError(f"{name} must be True or False")
        if type(self.port) is not int or not 0 < self.port < 65536:
            raise UsageError(f"port must be 1 to 65535, not {self.port!r}")
        if self.interfaces is not None:
            items = (
                (self.interfaces,) if isinstance(self.interfaces, str) else tuple(self.interfaces)
            )
            if not items or any(type(i) is not str or not i.strip() for i in items):
                raise UsageError("interfaces must be None or non-empty names, addresses or subnets")
            object.__setattr__(self, "interfaces", items)
            check_selection(items)  # InvalidValue (a UsageError) for a malformed subnet
        if isinstance(self.broadcast_interval, bool) or not isinstance(
            self.broadcast_interval, (int, float)
        ):
            raise UsageError("broadcast_interval must be a number of seconds")
        if not 0 < self.broadcast_interval <= 3600:
            raise UsageError("broadcast_interval must be in (0, 3600] seconds")
        peers = (self.peers,) if isinstance(self.peers, str) else tuple(self.peers)
        for p in peers:
            check_endpoint(p, "peers")
        object.__setattr__(self, "peers", peers)

    def selection(self, environ: Mapping[str, str] | None = None) -> tuple[str, ...] | None:
        """The interface selection in force: `interfaces`, else the environment's, else None."""
        if self.interfaces is not None:
            return self.interfaces
        return selection_from_env(os.environ if environ is None else environ)


def broadcast_line(targets: Sequence[BroadcastTarget], *, chosen: bool) -> str:
    """The line a router logs once at start: where its beacons go. A router whose
    interfaces nobody chose broadcasts on every one, which its operator should know."""
    where = ", ".join(
        f"{t.interface} ({t.broadcast})" if t.interface else f"{t.broadcast} (a remote subnet)"
        for t in targets
    )
    if not chosen:
        return (
            f"discovery: beacons on every interface: {where or 'none'}; choose with "
            f"--discovery-interfaces or ${ENV_INTERFACES} (lo: this machine only)"
        )
    return f"discovery: beacons on {where or 'no interface'}"


class BroadcastDiscovery:
    """Beacons sent to the broadcast address of each target every `interval` seconds, and
    beacons heard from other routers reported to `on_found` (our own are ignored)."""

    def __init__(
        self,
        *,
        port: int,
        on_found: OnFound,
        beacon: Beacon | None = None,
        selection: Sequence[str] | None = None,
        interval: float = BROADCAST_INTERVAL,
        network: DatagramNetwork | None = None,
    ) -> None:
        self.port = port
        self.on_found = on_found
        self.beacon = beacon
        self.selection = selection
        self.interval = interval
        self.network: DatagramNetwork = network if network is not None else UdpNetwork()
        self.targets: list[BroadcastTarget] = []
        #: Datagrams received that were not beacons we understand.
        self.ignored = 0
        self._payload = encode_beacon(beacon) if beacon is not None else b""
        self._sockets: list[DatagramSocket] = []
        self._send_via: list[tuple[DatagramSocket, str]] = []
        self._task: asyncio.Task[None] | None = None
        self._last_garbage_log: float | None = None
        self._garbage_since_log = 0
        self._heard: OrderedDict[str, None] = OrderedDict()
        self._last_reply: float | None = None

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """The (host, port) of every bound socket."""
        return [s.local_address for s in self._sockets]

    async def start(self) -> None:
        """Bind the sockets, send a first beacon, and keep beaconing. Raises `OSError` when a
        socket cannot be bound (nothing is left open then)."""
        self.targets = select_targets(self.selection, self.network.interfaces())
        if not self.targets:
            log.warning("broadcast discovery: no interface selected has a broadcast address")
        try:
            await self._open_sockets()
        except BaseException:
            self._close_sockets()
            raise
        self.announce()
        if self.beacon is not None:
            log.info("%s", broadcast_line(self.targets, chosen=self.selection is not None))
            self._task = asyncio.get_running_loop().create_task(
                self._beacon_loop(), name="aa-beacons"
            )

    async def _open_sockets(self) -> None:
        wildcard: DatagramSocket | None = None
        sender: DatagramSocket | None = None
        for t in self.targets:
            if t.local:
                sock: DatagramSocket | None = None
                if _BIND_BROADCAST_ADDRESS:
                    try:
                        sock = await self.network.open((t.broadcast, self.port), self._on_datagram)
                    except OSError as exc:
                        log.debug(
                            "cannot bind %s:%d (%s): using the wildcard address",
                            t.broadcast,
                            self.port,
                            exc,
                        )
                if sock is None:
                    if wildcard is None:
                        wildcard = await self.network.open(("", self.port), self._on_datagram)
                    sock = wildcard
                if sock not in self._sockets:
                    self._sockets.append(sock)
            else:
                # A subnet we are not on: nothing to hear there, only beacons to send.
                if sender is None:
                    sender = await self.network.open(("", 0), self._on_datagram)
                    self._sockets.append(sender)
                sock = sender
            self._send_via.append((sock, t.broadcast))

    def announce(self) -> None:
        """Send our beacon to every target now (no-op for a listener without a beacon)."""
        if not self._payload:
            return
        for sock, broadcast in self._send_via:
            sock.sendto(self._payload, (broadcast, self.port))

    async def _beacon_loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.announce()

    def _on_datagram(self, data: bytes, sender: tuple[str, int]) -> None:
        try:
            beacon = decode_beacon(data)
        except MalformedFrame as exc:
            self._garbage(sender, exc)
            return
        if self.beacon is not None and beacon.router_id == self.beacon.router_id:
            return  # our own beacon, looped back
        try:
            info = RouterInfo.from_beacon(beacon, sender_host=sender[0], via="broadcast")
        except UsageError as exc:
            self._garbage(sender, exc)
            return
        if beacon.router_id in self._heard:
            self._heard.move_to_end(beacon.router_id)
        else:
            self._heard[beacon.router_id] = None
            if len(self._heard) > MAX_HEARD_IDS:
                self._heard.popitem(last=False)
            self._answer_newcomer()
        try:
            self.on_found(info)
        except Exception:
            log.exception("discovery on_found callback failed")

    def _answer_newcomer(self) -> None:
        now = time.monotonic()
        if self._last_reply is None or now - self._last_reply >= REPLY_MIN_GAP:
            self._last_reply = now
            self.announce()

    def _garbage(self, sender: tuple[str, int], reason: Exception) -> None:
        self.ignored += 1
        self._garbage_since_log += 1
        now = time.monotonic()
        if self._last_garbage_log is None or now - self._last_garbage_log >= GARBAGE_LOG_INTERVAL:
            log.warning(
                "discovery: ignored %d datagram(s) on port %d that are not beacons; last from "
                "%s:%d: %s",
                self._garbage_since_log,
                self.port,
                sender[0],
                sender[1],
                reason,
            )
            self._last_garbage_log = now
            self._garbage_since_log = 0

    def _close_sockets(self) -> None:
        for s in self._sockets:
            s.close()
        self._sockets.clear()
        self._send_via.clear()

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._close_sockets()

    async def __aenter__(self) -> BroadcastDiscovery:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class Discovery:
    """Every discovery mechanism the config enables, reporting to one `on_found` callback.

    Pass a `beacon` to announce this router; leave it out to only listen (clients).
    Configured `peers` are reported once, at start, with `via="configured"`.
    """

    def __init__(
        self,
        config: DiscoveryConfig,
        *,
        on_found: OnFound,
        beacon: Beacon | None = None,
        network: DatagramNetwork | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self.on_found = on_found
        self.beacon = beacon
        self.network: DatagramNetwork = network if network is not None else UdpNetwork()
        self.environ = environ
        self.broadcast: BroadcastDiscovery | None = None
        self.zeroconf: ZeroconfDiscovery | None = None

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """The (host, port) of every bound broadcast socket."""
        return self.broadcast.addresses if self.broadcast is not None else []

    async def start(self) -> None:
        """Start each enabled mechanism; returns once their sockets are bound. Raises
        `OSError` if a socket cannot be bound (what was started is closed again)."""
        config = self.config
        selection = config.selection(self.environ)
        try:
            if config.enabled and config.broadcast:
                self.broadcast = BroadcastDiscovery(
                    port=config.port,
                    on_found=self.on_found,
                    beacon=self.beacon,
                    selection=selection,
                    interval=config.broadcast_interval,
                    network=self.network,
                )
                await self.broadcast.start()
            if config.enabled and config.zeroconf:
                self.zeroconf = ZeroconfDiscovery(
                    on_found=self.on_found,
                    beacon=self.beacon,
                    addresses=selected_addresses(selection, self.network.interfaces()),
                )
                await self.zeroconf.start()
        except BaseException:
            await self.aclose()
            raise
        for peer in config.peers:
            try:
                self.on_found(RouterInfo(peer=peer, via="configured"))
            except Exception:
                log.exception("discovery on_found callback failed")

    def announce(self) -> None:
        """Send a beacon now, out of turn (e.g. when the router's endpoints changed)."""
        if self.broadcast is not None:
            self.broadcast.announce()

    async def aclose(self) -> None:
        zc, self.zeroconf = self.zeroconf, None
        bc, self.broadcast = self.broadcast, None
        try:
            if zc is not None:
                await zc.aclose()
        finally:
            if bc is not None:
                await bc.aclose()

    async def __aenter__(self) -> Discovery:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
