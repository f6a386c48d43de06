"""``GET /metrics`` (Prometheus text format, read back with Prometheus's own parser) and
``GET /clients/live``, over a real uvicorn endpoint with real clients: the values move as
events flow, a client that does not read comes first, answers stay bounded with many
clients, and a caller sees only what the gate lets it."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from http_helpers import open_api, open_server
from prometheus_client.parser import text_string_to_metric_families
from support import wait_for
from support.meshes import mesh

from aa.client import AsyncClient
from aa.http_api import create_app
from aa.http_api.live import MAX_LIVE_PAGE, MAX_LIVE_SUBSCRIPTIONS
from aa.mesh import Connection, PatternSpec
from aa.mesh.protocol import Hello, Subscribe, Subscribed

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of a scrape, by (name, labels), through prometheus_client's parser."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    want = frozenset(labels.items())
    hits = [v for (n, ls), v in samples.items() if n == name and want <= ls]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


async def scrape(http: httpx.AsyncClient) -> Samples:
    r = await http.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(r.text)


async def test_metrics_move_as_events_flow_over_a_real_endpoint() -> None:
    async with (
        open_server() as (router, endpoint),
        httpx.AsyncClient(base_url=endpoint.url) as http,
        AsyncClient(router.endpoint, name="pub") as pub,
        AsyncClient(router.endpoint, name="sub") as sub,
    ):
        before = await scrape(http)
        assert value(before, "aa_clients", router="http-real") == 2
        assert value(before, "aa_events_published_total", router="http-real") == 0
        got: list[Any] = []
        await sub.subscribe("n >= 0", got.append)
        for n in range(40):  # one frame each, so the sampled dispatch timing sees several
            await pub.publish({"n": n})
            await pub.flush(5)
            await wait_for(lambda n=n: len(got) > n)
        after = await scrape(http)
        assert value(after, "aa_events_published_total", router="http-real") == 40
        assert value(after, "aa_events_dispatched_total", router="http-real") == 40
        assert value(after, "aa_events_delivered_total", router="http-real") == 40
        assert value(after, "aa_subscriptions", router="http-real", tier="predicate") == 1
        assert value(after, "aa_subscriptions", router="http-real", tier="worker") == 0
        assert value(after, "aa_events_dropped_total", reason="slow_subscriber") == 0
        count = value(after, "aa_dispatch_seconds_count")
        assert count >= 2  # one batch in 16 timed
        assert value(after, "aa_dispatch_seconds_bucket", le="+Inf") == count
        assert 0 < value(after, "aa_dispatch_seconds_sum") < count  # seconds, each well under 1
        assert value(after, "aa_peer_links") == 0
        await sub.aclose()
        await wait_for(lambda: len(router.sessions) == 1)
        gone = await scrape(http)
        assert value(gone, "aa_clients") == 1
        assert value(gone, "aa_subscriptions", tier="predicate") == 0
        assert value(gone, "aa_events_delivered_total") == 40  # a counter keeps what was counted


async def test_metrics_count_each_peer_link() -> None:
    async with mesh(2, [(0, 1)]) as (a, b):
        seen: list[Any] = []
        b.subscribe("True", seen.append)
        await wait_for(lambda: bool(a.mesh.links) and bool(b.mesh.links))
        for n in range(5):
            a.publish({"n": n})
        await wait_for(lambda: len(seen) == 5)
        for r, other, metric in (
            (a, b, "aa_events_forwarded_total"),
            (b, a, "aa_events_from_peers_total"),
        ):
            app = create_app(r, names=None)
            transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 4000))  # type: ignore[arg-type]
            async with httpx.AsyncClient(transport=transport, base_url="http://x") as http:
                samples = await scrape(http)
            assert value(samples, "aa_peer_links", router=r.name) == 1
            assert value(samples, metric, router=r.name, peer=other.name, peer_id=other.id) == 5


# -- /clients/live -------------------------------------------------------------------------


@asynccontextmanager
async def deaf_subscriber(port: int, pattern: str) -> AsyncIterator[None]:
    """A client that subscribes to *pattern* and then never reads (a tiny receive buffer)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    codec = Connection()
    writer.write(codec.send(Hello(client_id="deaf")))
    writer.write(codec.send(Subscribe(sub_id=1, pattern=PatternSpec(source=pattern))))
    async with asyncio.timeout(5):
        while not any(type(m) is Subscribed for m in codec.next_messages()):
            codec.receive_data(await reader.read(65536))
    try:
        yield
    finally:
        writer.close()


