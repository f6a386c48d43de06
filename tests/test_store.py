"""The persistent event store: on SQLite, and the same behaviour on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError
from support import wait_for

import aa.router.store.sql as sql_mod
from aa.mesh import Event, InvalidPolicy, StoreFull, StoreUnavailable, UsageError
from aa.router import ExpiryPolicy, StoreConfig
from aa.router.store import EventStore

T0 = datetime(2030, 1, 1, tzinfo=UTC)
NO_LIMIT = ExpiryPolicy()


def ev(
    i: int, *, type: str | None = "reading", at: datetime | None = None, **values: object
) -> Event:
    """Event number *i*, stamped *i* seconds after T0 unless *at* says otherwise."""
    t = at if at is not None else T0 + timedelta(seconds=i)
    return Event(values={"i": i, **values}, type=type, meta={"time": t, "client": "c1"}, id=f"e{i}")


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


MakeStore = Callable[..., Awaitable[EventStore]]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest) -> str | None:
    """None (SQLite in the data folder) or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return None
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
async def make_store(tmp_path: Path, store_url: str | None) -> AsyncIterator[MakeStore]:
    stores: list[EventStore] = []

    async def make(clock: Clock | None = None, **config: object) -> EventStore:
        s = EventStore(
            StoreConfig(url=store_url, **config), data_dir=tmp_path, clock=clock or Clock()
        )  # type: ignore[arg-type]
        await s.start()
        stores.append(s)
        return s

    yield make
    for s in stores:
        await s.aclose()


async def test_values_and_meta_keep_their_types(make_store: MakeStore) -> None:
    store = await make_store()
    values = {
        "int": 101,
        "big": 2**64 - 1,
        "neg": -(2**63),
        "float": 1.0,
        "str": "snø",
        "bytes": b"\x00\xff",
        "none": None,
        "bool": True,
        "aware": datetime(2024, 5, 1, 12, 0, 0, 250_000, tzinfo=UTC),
        "naive": datetime(2024, 5, 1, 12, 0, 0),
        "nested": {"list": [1, 2.5, b"x", {"deep": None}]},
    }
    original = Event(
        values=values, type="t", meta={"time": T0, "path": ["r1", "r2"], "ttl": 3}, id="x1"
    )
    store.put_nowait(original, NO_LIMIT)
    await store.flush()
    (got,) = await store.query()
    assert got == original
    for k, v in values.items():
        assert type(got.values[k]) is type(v), k


async def test_query_is_oldest_first_with_since_limit_and_match(make_store: MakeStore) -> None:
    store = await make_store()
    for i in [5, 3, 9, 1, 7]:  # put out of order: replay is by event time
        store.put_nowait(ev(i), NO_LIMIT)
    await store.flush()
    assert [e.values["i"] for e in await store.query()] == [1, 3, 5, 7, 9]
    assert [e.values["i"] for e in await store.query(since=T0 + timedelta(seconds=5))] == [5, 7, 9]
    assert [e.values["i"] for e in await store.query(limit=2)] == [1, 3]
    assert [e.values["i"] for e in await store.query(lambda e: e.values["i"] > 4, limit=2)] == [
        5,
        7,
    ]
    assert await store.query(limit=0) == []
    with pytest.raises(UsageError):
        await store.query(limit=-1)


async def test_duplicate_ids_are_ignored(make_store: MakeStore) -> None:
    store = await make_store()
    store.put_nowait(ev(1), NO_LIMIT)
    store.put_nowait(ev(1), NO_LIMIT)  # the same event twice in one batch
    await store.flush()
    store.put_nowait(ev(1), NO_LIMIT)  # and again later, as a flood copy
    store.put_nowait(ev(2), NO_LIMIT)
    await store.flush()
    assert [e.id for e in await store.query()] == ["e1", "e2"]
    assert store.stats().healthy and store.stats().rejected == 0


async def test_count_limit_keeps_newest_n_per_type(make_store: MakeStore) -> None:
    store = await make_store()
    keep3 = ExpiryPolicy(max_count=3)
    for i in range(1, 6):
        store.put_nowait(ev(i, type="snow"), keep3)
    for i in range(10, 14):
        store.put_nowait(ev(i, type="rain"), NO_LIMIT)
    await store.flush()
    got = await store.query()
    assert [e.values["i"] for e in got if e.type == "snow"] == [3, 4, 5]
    assert [e.values["i"] for e in got if e.type == "rain"] == [10, 11, 12, 13]
    # across batches, and a late (older) event is not among the newest: it goes at once
    store.put_nowait(ev(6, type="snow"), keep3)
    await store.flush()
    store.put_nowait(ev(0, type="snow"), keep3)
    await store.flush()
    assert [e.values["i"] for e in await store.query() if e.type == "snow"] == [4, 5, 6]
    # the latest count wins for the type
    store.put_nowait(ev(7, type="snow"), ExpiryPolicy(max_count=1))
    await store.flush()
    assert [e.values["i"] for e in await store.query() if e.type == "snow"] == [7]


