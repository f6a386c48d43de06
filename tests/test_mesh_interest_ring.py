"""Interest routing with real routers on loopback: the ring of six routers, one subscriber
for hot events, a publisher of hot and cold ones; stores still get every persisted event;
a router's death and a new subscription on the far side."""

from __future__ import annotations

import dataclasses
import time

from support import FAST, Collector, mesh, ring, wait_for

from aa.mesh import STORE_INTEREST, Interest, InterestFilter
from aa.router import ExpiryPolicy, Router, RouterConfig, StoreConfig

INTEREST = dataclasses.replace(FAST, routing="interest")
#: For the figures: summaries and keep-alives slow enough that a loaded machine, busy with a
#: burst of publishes, neither forgets a router nor drops a link (either makes routers
#: flood for a while, which is safe but is not the figure).
STEADY = dataclasses.replace(INTEREST, info_interval=1.0, keepalive=1.0)
HOT = Interest.of([InterestFilter(type="hot")])


def converged(routers: list[Router], want: dict[str, Interest]) -> bool:
    """Every router settled on a complete view holding *want* (router id → interest)."""
    now = time.monotonic()
    for r in routers:
        table = r.mesh.interests.table
        if not table.settled(now) or not table.view.complete:
            return False
        if len(table.view) != len(routers):
            return False
        for rid, interest in want.items():
            if table.view.interest(rid) != interest:
                return False
    return True


async def test_the_ring_carries_hot_events_to_their_subscriber_only() -> None:
    async with mesh(6, ring(6), config=STEADY) as routers:
        r1, r2, r3, r4, r5, r6 = routers
        got = Collector()
        r3.subscribe('type == "hot"', got)
        await wait_for(lambda: converged(routers, {r3.id: HOT, r4.id: Interest.NOTHING}), 10)
        before = [r.mesh.counters["events_in"] for r in routers]
        hot = []
        for i in range(2000):
            ev = r1.publish({"i": i}, type="hot")
            assert ev is not None
            hot.append(ev.id)
            r1.publish({"i": i}, type="cold")
        await wait_for(lambda: len(got.ids) >= 2000, 20)
        # A last hot event after all: every cold one that travelled at all came before it.
        last = r1.publish({"last": True}, type="hot")
        await wait_for(lambda: last.id in got.ids, 5)  # type: ignore[union-attr]
        received = [r.mesh.counters["events_in"] - b for r, b in zip(routers, before)]
        assert sorted(got.ids) == sorted([*hot, last.id])  # type: ignore[union-attr]
        assert received[1] == received[2] == 2001  # r2, r3: the hot ones, no cold
        for r, n in zip((r4, r5, r6), received[3:]):
            assert n <= 0.05 * 4001, (r.name, received)
        assert r4.counters["dispatched"] == r5.counters["dispatched"] == 0


async def test_every_store_gets_the_persisted_events(tmp_path) -> None:  # type: ignore[no-untyped-def]
    routers = [
        Router(
            RouterConfig(
                port=0,
                name=f"s{i}",
                mesh=INTEREST,
                data_dir=tmp_path / f"s{i}",
                store=StoreConfig(),
            )
        )
        for i in range(4)
    ]
    try:
        for r in routers:
            await r.start()
        for a, b in ring(4):
            routers[a].mesh.add_peer(routers[b].endpoint)
        store = Interest.of([STORE_INTEREST])
        await wait_for(lambda: converged(routers, {r.id: store for r in routers}), 10)
        kept = [routers[0].publish({"i": i}, type="log", meta={"persist": True}) for i in range(50)]
        routers[0].publish({"x": 1}, type="noise")  # nobody wants it
        ids = sorted(e.id for e in kept)  # type: ignore[union-attr]

        async def stored(r: Router) -> list[str]:
            return sorted(e.id for e in await r.history('type == "log"'))  # type: ignore[misc]

        for r in routers:
            got: list[str] = []

            async def complete(r: Router = r, got: list[str] = got) -> bool:
                got[:] = await stored(r)
                return got == ids

            from support import wait_until

            await wait_until(complete, timeout=10)
        assert all(r.counters["dispatched"] == 50 for r in routers[1:])
    finally:
        for r in reversed(routers):
            await r.aclose()


async def test_a_router_that_dies_loses_no_event_for_the_routers_behind_it() -> None:
    """Ring r1..r6, subscriber on r4 (three hops either way from r1: the tree goes by r2,
    the smaller id). r2 dies while r1 publishes: its neighbours see the link go, flood, and
    the mesh settles on the tree through r6."""
    async with mesh(6, ring(6), config=INTEREST) as routers:
        r1, r2, r3, r4, r5, r6 = routers
        got = Collector()
        r4.subscribe('type == "hot"', got)
        await wait_for(lambda: converged(routers, {r4.id: HOT}), 10)
        sent = [r1.publish({"i": i}, type="hot") for i in range(200)]
        await wait_for(lambda: len(got.ids) >= 200, 10)
        await r2.aclose()
        alive = [r1, r3, r4, r5, r6]
        sent += [r1.publish({"i": i}, type="hot") for i in range(200, 400)]
        await wait_for(lambda: converged(alive, {r4.id: HOT}), 10)
        sent += [r1.publish({"i": i}, type="hot") for i in range(400, 600)]
        await wait_for(lambda: len(got.ids) >= 600, 10)
        assert sorted(got.ids) == sorted(e.id for e in sent)  # type: ignore[union-attr]
        assert r5.mesh.counters["events_in"] >= 200  # the new way


async def test_a_client_cache_is_an_interest_not_anything() -> None:
    """A client cache's pattern is summarised like a subscription's: its events reach every
    router (each holds the cache, for a client that roams), the others reach none."""
    alarm = Interest.of([InterestFilter(type="alarm")])
    async with mesh(5, ring(5), config=STEADY) as routers:
        r1, r2, r3, r4, r5 = routers
        r3.caches.register("phone-7", 'type == "alarm"', ExpiryPolicy(max_count=1000), 60)
        await wait_for(lambda: all("phone-7" in r.caches for r in routers), 5)
        await wait_for(lambda: converged(routers, {r.id: alarm for r in routers}), 10)
        before = [r.mesh.counters["events_in"] for r in routers]
        alarms = []
        for i in range(200):
            ev = r1.publish({"i": i}, type="alarm")
            assert ev is not None
            alarms.append(ev.id)
            r1.publish({"i": i}, type="noise")
        for r in routers:  # the client may come back through any router
            await wait_for(lambda r=r: len(r.caches.fetch("phone-7").events) == 200, 10)
            assert [e.id for e in r.caches.fetch("phone-7").events] == alarms
        received = [r.mesh.counters["events_in"] - b for r, b in zip(routers, before)]
        assert received[1:] == [200] * 4, received  # the alarms, once each, no noise