async def test_clients_live_shows_the_slowest_subscriber_first_with_rates() -> None:
    async with (
        open_server() as (router, endpoint),
        httpx.AsyncClient(base_url=endpoint.url) as http,
        AsyncClient(router.endpoint, name="reader") as reader,
        deaf_subscriber(router.address[1], "blob != ''"),
    ):
        got: list[Any] = []
        await reader.subscribe("n >= 0", got.append)
        blob = "x" * 10_000
        for n in range(300):  # 3 MB the deaf client never reads
            router.publish({"n": n, "blob": blob})
        await wait_for(lambda: len(got) == 300, timeout=10)
        r = await http.get("/clients/live")
        assert r.status_code == 200, r.text
        page = r.json()
        assert page["clients"] == 2 and not page["more"]
        slow, fast = page["items"]
        assert slow["id"] == "deaf" and slow["buffered"] + slow["dropped"] * 10_000 > 100_000
        assert fast["name"] == "reader" and fast["events_out"] == 300 and fast["out_rate"] > 0
        assert fast["subscriptions"] == [
            {
                "id": fast["subscriptions"][0]["id"],
                "overflow": "notify",
                "missed": 0,
                "pattern": "n >= 0",
                "kernel": "python",
                "format": "expr",
                "tier": "predicate",
            }
        ]
        assert fast["user"] == "anonymous" and fast["address"].startswith("127.0.0.1:")
        assert fast["connected"] > 0
        one = (await http.get("/clients/live", params={"limit": 1, "offset": 1})).json()
        assert [c["name"] for c in one["items"]] == ["reader"] and not one["more"]
        first = (await http.get("/clients/live", params={"limit": 1})).json()
        assert first["more"] and first["items"][0]["id"] == "deaf"
        r = await http.get("/clients/live", params={"limit": MAX_LIVE_PAGE + 1})
        assert r.status_code == 422


async def test_clients_live_is_bounded_with_many_clients_and_subscriptions() -> None:
    async with open_api() as (router, http):
        clients = [AsyncClient(router.endpoint, name=f"c{i}") for i in range(60)]
        try:
            await asyncio.gather(*(c.connect() for c in clients))
            for n in range(MAX_LIVE_SUBSCRIPTIONS + 5):
                await clients[0].subscribe(f"n == {n}")
            page = (await http.get("/clients/live", params={"limit": 50})).json()
            assert page["clients"] == 60 and page["more"] and len(page["items"]) == 50
            rest = (await http.get("/clients/live", params={"limit": 50, "offset": 50})).json()
            assert not rest["more"] and len(rest["items"]) == 10
            assert {c["name"] for c in page["items"] + rest["items"]} == {
                f"c{i}" for i in range(60)
            }
            busy = next(c for c in page["items"] + rest["items"] if c["name"] == "c0")
            assert busy["subscription_count"] == MAX_LIVE_SUBSCRIPTIONS + 5
            assert len(busy["subscriptions"]) == MAX_LIVE_SUBSCRIPTIONS
        finally:
            await asyncio.gather(*(c.aclose() for c in clients))


async def test_the_grafana_dashboard_asks_only_for_metrics_the_router_serves(
    tmp_path: Any,
) -> None:
    import json
    import re
    from pathlib import Path

    from aa.router import Router, RouterConfig

    dashboard = json.loads(
        (Path(__file__).parents[1] / "docs" / "grafana-dashboard.json").read_text()
    )
    asked = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\b(aa_[a-z_]+)\b", target["expr"])
    }
    config = RouterConfig(port=0, name="dash", data_dir=tmp_path)  # store and event log on
    async with Router(config) as router:
        transport = httpx.ASGITransport(app=create_app(router, names=None))  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as http:
            text = (await http.get("/metrics")).text
    # every sample, and the families without one yet (no peer link: no per-peer series)
    served = {name for name, _ in parse(text)} | set(re.findall(r"^# TYPE (\S+)", text, re.M))
    assert asked and asked <= served, asked - served