async def test_count_limit_needs_a_type(make_store: MakeStore) -> None:
    store = await make_store()
    with pytest.raises(InvalidPolicy, match="needs an event type"):
        store.put_nowait(ev(1, type=None), ExpiryPolicy(max_count=1))


async def test_age_limit_by_moving_time(make_store: MakeStore) -> None:
    clock = Clock()
    store = await make_store(clock)
    hour = ExpiryPolicy(max_age=timedelta(hours=1))
    store.put_nowait(ev(0), hour)  # stamped T0
    store.put_nowait(ev(1, at=T0 + timedelta(minutes=30)), hour)
    store.put_nowait(ev(2), NO_LIMIT)  # never expires by age
    await store.flush()
    assert len(await store.query(now=T0 + timedelta(minutes=59))) == 3
    # at query time, expired events are left out before any sweep ran ...
    later = T0 + timedelta(hours=1, minutes=1)
    assert [e.id for e in await store.query(now=later)] == ["e2", "e1"]  # e2 is older
    # ... and a sweep deletes them for good (the clock drives both)
    clock.now = later
    assert [e.id for e in await store.query()] == ["e2", "e1"]
    assert await store.expire() == 1
    assert await store.expire(T0 + timedelta(hours=2)) == 1
    assert [e.id for e in await store.query(now=T0)] == ["e2"]
    assert store.stats().expired == 2


async def test_event_without_time_stamp_ages_from_now(make_store: MakeStore) -> None:
    clock = Clock()
    store = await make_store(clock)
    store.put_nowait(Event(values={}, id="a"), ExpiryPolicy(max_age=timedelta(seconds=10)))
    store.put_nowait(
        Event(values={}, id="b"),
        ExpiryPolicy(max_age=timedelta(seconds=10)),
        now=T0 + timedelta(seconds=5),
    )
    await store.flush()
    assert [e.id for e in await store.query(now=T0 + timedelta(seconds=12))] == ["b"]


async def test_restart_keeps_events(tmp_path: Path, store_url: str | None) -> None:
    async with EventStore(StoreConfig(url=store_url), data_dir=tmp_path) as s1:
        for i in range(100):
            s1.put_nowait(ev(i), NO_LIMIT)
        # no flush: aclose writes what is queued
    async with EventStore(StoreConfig(url=store_url), data_dir=tmp_path) as s2:
        got = await s2.query()
    assert [e.values["i"] for e in got] == list(range(100))
    if store_url is None:
        assert (tmp_path / "events.db").exists()


async def test_query_sees_events_not_yet_written(make_store: MakeStore) -> None:
    store = await make_store(flush_interval=3600.0, batch_size=1000)
    for i in (2, 4):
        store.put_nowait(ev(i), NO_LIMIT)
    await store.flush()
    for i in (5, 1, 3, 3, 4):  # these wait in the queue (the writer waits an hour for company)
        store.put_nowait(ev(i), NO_LIMIT)  # 3 twice, and 4 again: one copy of each comes back
    assert store.stats().pending == 5
    assert [e.values["i"] for e in await store.query()] == [1, 2, 3, 4, 5]
    assert [e.values["i"] for e in await store.query(since=T0 + timedelta(seconds=3))] == [3, 4, 5]


async def test_queue_is_bounded(make_store: MakeStore) -> None:
    store = await make_store(flush_interval=3600.0, batch_size=1000, max_pending=3)
    for i in range(3):
        store.put_nowait(ev(i), NO_LIMIT)
    with pytest.raises(StoreFull, match="3 events waiting"):
        store.put_nowait(ev(3), NO_LIMIT)
    await store.flush()
    store.put_nowait(ev(3), NO_LIMIT)  # room again once written
    await store.flush()
    assert len(await store.query()) == 4


async def test_put_refuses_what_it_cannot_store(make_store: MakeStore) -> None:
    store = await make_store()
    with pytest.raises(UsageError, match="needs an id"):
        store.put_nowait(Event(values={}), NO_LIMIT)
    with pytest.raises(UsageError, match="type must be at most"):
        store.put_nowait(Event(values={}, type="x" * 1000, id="a"), NO_LIMIT)
    with pytest.raises(UsageError, match="no NUL"):
        store.put_nowait(Event(values={}, type="a\x00b", id="a"), NO_LIMIT)


async def test_closed_or_unstarted_store_refuses(tmp_path: Path) -> None:
    s = EventStore(StoreConfig(), data_dir=tmp_path)
    with pytest.raises(UsageError, match="not started"):
        s.put_nowait(ev(1))
    await s.start()
    await s.aclose()
    with pytest.raises(UsageError, match="closed"):
        s.put_nowait(ev(1))
    with pytest.raises(UsageError):
        StoreConfig(batch_size=0)
    with pytest.raises(UsageError, match="data folder"):
        await EventStore(StoreConfig()).start()


async def test_unreachable_database_fails_at_start() -> None:
    s = EventStore(StoreConfig(url="postgresql+psycopg://nobody@127.0.0.1:1/none"))
    with pytest.raises(StoreUnavailable, match="cannot open the event store"):
        await s.start()


