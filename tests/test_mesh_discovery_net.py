"""Discovery on the machine's real loopback: UDP broadcast to 127.255.255.255, and zeroconf
confined to 127.0.0.1. Nothing here sends anywhere but loopback."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

import pytest

from aa.mesh import (
    Beacon,
    BroadcastDiscovery,
    Discovery,
    DiscoveryConfig,
    RouterInfo,
    ZeroconfDiscovery,
)
from aa.mesh.beacon import encode_beacon


class Found:
    def __init__(self) -> None:
        self.items: list[RouterInfo] = []
        self._changed = asyncio.Event()

    def __call__(self, info: RouterInfo) -> None:
        self.items.append(info)
        self._changed.set()

    def ids(self) -> set[str | None]:
        return {i.router_id for i in self.items}

    async def until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                self._changed.clear()
                await self._changed.wait()


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def beacon(router_id: str) -> Beacon:
    return Beacon(
        router_id=router_id, name=router_id, peer="127.0.0.1:7447", client="127.0.0.1:7448"
    )


async def test_two_routers_find_each_other_by_broadcast_on_lo() -> None:
    port = free_udp_port()
    fa, fb = Found(), Found()
    a = BroadcastDiscovery(port=port, on_found=fa, beacon=beacon("net-a"), selection=["lo"])
    b = BroadcastDiscovery(port=port, on_found=fb, beacon=beacon("net-b"), selection=["lo"])
    async with a, b:
        assert a.addresses == b.addresses == [("127.255.255.255", port)]  # both bound one port
        await fa.until(lambda: "net-b" in fa.ids())
        await fb.until(lambda: "net-a" in fb.ids())
    assert "net-a" not in fa.ids() and "net-b" not in fb.ids()
    assert fa.items[0].peer == "127.0.0.1:7447"


async def test_discovery_on_lo_from_config() -> None:
    port = free_udp_port()
    fa, fb = Found(), Found()
    config = DiscoveryConfig(interfaces=("lo",), port=port, broadcast_interval=0.05)
    async with Discovery(config, on_found=fa, beacon=beacon("cfg-a")) as a:
        async with Discovery(config, on_found=fb) as b:  # a client: listens only
            assert a.addresses == b.addresses == [("127.255.255.255", port)]
            await fb.until(lambda: len([i for i in fb.items if i.router_id == "cfg-a"]) >= 2)
        assert fa.ids() == set()  # the client said nothing


async def test_garbage_datagrams_are_ignored_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    port = free_udp_port()
    found = Found()
    with caplog.at_level(logging.WARNING, logger="aa.mesh.discovery"):
        async with BroadcastDiscovery(port=port, on_found=found, selection=["lo"]) as d:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
                s.bind(("127.0.0.1", 0))
                s.sendto(b"\x00garbage\xff", ("127.255.255.255", port))
                s.sendto(b"AaMB\x01\xc1", ("127.255.255.255", port))
                s.sendto(encode_beacon(beacon("after-junk")), ("127.255.255.255", port))
            await found.until(lambda: "after-junk" in found.ids())
    assert d.ignored == 2  # datagrams arrive in order on loopback
    assert "not beacons" in caplog.text and "127.0.0.1" in caplog.text


async def test_zeroconf_on_loopback_finds_each_other() -> None:
    fa, fb = Found(), Found()
    a = ZeroconfDiscovery(on_found=fa, beacon=beacon("zc-a"), addresses=["127.0.0.1"])
    # The other through the aggregate: `lo` selects 127.0.0.1 for zeroconf.
    config = DiscoveryConfig(interfaces=("lo",), broadcast=False, zeroconf=True)
    b = Discovery(
        config, on_found=fb, beacon=Beacon(router_id="zc-b", name="b", peer="0.0.0.0:7449")
    )
    try:
        await a.start()
    except OSError as exc:  # port 5353 taken without SO_REUSEPORT, or no multicast at all
        pytest.skip(f"zeroconf cannot open its sockets on 127.0.0.1 here: {exc}")
    try:
        async with b:
            assert b.zeroconf is not None and b.zeroconf.addresses == ["127.0.0.1"]
            await fa.until(lambda: "zc-b" in fa.ids(), timeout=20)
            await fb.until(lambda: "zc-a" in fb.ids(), timeout=20)
    finally:
        await a.aclose()
    got_b = next(i for i in fa.items if i.router_id == "zc-b")
    assert (got_b.peer, got_b.client, got_b.via) == ("127.0.0.1:7449", None, "zeroconf")
    got_a = next(i for i in fb.items if i.router_id == "zc-a")
    assert (got_a.peer, got_a.client, got_a.name) == ("127.0.0.1:7447", "127.0.0.1:7448", "zc-a")
    assert "zc-a" not in fa.ids()
