"""Discovery against the in-memory LAN (no sockets), interface selection and configuration."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

import aa.mesh.discovery as discovery_module
from aa.mesh import (
    Beacon,
    BroadcastDiscovery,
    Discovery,
    DiscoveryConfig,
    Interface,
    RouterInfo,
    UsageError,
    select_targets,
    selected_addresses,
    selection_from_env,
)
from aa.mesh.testing import FakeLan

PORT = 47474


class Found:
    """Collects what `on_found` reports; tests await conditions on it."""

    def __init__(self) -> None:
        self.items: list[RouterInfo] = []
        self._changed = asyncio.Event()

    def __call__(self, info: RouterInfo) -> None:
        self.items.append(info)
        self._changed.set()

    def ids(self) -> set[str | None]:
        return {i.router_id for i in self.items}

    async def until(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                self._changed.clear()
                await self._changed.wait()


def beacon(router_id: str, host: str = "0.0.0.0") -> Beacon:
    return Beacon(router_id=router_id, name=router_id, peer=f"{host}:7447", client=f"{host}:7448")


async def test_two_routers_on_a_lan_find_each_other() -> None:
    lan = FakeLan()
    found_a, found_b = Found(), Found()
    a = BroadcastDiscovery(
        port=PORT,
        on_found=found_a,
        beacon=beacon("ra"),
        selection=["eth0"],
        network=lan.host("10.0.0.1"),
    )
    b = BroadcastDiscovery(
        port=PORT,
        on_found=found_b,
        beacon=beacon("rb"),
        selection=["eth0"],
        network=lan.host("10.0.0.2"),
    )
    async with a, b:
        await found_a.until(lambda: "rb" in found_a.ids())
        await found_b.until(lambda: "ra" in found_b.ids())
    assert found_a.ids() == {"rb"} and found_b.ids() == {"ra"}  # never ourselves
    info = found_a.items[0]
    assert (info.peer, info.client, info.via) == ("10.0.0.2:7447", "10.0.0.2:7448", "broadcast")
    assert a.addresses == [] and a.targets[0].broadcast == "10.0.0.255"


async def test_beacons_repeat_every_interval() -> None:
    lan = FakeLan()
    found = Found()
    listener = BroadcastDiscovery(
        port=PORT, on_found=found, network=lan.host("10.0.0.1"), selection=["eth0"]
    )
    sender = BroadcastDiscovery(
        port=PORT,
        on_found=Found(),
        beacon=beacon("rb"),
        selection=["eth0"],
        interval=0.01,
        network=lan.host("10.0.0.2"),
    )
    async with listener, sender:
        await found.until(lambda: len(found.items) >= 3)
    assert found.ids() == {"rb"}
    assert all(s.data == lan.sent[0].data for s in lan.sent)  # a client sends nothing


async def test_other_subnet_is_not_heard_unless_configured() -> None:
    lan = FakeLan()
    found_far = Found()
    far = BroadcastDiscovery(
        port=PORT, on_found=found_far, selection=["eth0"], network=lan.host("10.0.1.1")
    )
    near_only = BroadcastDiscovery(
        port=PORT,
        on_found=Found(),
        beacon=beacon("ra"),
        selection=["eth0"],
        network=lan.host("10.0.0.1"),
    )
    reaching = BroadcastDiscovery(
        port=PORT,
        on_found=Found(),
        beacon=beacon("rc"),
        selection=["eth0", "10.0.1.0/24"],
        network=lan.host("10.0.0.3"),
    )
    async with far, near_only, reaching:
        await found_far.until(lambda: "rc" in found_far.ids())
        assert reaching.targets[1].local is False
    assert found_far.ids() == {"rc"}
    assert found_far.items[0].peer == "10.0.0.3:7447"  # the sender's address, filled in


async def test_routers_on_one_host_meet_on_loopback_only() -> None:
    lan = FakeLan()
    host, other = lan.host("10.0.0.1"), lan.host("10.0.0.2")
    f1, f2, f3 = Found(), Found(), Found()
    r1 = BroadcastDiscovery(
        port=PORT, on_found=f1, beacon=beacon("r1"), selection=["lo"], network=host
    )
    r2 = BroadcastDiscovery(
        port=PORT, on_found=f2, beacon=beacon("r2"), selection=["lo"], network=host
    )
    r3 = BroadcastDiscovery(
        port=PORT, on_found=f3, beacon=beacon("r3"), selection=["lo"], network=other
    )
    async with r1, r2, r3:
        await f1.until(lambda: "r2" in f1.ids())
        await f2.until(lambda: "r1" in f2.ids())
        assert r1.addresses == [("127.255.255.255", PORT)]
    assert f1.ids() == {"r2"} and f3.ids() == set()  # loopback stays on its machine
    assert f1.items[0].peer == "127.0.0.1:7447"


async def test_garbage_is_ignored_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    lan = FakeLan()
    found = Found()
    d = BroadcastDiscovery(
        port=PORT, on_found=found, selection=["eth0"], network=lan.host("10.0.0.1")
    )
    with caplog.at_level(logging.WARNING, logger="aa.mesh.discovery"):
        async with d:
            for junk in (b"GET / HTTP/1.0\r\n", b"AaMB\x01\xc1", b"AaMB\x07"):
                lan.inject(junk, to=("10.0.0.255", PORT))
            lan.inject(b"x", to=("10.0.0.255", PORT + 1))  # another port: not ours to see
            other = BroadcastDiscovery(
                port=PORT,
                on_found=Found(),
                beacon=beacon("rb"),
                selection=["eth0"],
                network=lan.host("10.0.0.2"),
            )
            async with other:
                await found.until(lambda: "rb" in found.ids())
    assert d.ignored == 3
    assert found.ids() == {"rb"}
    warnings = [r for r in caplog.records if "not beacons" in r.getMessage()]
    assert len(warnings) == 1  # rate-limited: the first at once, the rest summed up later
    assert "10.0.0.99" in warnings[0].getMessage()


async def test_callback_errors_do_not_stop_discovery(caplog: pytest.LogCaptureFixture) -> None:
    lan = FakeLan()
    found = Found()
    calls = 0

    def flaky(info: RouterInfo) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")
        found(info)

    d = BroadcastDiscovery(
        port=PORT, on_found=flaky, selection=["eth0"], network=lan.host("10.0.0.1")
    )
    s = BroadcastDiscovery(
        port=PORT,
        on_found=Found(),
        beacon=beacon("rb"),
        selection=["eth0"],
        interval=0.01,
        network=lan.host("10.0.0.2"),
    )
    async with d, s:
        await found.until(lambda: bool(found.items))
    assert "on_found callback failed" in caplog.text


async def test_wildcard_socket_where_broadcast_addresses_cannot_be_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(discovery_module, "_BIND_BROADCAST_ADDRESS", False)
    lan = FakeLan()
    found = Found()
    a = BroadcastDiscovery(
        port=PORT, on_found=found, selection=["lo", "eth0"], network=lan.host("10.0.0.1")
    )
    b = BroadcastDiscovery(
        port=PORT,
        on_found=Found(),
        beacon=beacon("rb"),
        selection=["eth0"],
        network=lan.host("10.0.0.2"),
    )
    async with a, b:
        assert a.addresses == [("0.0.0.0", PORT)]  # one socket for both interfaces
        await found.until(lambda: "rb" in found.ids())


async def test_discovery_reports_configured_peers_and_closes() -> None:
    lan = FakeLan()
    host = lan.host("10.0.0.1")
    found = Found()
    config = DiscoveryConfig(interfaces=("eth0",), port=PORT, peers=("10.5.5.5:7447",))
    async with Discovery(config, on_found=found, beacon=beacon("ra"), network=host) as d:
        assert d.addresses == [("10.0.0.255", PORT)]
        assert [(i.peer, i.router_id, i.via) for i in found.items] == [
            ("10.5.5.5:7447", None, "configured")
        ]
        d.announce()
    assert d.addresses == [] and not lan._sockets


async def test_discovery_disabled_still_reports_peers() -> None:
    lan = FakeLan()
    found = Found()
    config = DiscoveryConfig(enabled=False, peers=("10.5.5.5:7447",))
    async with Discovery(config, on_found=found, network=lan.host("10.0.0.1")) as d:
        assert d.broadcast is None and d.zeroconf is None
    assert len(found.items) == 1 and not lan.sent


async def test_discovery_takes_interfaces_from_the_environment() -> None:
    lan = FakeLan()
    config = DiscoveryConfig(port=PORT)
    async with Discovery(
        config,
        on_found=Found(),
        network=lan.host("10.0.0.1"),
        environ={"AA_DISCOVERY_INTERFACES": "lo"},
    ) as d:
        assert d.addresses == [("127.255.255.255", PORT)]
    async with Discovery(config, on_found=Found(), network=lan.host("10.0.0.2"), environ={}) as d:
        assert sorted(d.addresses) == [("10.0.0.255", PORT), ("127.255.255.255", PORT)]  # all


async def test_failed_start_closes_what_was_opened() -> None:
    lan = FakeLan()
    host = lan.host("10.0.0.1")
    real_open = host.open
    opened = 0

    async def open_twice(bind: tuple[str, int], handler: object) -> object:
        nonlocal opened
        opened += 1
        if opened >= 2:
            raise OSError("no more sockets")
        return await real_open(bind, handler)  # type: ignore[arg-type]

    host.open = open_twice  # type: ignore[method-assign]
    d = BroadcastDiscovery(port=PORT, on_found=Found(), selection=["lo", "eth0"], network=host)
    with pytest.raises(OSError):
        await d.start()
    assert not lan._sockets


# -- configuration and interface selection ------------------------------------------------------


def test_config_defaults_and_validation() -> None:
    c = DiscoveryConfig()
    assert (c.enabled, c.port, c.interfaces, c.broadcast, c.zeroconf, c.peers) == (
        True,
        47474,
        None,
        True,
        False,
        (),
    )
    assert DiscoveryConfig(interfaces="lo").interfaces == ("lo",)
    assert DiscoveryConfig(interfaces=["lo", "10.0.0.0/8"], peers=["h:1"]).peers == ("h:1",)
    for bad in (
        {"port": 0},
        {"port": 70000},
        {"port": "1"},
        {"interfaces": ()},
        {"interfaces": ("",)},
        {"interfaces": ("10.0.0.0/33",)},
        {"interfaces": ("10.0.0.1/32",)},
        {"broadcast_interval": 0},
        {"broadcast_interval": True},
        {"peers": ("nohost",)},
        {"zeroconf": 1},
    ):
        with pytest.raises(UsageError):
            DiscoveryConfig(**bad)  # type: ignore[arg-type]


def test_selection_order() -> None:
    env = {"AA_DISCOVERY_INTERFACES": " lo , eth1 ,"}
    assert selection_from_env(env) == ("lo", "eth1")
    assert selection_from_env({"AA_DISCOVERY_INTERFACES": " "}) is None
    assert DiscoveryConfig(interfaces=("eth0",)).selection(env) == ("eth0",)
    assert DiscoveryConfig().selection(env) == ("lo", "eth1")
    assert DiscoveryConfig().selection({}) is None


IFACES = [
    Interface(name="lo", address="127.0.0.1", prefix=8),
    Interface(name="eth0", address="192.168.1.20", prefix=24),
    Interface(name="eth0", address="10.0.0.5", prefix=16),
    Interface(name="tun0", address="10.8.0.2", prefix=32),
]


def test_select_all_skips_links_without_broadcast() -> None:
    got = [(t.broadcast, t.interface) for t in select_targets(None, IFACES)]
    assert got == [("127.255.255.255", "lo"), ("192.168.1.255", "eth0"), ("10.0.255.255", "eth0")]


def test_select_by_name_address_and_subnet(caplog: pytest.LogCaptureFixture) -> None:
    assert [t.broadcast for t in select_targets(["lo"], IFACES)] == ["127.255.255.255"]
    assert [t.broadcast for t in select_targets(["10.0.0.5"], IFACES)] == ["10.0.255.255"]
    targets = select_targets(["192.168.1.0/24", "172.16.4.0/22"], IFACES)
    assert [(t.broadcast, t.local) for t in targets] == [
        ("192.168.1.255", True),
        ("172.16.7.255", False),
    ]
    with caplog.at_level(logging.WARNING):
        assert select_targets(["wlan0", "tun0"], IFACES) == []
    assert "'wlan0' not found" in caplog.text and "no broadcast address" in caplog.text


def test_selected_addresses_for_zeroconf() -> None:
    assert selected_addresses(None, IFACES) is None
    assert selected_addresses(["lo"], IFACES) == ["127.0.0.1"]
    assert selected_addresses(["eth0", "10.0.0.0/8"], IFACES) == [
        "192.168.1.20",
        "10.0.0.5",
        "10.8.0.2",
    ]
    assert Interface(name="x", address="10.0.0.1", prefix=31).broadcast is None


async def test_newcomers_are_answered_at_once_but_rate_limited() -> None:
    lan = FakeLan()
    a = BroadcastDiscovery(
        port=PORT,
        on_found=Found(),
        beacon=beacon("ra"),
        selection=["eth0"],
        network=lan.host("10.0.0.1"),
    )
    async with a:
        from aa.mesh.beacon import encode_beacon

        found = Found()
        a.on_found = found
        for i in range(5):  # five routers start at once
            lan.inject(
                encode_beacon(beacon(f"new{i}")),
                to=("10.0.0.255", PORT),
                source=(f"10.0.0.{10 + i}", PORT),
            )
        await found.until(lambda: len(found.items) == 5)
    from_a = [s for s in lan.sent if s.source[0] == "10.0.0.1"]
    assert len(from_a) == 2  # the first beacon, and one answer for all five newcomers