async def test_failed_writes_are_reported_retried_and_nothing_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = sql_mod.write_batch
    broken = True

    def flaky(engine: object, rows: object) -> None:
        if broken:
            raise OperationalError("INSERT", {}, Exception("database or disk is full"))
        real(engine, rows)  # type: ignore[arg-type]

    monkeypatch.setattr(sql_mod, "write_batch", flaky)
    config = StoreConfig(retry_min=0.01, retry_max=0.02)
    async with EventStore(config, data_dir=tmp_path) as store:
        for i in range(10):
            store.put_nowait(ev(i), NO_LIMIT)
        flushed = asyncio.ensure_future(store.flush())
        await wait_for(lambda: store.stats().failures >= 3, timeout=10)
        assert not store.healthy and not flushed.done()
        stats = store.stats()
        assert stats.pending == 10 and "disk is full" in (stats.last_error or "")
        assert any("event store write failed" in r.message for r in caplog.records)
        broken = False
        async with asyncio.timeout(10):
            await flushed
        assert store.healthy and store.stats().pending == 0
        assert len(await store.query()) == 10


async def test_close_gives_up_loudly_when_the_database_stays_away(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def dead(engine: object, rows: object) -> None:
        raise OperationalError("INSERT", {}, Exception("unable to open database file"))

    monkeypatch.setattr(sql_mod, "write_batch", dead)
    store = EventStore(StoreConfig(retry_min=0.01, retry_max=0.02), data_dir=tmp_path)
    await store.start()
    for i in range(7):
        store.put_nowait(ev(i), NO_LIMIT)
    with pytest.raises(StoreUnavailable, match="7 events not written"):
        await store.aclose(timeout=0.2)


async def test_refused_rows_are_reported_and_the_rest_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import aa.router.store.sql as sql

    real_pack = sql.pack

    def picky(obj: object) -> bytes:
        if isinstance(obj, dict) and obj.get("i") == 3:
            raise TypeError("cannot encode this one")
        return real_pack(obj)

    monkeypatch.setattr(sql, "pack", picky)
    caplog.set_level(logging.WARNING)
    async with EventStore(StoreConfig(), data_dir=tmp_path) as store:
        for i in range(5):
            store.put_nowait(ev(i), NO_LIMIT)
        await store.flush()
        assert [e.values["i"] for e in await store.query()] == [0, 1, 2, 4]
        assert store.stats().rejected == 1 and store.healthy
        assert any("refused event e3" in r.message for r in caplog.records)


async def test_acknowledged_events_survive_kill_9(tmp_path: Path) -> None:
    """A child process stores events, flushes (the point where a router acks), prints, and
    kills itself with SIGKILL; every acknowledged event must be there afterwards."""
    child = textwrap.dedent(
        """
        import asyncio, os, signal, sys
        from aa.mesh import Event
        from aa.router.store import EventStore, StoreConfig

        async def main():
            store = EventStore(StoreConfig(), data_dir=sys.argv[1])
            await store.start()
            for i in range(5000):
                store.put_nowait(Event(values={"i": i}, id=f"e{i}"))
            await store.flush()
            print("acked", flush=True)
            for i in range(5000, 6000):  # not acknowledged: may or may not be there
                store.put_nowait(Event(values={"i": i}, id=f"e{i}"))
            os.kill(os.getpid(), signal.SIGKILL)

        asyncio.run(main())
        """
    )
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", child, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -9, proc.stderr
    assert proc.stdout.strip() == "acked"
    async with EventStore(StoreConfig(), data_dir=tmp_path) as store:
        ids = {e.id for e in await store.query()}
    assert {f"e{i}" for i in range(5000)} <= ids


async def test_replay_of_many_events_is_ordered_and_chunked(make_store: MakeStore) -> None:
    """Replay orders by time, ties by id, over more rows than one query chunk holds. How fast
    100,000 events replay is the store benchmark's (`tests/bench/bench_store.py --only
    persist,replay`), not a test's on a shared machine."""
    store = await make_store()
    n, chunk = 20_000, 6_000
    meta = {"client": "c1", "router": "r1", "ttl": 8, "path": ["r1"], "persist": True}
    for i in range(n):
        # ids descend while times ascend: replay must order by time, not by id or insertion
        t = T0 + timedelta(microseconds=i // 2)  # pairs of equal times: ties broken by id
        store.put_nowait(
            Event.trusted(
                {"Temperature": i, "Where": "hall"}, "r", {**meta, "time": t}, f"e{n - i:06d}"
            ),
            NO_LIMIT,
        )
    await store.flush()
    got = await store.query()
    assert len(got) == n
    keys = [(e.meta["time"], e.id) for e in got]
    assert keys == sorted(keys)
    chunks = [len(c) async for c in store.iterate(chunk=chunk)]
    assert sum(chunks) == n and max(chunks) <= chunk and len(chunks) == -(-n // chunk)


def test_default_file_is_in_the_data_folder(tmp_path: Path) -> None:
    url = StoreConfig().resolve_url(tmp_path / "data")
    assert str(url).endswith(os.path.join("data", "events.db"))
    assert (tmp_path / "data").is_dir()
