"""Routers in a mesh, in one process, on loopback: flooding in lines, rings, full meshes and
random graphs; controls; mesh info; duplicate links; poison back-off; bad peers; discovery
and topology persistence. Intervals are shortened (`meshlab.FAST`); nothing sleeps."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from pathlib import Path

import pytest
from support import (
    FAST,
    Collector,
    free_udp_port,
    full,
    line,
    lo_discovery,
    mesh,
    random_graph,
    ring,
    routing_by_interest,
    wait_for,
    wait_shape,
)

from aa.client import AsyncClient, ClientConfig
from aa.mesh import (
    AaTimeout,
    Beacon,
    Connection,
    Control,
    DiscoveryConfig,
    Event,
    PeerHello,
    PeerState,
)
from aa.mesh.beacon import encode_beacon
from aa.router import MeshConfig, Router, RouterConfig

TOPOLOGIES = {
    "line-5": (5, line(5)),
    "ring-6": (6, ring(6)),
    "full-4": (4, full(4)),
    "random-8-a": (8, random_graph(8, extra=4, seed=1)),
    "random-8-b": (8, random_graph(8, extra=6, seed=2)),
    "random-10-c": (10, random_graph(10, extra=8, seed=3)),
}


@pytest.mark.parametrize("name", list(TOPOLOGIES))
async def test_each_router_dispatches_each_event_once(name: str) -> None:
    n, edges = TOPOLOGIES[name]
    async with mesh(n, edges) as routers:
        got = [Collector() for _ in routers]
        for r, c in zip(routers, got):
            r.subscribe("True", c)
        # Publish from every router at once, interleaved: floods cross and race each other.
        published = []
        for k in range(60):
            for r in routers:
                ev = r.publish({"k": k, "from": r.name})
                assert ev is not None
                published.append(ev.id)
        total = len(published)
        await wait_for(lambda: all(len(c.ids) >= total for c in got), timeout=10)
        for r, c in zip(routers, got):
            assert sorted(c.ids) == sorted(published), r.name  # every event, once
            assert r.counters["dispatched"] == total
        # Copies beyond the first were dropped unread: what came in is what was kept plus
        # what was dropped, and no copy went back the way it came (at most 2·E copies).
        copies = sum(r.mesh.counters["events_in"] for r in routers)
        dropped = sum(r.mesh.counters["duplicates"] for r in routers)
        assert copies - dropped == total * (n - 1)
        assert copies <= total * 2 * len(edges)


async def test_line_carries_each_event_once_per_link() -> None:
    async with mesh(4, line(4)) as routers:
        c = Collector()
        routers[3].subscribe("True", c)
        for i in range(100):
            routers[0].publish({"i": i})
        await wait_for(lambda: len(c.ids) == 100)
        assert [r.mesh.counters["duplicates"] for r in routers] == [0, 0, 0, 0]
        assert [r.mesh.counters["events_in"] for r in routers] == [0, 100, 100, 100]
        ev = await _next(routers[3], "i == 7", lambda: routers[0].publish({"i": 7}))
        assert ev.meta["path"] == [r.id for r in routers] and ev.meta["ttl"] == FAST.ttl - 3


async def _next(router: Router, pattern: str, publish) -> Event:  # type: ignore[no-untyped-def]
    sub = router.subscribe(pattern)
    publish()
    async with asyncio.timeout(5):
        ev = await sub.get()
    sub.close()
    return ev


async def test_ttl_bounds_the_flood() -> None:
    async with mesh(
        4, line(4), config=MeshConfig(ttl=2, retry_base=0.05, keepalive=0.3)
    ) as routers:
        c2, c3 = Collector(), Collector()
        routers[2].subscribe("True", c2)
        routers[3].subscribe("True", c3)
        routers[0].publish({"x": 1})
        marker = routers[3].publish({"marker": True})  # reaches r2 by the other way
        assert marker is not None
        await wait_for(lambda: marker.id in c2.ids)
        assert len(c2.ids) == 2 and c3.ids == [marker.id]  # two hops: r1, r2; not r3


async def test_clients_across_the_mesh_exactly_once() -> None:
    async with (
        mesh(5, ring(5)) as routers,
        AsyncClient(routers[0].endpoint) as pub,
        AsyncClient(routers[2].endpoint) as sub_client,
    ):
        got: list[int] = []
        await sub_client.subscribe("i >= 0", lambda ev: got.append(ev.values["i"]))
        for i in range(3000):
            pub.publish_nowait({"i": i})
        await pub.flush(timeout=10)
        await wait_for(lambda: len(got) >= 3000, timeout=10)
        done = await pub.publish({"i": -1, "last": True})
        await wait_for(lambda: routers[2].counters["dispatched"] == 3001)
        assert sorted(got) == list(range(3000)) and done


async def test_the_same_id_from_two_publishers_is_two_events_mesh_wide() -> None:
    """An id is a duplicate only of the same publisher's (its id scope, `aa.mesh.id_scope`):
    another client proposing the same id publishes an event of its own. (A publisher's own
    retry through another router is a duplicate: tests/test_session_ids.py.)"""
    async with mesh(3, line(3)) as routers:
        c = Collector()
        routers[2].subscribe("True", c)
        async with AsyncClient(routers[0].endpoint) as a, AsyncClient(routers[2].endpoint) as b:
            await a.publish({"v": 1}, id="fixed-id-1")
            await a.flush(5)
            await wait_for(lambda: len(c.ids) == 1)
            await b.publish({"v": 1}, id="fixed-id-1")
            await b.flush(5)
            await wait_for(lambda: len(c.ids) == 2)
        first, second = c.ids
        assert first != second and first.endswith("-fixed-id-1") and second.endswith("-fixed-id-1")
        assert routers[2].counters["duplicates"] == 0
        assert [r.counters["dispatched"] for r in routers] == [2, 2, 2]


async def test_controls_flood_once_to_every_other_router() -> None:
    async with mesh(6, random_graph(6, extra=4, seed=7)) as routers:
        seen: dict[str, list[Control]] = {r.id: [] for r in routers}
        for r in routers:
            r.mesh.on_control("test.ping", seen[r.id].append)
        cancel = routers[1].mesh.on_control("test.ping", lambda c: seen[routers[1].id].append(c))
        cancel()  # undone: only the first callback of r1 remains
        cid = routers[0].mesh.flood_control("test.ping", {"n": 1}, to="client-42")
        await wait_for(lambda: all(len(seen[r.id]) == 1 for r in routers[1:]))
        assert seen[routers[0].id] == []  # not to ourselves
        for r in routers[1:]:
            c = seen[r.id][0]
            assert (c.id, c.topic, c.body, c.to, c.path[0]) == (
                cid,
                "test.ping",
                {"n": 1},
                "client-42",
                routers[0].id,
            )


async def test_mesh_info_describes_every_router() -> None:
    async with mesh(4, line(4)) as routers:
        for i in range(10):
            routers[0].publish({"i": i})

        def complete() -> bool:
            info = routers[3].mesh_info()
            return len(info["routers"]) == 4 and all(
                r["counters"]["dispatched"] == 10 for r in info["routers"]
            )

        await wait_for(complete)
        info = routers[3].mesh_info()
        assert info["router"] == routers[3].id
        by_id = {r["id"]: r for r in info["routers"]}
        assert [by_id[r.id]["name"] for r in routers] == ["r0", "r1", "r2", "r3"]
        assert {p["id"] for p in by_id[routers[1].id]["peers"]} == {routers[0].id, routers[2].id}
        assert by_id[routers[2].id]["counters"]["events_in"] == 10
        assert by_id[routers[3].id]["age"] == 0.0
        async with AsyncClient(routers[1].endpoint) as c:
            answer = await c.mesh_info(timeout=5)
        assert {r["id"] for r in answer["routers"]} == {r.id for r in routers}


async def test_mesh_info_says_whether_the_answering_router_routes_by_interest() -> None:
    """A new mesh floods while its routers' views settle; once they have, each router says
    so in its own entry of `aa mesh` (what a benchmark waits for before it measures)."""
    async with mesh(3, line(3)) as routers:

        def own(r: Router) -> dict[str, object]:
            return r.mesh_info()["routers"][0]["routing"]  # type: ignore[no-any-return]

        await wait_for(lambda: all(own(r)["settled"] for r in routers))
        await wait_for(lambda: routing_by_interest(routers))
        async with AsyncClient(routers[1].endpoint) as c:
            answer = await c.mesh_info(timeout=5)
        assert answer["routers"][0]["routing"] == {
            "routing": "interest",
            "settled": True,
            "complete": True,
            "awaited": 0,
            "routers": 3,
        }
        assert all("routing" not in r for r in answer["routers"][1:])  # not flooded
        routers[2].subscribe("x > 1", lambda e: None)  # news: every view unsettles
        await wait_for(lambda: not own(routers[0])["settled"])


async def test_routers_tell_clients_their_alternatives() -> None:
    async with mesh(3, line(3)) as routers:
        await wait_for(
            lambda: set(routers[0].alternatives()) == {routers[1].endpoint, routers[2].endpoint}
        )
        async with AsyncClient(routers[0].endpoint) as c:
            assert set(c.known_routers) == {r.endpoint for r in routers}


async def test_routers_that_dial_each_other_keep_one_link() -> None:
    async with mesh(2) as (a, b):
        a.mesh.add_peer(b.endpoint)
        b.mesh.add_peer(a.endpoint)
        # Settled: one link each, known by the other's id (while the two dials cross, one may
        # be counted before its handshake names the peer).
        await wait_for(
            lambda: (
                len(a.mesh._all_links) == len(b.mesh._all_links) == 1
                and set(a.mesh.links) == {b.id}
                and set(b.mesh.links) == {a.id}
            )
        )
        la, lb = a.mesh.links[b.id], b.mesh.links[a.id]
        assert la.outgoing != lb.outgoing and (la.outgoing == (a.id < b.id))
        c = Collector()
        b.subscribe("True", c)
        for i in range(50):
            a.publish({"i": i})
        await wait_for(lambda: len(c.ids) == 50)
        assert b.mesh.counters["duplicates"] == 0


async def test_a_failing_peer_is_tried_less_and_less_often(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A "router" that accepts and hangs up at once: as faulty as one that refuses.
    accepted: list[float] = []
    server = await _hang_up_server(accepted)
    host, port = server.sockets[0].getsockname()[:2]
    bad = f"{host}:{port}"
    config = MeshConfig(retry_base=0.05, retry_max=10.0, retry_jitter=0.0, keepalive=0.3)
    try:
        with caplog.at_level(logging.INFO, logger="aa.router.links"):
            async with Router(RouterConfig(port=0, peers=(bad,), mesh=config)) as r:
                await wait_for(lambda: len(accepted) >= 5, timeout=10)
                entry = r.mesh.table.get(bad)
                assert entry is not None and entry.state in (
                    PeerState.POISONED,
                    PeerState.CONNECTING,
                )
                assert entry.failures >= 4
                info = r.mesh_info()["routers"][0]
                await wait_for(
                    lambda: any(
                        p["address"] == bad for p in r.mesh_info()["routers"][0]["poisoned"]
                    )
                )
                assert r.peer_count() == 0 and info["id"] == r.id
    finally:
        server.close()
        await server.wait_closed()
    # The k-th wait is at least 0.05 s · 2**k (a loaded machine only adds to it).
    gaps = [b - a for a, b in zip(accepted, accepted[1:])]
    assert all(gap >= 0.05 * 2**k for k, gap in enumerate(gaps)), gaps
    assert f"peer {bad} unavailable" in caplog.text and "next attempt in" in caplog.text


def _frame(conn: Connection, msg: object) -> bytes:
    return conn.send(msg)  # type: ignore[arg-type]


async def test_a_peer_that_speaks_nonsense_is_closed_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with mesh(2, line(2)) as (a, b):
        c = Collector()
        b.subscribe("True", c)
        host, port = a.address
        with caplog.at_level(logging.INFO):
            # 1. a proper hello, then bytes that are no frame
            reader, writer = await asyncio.open_connection(host, port)
            conn = Connection()
            writer.write(_frame(conn, PeerHello(router_id="liar", name="liar", peer="127.0.0.1:9")))
            writer.write(b"\x00\x00\x00\x05\xc1\xc1\xc1\xc1\xc1")
            assert await _read_until_closed(reader)
            writer.close()
            # 2. a router that starts with something other than a hello
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"\x00\x00\x00\x03\x93\x01\x02")  # a msgpack array, not a map
            assert await _read_until_closed(reader)
            writer.close()
            # 3. a flood whose event lacks an id
            reader, writer = await asyncio.open_connection(host, port)
            conn = Connection()
            writer.write(_frame(conn, PeerHello(router_id="liar2", peer="127.0.0.1:9")))
            from aa.mesh.protocol import pack

            payload = pack(
                {"kind": "flood", "events": [[None, None, {"x": 1}, {"ttl": 3, "path": ["liar2"]}]]}
            )
            writer.write(len(payload).to_bytes(4, "big") + payload)
            assert await _read_until_closed(reader)
            writer.close()
        assert "sent a bad frame" in caplog.text
        assert a.mesh.counters["peer_errors"] == 2
        assert "liar" not in a.mesh.links and "liar2" not in a.mesh.links
        # The mesh is unharmed.
        ev = a.publish({"after": True})
        assert ev is not None
        await wait_for(lambda: c.ids == [ev.id])


async def _read_until_closed(reader: asyncio.StreamReader) -> bool:
    async with asyncio.timeout(5):
        while await reader.read(65536):
            pass
    return True


async def test_broadcast_discovery_forms_a_full_mesh_on_lo() -> None:
    port = free_udp_port()
    async with mesh(3, discovery=lo_discovery(port)) as routers:
        await wait_shape(routers, full(3))
        c = Collector()
        routers[2].subscribe("True", c)
        ev = routers[0].publish({"hello": "mesh"})
        assert ev is not None
        await wait_for(lambda: c.ids == [ev.id])


async def test_garbage_on_the_discovery_port_is_ignored_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_udp_port()
    with caplog.at_level(logging.WARNING, logger="aa.mesh.discovery"):
        async with mesh(2, discovery=lo_discovery(port, broadcast_interval=0.2)) as routers:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
                s.bind(("127.0.0.1", 0))
                s.sendto(b"\xffnot a beacon at all", ("127.255.255.255", port))
                s.sendto(b"AaMB\x09future format", ("127.255.255.255", port))
                # A beacon of a router that is not there: tried, poisoned, no harm done.
                ghost = Beacon(router_id="ghost", peer=f"127.0.0.1:{_closed_port()}")
                s.sendto(encode_beacon(ghost), ("127.255.255.255", port))
            await wait_shape(routers, full(2))
            d = routers[0].mesh.discovery
            assert d is not None and d.broadcast is not None
            await wait_for(lambda: d.broadcast.ignored >= 2)  # type: ignore[union-attr]
            await wait_for(
                lambda: any(e.router_id == "ghost" and e.failures for e in routers[0].mesh.table)
            )
    assert "not beacons" in caplog.text


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_zeroconf_forms_a_mesh_on_lo() -> None:
    config = lo_discovery(free_udp_port(), broadcast=False, zeroconf=True)
    try:
        ctx = mesh(2, discovery=config)
        routers = await ctx.__aenter__()
    except OSError as exc:  # port 5353 taken without SO_REUSEPORT, or no multicast at all
        pytest.skip(f"zeroconf cannot open its sockets on 127.0.0.1 here: {exc}")
    try:
        await wait_shape(routers, full(2), timeout=20)
        # A client finds them the same way (browsing only: it announces nothing).
        listen = DiscoveryConfig(interfaces=("lo",), broadcast=False, zeroconf=True)
        async with AsyncClient(config=ClientConfig(discovery=listen)) as c:
            assert c.router is not None and c.router[2] in {r.endpoint for r in routers}
    finally:
        await ctx.__aexit__(None, None, None)


async def test_topology_is_persisted_and_a_restarted_router_rejoins_without_discovery(
    tmp_path: Path,
) -> None:
    async with mesh(2, line(2)) as (b, c):
        data = tmp_path / "a"
        a = Router(RouterConfig(port=0, name="a", data_dir=data, peers=(b.endpoint,), mesh=FAST))
        async with a:
            await wait_for(
                lambda: b.id in a.mesh.links and c.endpoint in [e.address for e in a.mesh.table]
            )
            # Saved soon after the link came up, while running (a crash would keep it).
            path = data / "topology.json"
            await wait_for(lambda: path.exists() and b.endpoint in path.read_text(), timeout=5)
        saved = json.loads(path.read_text())
        assert {r["address"] for r in saved["routers"]} >= {b.endpoint}
        # Restarted with nothing configured and no discovery: the file is all it has.
        again = Router(RouterConfig(port=0, name="a2", data_dir=data, mesh=FAST))
        async with again:
            await wait_for(lambda: b.id in again.mesh.links, timeout=5)
            got = Collector()
            c.subscribe("True", got)
            ev = again.publish({"back": True})
            assert ev is not None
            await wait_for(lambda: got.ids == [ev.id])


async def test_a_client_without_endpoints_finds_a_router_by_discovery() -> None:
    port = free_udp_port()
    async with mesh(2, line(2), discovery=lo_discovery(port)) as routers:
        listen = DiscoveryConfig(port=port, interfaces=("lo",), broadcast_interval=0.1)
        async with AsyncClient(config=ClientConfig(discovery=listen, retry_base=0.05)) as c:
            assert c.router is not None and c.router[2] in {r.endpoint for r in routers}
            await c.publish({"found": True})
            await c.flush(5)
        assert all(r.counters["dispatched"] == 1 for r in routers)


async def _hang_up_server(accepted: list[float]) -> asyncio.Server:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(time.monotonic())
        writer.close()

    return await asyncio.start_server(hang_up, "127.0.0.1", 0)


async def test_a_client_tries_a_failing_router_less_and_less_often(router: Router) -> None:
    accepted: list[float] = []
    server = await _hang_up_server(accepted)
    bad = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        lonely = AsyncClient(config=ClientConfig(routers=(bad,), retry_base=0.05, retry_max=10.0))
        with pytest.raises(AaTimeout):
            await lonely.connect(timeout=1.2)
        await lonely.aclose()
        gaps = [b - a for a, b in zip(accepted, accepted[1:])]
        # At least 0.05 s · 2**k, less up to 10 % of jitter (clients of one router spread out).
        assert len(gaps) >= 3 and all(gap >= 0.9 * 0.05 * 2**k for k, gap in enumerate(gaps)), gaps
        # With a working router listed after it, the client settles there and keeps the
        # failing one on its poison list.
        config = ClientConfig(routers=(bad, router.endpoint), retry_base=0.05)
        async with AsyncClient(config=config) as c:
            assert c.router is not None and c.router[2] == router.endpoint
            entry = c.peers.get(bad)
            assert entry is not None and entry.state is PeerState.POISONED and entry.failures == 1
    finally:
        server.close()
        await server.wait_closed()
