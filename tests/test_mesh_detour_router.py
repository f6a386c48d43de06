"""Round a congested link with real routers: a mesh with two paths from the publisher's router
to the subscriber's; the peer on the normal path stops reading; new events reach the
subscriber the other way, each exactly once, and the normal path is used again once the
buffer drains."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import time

from support import FAST, Collector, mesh, wait_for
from support.waits import next_turn

from aa.mesh import Interest, InterestFilter
from aa.router import MeshConfig, Router

#: Keep-alives slow enough that the peer that stops reading does not call the link dead
#: while the test runs; small congestion bounds, so a few hundred kilobytes fill the buffer.
CONFIG = dataclasses.replace(
    FAST,
    routing="interest",
    keepalive=10.0,
    info_interval=1.0,
    congested_above=64 * 1024,
    congested_below=16 * 1024,
)
HOT = Interest.of([InterestFilter(type="hot")])
PAYLOAD = "x" * 4000


def settled(routers: list[Router], sub: Router) -> bool:
    now = time.monotonic()
    for r in routers:
        table = r.mesh.interests.table
        if not table.settled(now) or not table.view.complete or len(table.view) != len(routers):
            return False
        if table.view.interest(sub.id) != HOT:
            return False
    return True


def shrink(sock: socket.socket | None, option: int) -> None:
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, option, 8192)


async def test_events_go_round_a_peer_that_stops_reading_and_come_back() -> None:
    # publisher p: two paths to the subscriber s, through a and through b.
    async with mesh(4, [(0, 1), (0, 2), (1, 3), (2, 3)], config=CONFIG) as routers:
        p, _, _, s = routers
        got = Collector()
        s.subscribe('type == "hot"', got)
        await wait_for(lambda: settled(routers, s), 10)
        tree = p.mesh.interests.table.view.tree(p.id)
        assert tree is not None
        normal = next(r for r in routers if r.id == tree.parent[s.id])
        other = next(r for r in routers[1:3] if r is not normal)
        out = p.mesh.links[normal.id]
        inbound = normal.mesh.links[p.id]
        assert out.transport is not None and inbound.transport is not None
        shrink(out.transport.get_extra_info("socket"), socket.SO_SNDBUF)
        shrink(inbound.transport.get_extra_info("socket"), socket.SO_RCVBUF)
        inbound.transport.pause_reading()  # the peer on the normal path stops reading

        published: list[str] = []

        def publish() -> str:
            ev = p.publish({"i": len(published), "pad": PAYLOAD}, type="hot")
            assert ev is not None and ev.id is not None
            published.append(ev.id)
            return ev.id

        async with asyncio.timeout(30):
            while not out.congested:
                for _ in range(20):
                    publish()
                await next_turn()
        filling = len(published)
        through_other = other.mesh.counters["events_in"]

        # Congested: new events go round it, and arrive while the peer still reads nothing.
        detoured = [publish() for _ in range(50)]
        await wait_for(lambda: set(detoured) <= set(got.ids), 10)
        assert p.mesh.counters["detoured"] >= 50
        assert other.mesh.counters["events_in"] - through_other >= 50
        assert out.congested

        # The peer reads again: the buffer drains, the link is free, the normal path is back.
        inbound.transport.resume_reading()
        await wait_for(lambda: not out.congested, 10)
        before = p.mesh.counters["detoured"]
        via_normal = normal.mesh.counters["events_in"]
        back = [publish() for _ in range(20)]
        await wait_for(lambda: set(back) <= set(got.ids), 10)
        assert p.mesh.counters["detoured"] == before
        assert normal.mesh.counters["events_in"] - via_normal >= 20

        # Nothing lost, nothing twice: the ones stuck in the buffer came too.
        await wait_for(lambda: len(got.ids) >= len(published), 20)
        assert sorted(got.ids) == sorted(published)
        assert p.mesh.counters["dropped_slow"] == 0
        assert filling > 0


def test_congestion_bounds_are_checked() -> None:
    import pytest

    from aa.mesh import UsageError

    with pytest.raises(UsageError, match="congested_below"):
        MeshConfig(congested_above=1000, congested_below=1000)
    with pytest.raises(UsageError, match="congested_above"):
        MeshConfig(congested_above=-1)
    assert not MeshConfig(congested_above=0).congested_above  # 0: never go round
