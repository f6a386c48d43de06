"""The store against a real PostgreSQL server that goes away and comes back."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

import pytest
from support import wait_for
from support.postgres import PgServer

from aa.mesh import Event
from aa.router import StoreConfig
from aa.router.store import EventStore

pytestmark = pytest.mark.postgres

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def ev(i: int) -> Event:
    return Event(values={"i": i}, type="r", meta={"time": T0 + timedelta(seconds=i)}, id=f"e{i}")


async def test_lost_connection_is_reported_and_queued_events_written_after_reconnect(
    pg_server: PgServer,
    pg_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="aa.router.store")
    config = StoreConfig(url=pg_url, retry_min=0.02, retry_max=0.2)
    async with EventStore(config) as store:
        for i in range(100):
            store.put_nowait(ev(i))
        await store.flush()

        pg_server.stop("fast")  # the server goes: open connections are cut
        try:
            for i in range(100, 300):
                store.put_nowait(ev(i))
            flushed = asyncio.ensure_future(store.flush())
            await wait_for(lambda: store.stats().failures >= 2, timeout=20)
            assert not store.healthy
            assert store.stats().pending == 200  # waiting, not dropped
            assert not flushed.done()
            assert any("event store write failed" in r.message for r in caplog.records)
        finally:
            pg_server.start()  # ... and comes back on the same port

        async with asyncio.timeout(30):
            await flushed
        assert store.healthy
        assert store.stats().pending == 0
        assert [e.values["i"] for e in await store.query()] == list(range(300))
    assert any("writes work again" in r.message for r in caplog.records)


async def test_postgres_store_round_trip_and_counts(pg_url: str) -> None:
    from aa.router import ExpiryPolicy

    async with EventStore(StoreConfig(url=pg_url)) as store:
        for i in range(10):
            store.put_nowait(ev(i), ExpiryPolicy(max_count=4))
            store.put_nowait(ev(i))  # a flood copy
        await store.flush()
        assert [e.values["i"] for e in await store.query()] == [6, 7, 8, 9]
