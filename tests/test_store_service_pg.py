"""A router whose store is a real PostgreSQL server: persistence, history, replication between
two routers, and a database that goes away under a publisher and comes back."""

from __future__ import annotations

import pytest
from support import next_event, wait_for
from support.postgres import PgServer

from aa.client import AsyncClient
from aa.router import Router, RouterConfig, StoreConfig

pytestmark = pytest.mark.postgres


async def test_history_from_a_postgres_store_replicated_across_two_routers(
    pg_server: PgServer,
    pg_url: str,
) -> None:
    other = pg_server.url(pg_server.create_database())
    async with (
        Router(RouterConfig(port=0, store=StoreConfig(url=pg_url))) as a,
        Router(RouterConfig(port=0, store=StoreConfig(url=other), peers=(a.endpoint,))) as b,
    ):
        await wait_for(lambda: a.peer_count() == 1 and b.peer_count() == 1)
        async with AsyncClient(a.endpoint) as pub:
            for i in range(6):
                await pub.publish({"i": i}, type="r", meta={"persist": True, "max_count": 4})
            await pub.publish({"i": 99})
            await pub.flush()
        async with AsyncClient(b.endpoint) as reader:  # the other router, its own database
            await wait_for(
                lambda: b.storage.store is not None and b.storage.store.stats().written >= 6
            )
            sub = await reader.subscribe("True", history={"since": None})
            got = [await next_event(sub) for _ in range(4)]
            assert [e.values["i"] for e in got] == [2, 3, 4, 5]
            assert all(e.meta["historical"] for e in got)


async def test_a_lost_database_holds_the_acks_and_drops_nothing(
    pg_server: PgServer, pg_url: str
) -> None:
    store = StoreConfig(url=pg_url, retry_min=0.02, retry_max=0.2)
    async with Router(RouterConfig(port=0, store=store)) as r:
        async with AsyncClient(r.endpoint) as pub:
            for i in range(100):
                pub.publish_nowait({"i": i}, meta={"persist": True})
            await pub.flush()
            pg_server.stop("fast")
            try:
                for i in range(100, 300):
                    pub.publish_nowait({"i": i}, meta={"persist": True})
                assert r.storage.store is not None
                await wait_for(lambda: r.storage.store.stats().failures >= 2, timeout=20)  # type: ignore[union-attr]
                assert not r.storage.store.healthy
                assert pub.pending == 200  # delivered and flooded, but not acknowledged
            finally:
                pg_server.start()
            await pub.flush(timeout=30)
        got = await r.history("True", include_cache=False)
        assert sorted(e.values["i"] for e in got) == list(range(300))  # none dropped
