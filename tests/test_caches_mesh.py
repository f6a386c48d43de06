"""The mesh event cache: bounds, order, queries."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from support import wait_for
from support.meshes import FAST, line, mesh

from aa.mesh import META_PATH, META_TTL, Event, PatternSpec, UsageError
from aa.router import MeshCache
from aa.router.caches import MESH_CACHE_MAX_BYTES, MESH_CACHE_MAX_EVENTS, approx_size

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def ev(i: int, payload: str = "") -> Event:
    return Event(
        values={"i": i, "p": payload}, meta={"time": T0 + timedelta(seconds=i)}, id=f"e{i}"
    )


def test_defaults_are_the_named_constants() -> None:
    c = MeshCache()
    assert (c.max_events, c.max_bytes) == (MESH_CACHE_MAX_EVENTS, MESH_CACHE_MAX_BYTES)


def test_count_bound_keeps_the_newest() -> None:
    c = MeshCache(max_events=100)
    for i in range(1000):
        c.add(ev(i))
    assert len(c) == 100
    assert [e.values["i"] for e in c.query()] == list(range(900, 1000))


def test_byte_bound_keeps_the_newest() -> None:
    one = approx_size(ev(10, "x" * 1000))  # ids e10..e49: all the same size
    c = MeshCache(max_bytes=10 * one)
    for i in range(50):
        c.add(ev(i, "x" * 1000))
    assert len(c) == 10 and c.bytes <= 10 * one
    assert [e.values["i"] for e in c.query()] == list(range(40, 50))
    # one big event pushes out many small ones, never the byte bound
    c.add(ev(99, "x" * 8000))
    assert c.bytes <= 10 * one
    assert c.query()[-1].id == "e99"


def test_event_bigger_than_the_whole_cache_is_not_cached() -> None:
    c = MeshCache(max_bytes=2000)
    c.add(ev(1))
    assert not c.add(ev(2, "x" * 5000))
    assert [e.id for e in c.query()] == ["e1"]


def test_approx_size_grows_with_content() -> None:
    small = approx_size(ev(1))
    assert approx_size(ev(1, "x" * 10_000)) >= small + 10_000
    nested = Event(values={"l": [{"a": b"y" * 500}] * 10}, id="n")
    assert approx_size(nested) > 5000


def test_query_since_match_limit() -> None:
    c = MeshCache()
    for i in range(10):
        c.add(ev(i))
    assert [e.values["i"] for e in c.query(since=T0 + timedelta(seconds=7))] == [7, 8, 9]
    assert [e.values["i"] for e in c.query(lambda e: e.values["i"] % 2 == 0, limit=3)] == [0, 2, 4]
    assert c.query(limit=0) == []
    with pytest.raises(UsageError):
        c.query(limit=-1)


def test_event_without_time_uses_now() -> None:
    c = MeshCache(clock=lambda: T0)
    c.add(Event(values={}, id="a"))  # the clock: T0
    c.add(Event(values={}, id="b"), now=T0 + timedelta(hours=1))
    assert [e.id for e in c.query(since=T0 + timedelta(minutes=1))] == ["b"]


def test_clear_and_bad_bounds() -> None:
    c = MeshCache()
    c.add(ev(1))
    c.clear()
    assert len(c) == 0 and c.bytes == 0
    with pytest.raises(UsageError):
        MeshCache(max_events=0)
    with pytest.raises(UsageError):
        MeshCache(max_bytes=-1)


async def test_a_client_that_asks_for_the_mesh_cache_and_never_reads_is_refused_busy(
    router,
) -> None:
    """Answers are written only while the client takes them: past a few MiB of unread
    answers, the next request gets error 'busy' instead of more of the router's memory."""
    import asyncio

    from aa.mesh import Connection
    from aa.mesh.protocol import GetCached, Hello
    from aa.router.caches.service import MAX_ANSWER_BACKLOG

    blob = "x" * 2000
    for i in range(5000):
        router.publish({"i": i, "pad": blob})
    reader, writer = await asyncio.open_connection(*router.address)
    codec = Connection()
    writer.write(codec.send(Hello(client_id="greedy")))
    for req in range(1, 200):
        writer.write(codec.send(GetCached(req=req, pattern=PatternSpec(source="True"))))
    await writer.drain()
    from support import wait_for

    await wait_for(lambda: router.caches.counters["busy"] > 0, timeout=30)
    session = next(s for s in router.sessions if s.client_id == "greedy")
    assert session.backlog < MAX_ANSWER_BACKLOG + 32 * 1024 * 1024  # at most one answer more
    writer.close()


async def test_a_relaying_router_caches_the_events_as_it_dispatched_them() -> None:
    """A router in the middle of a line keeps the events it relays as the bytes they came in
    (no second encoding), yet a query gives them as it dispatched them: its hop's ttl and
    path, not the stale ones inside those bytes; an event whose publisher opted out of the
    mesh cache is not cached, and the events of its group still are."""
    flood = dataclasses.replace(FAST, routing="flood")  # r1 relays everything
    async with mesh(3, line(3), config=flood) as (r0, r1, r2):
        seen: list[Event] = []
        r1.dispatcher.sinks.append(seen.append)
        for i in range(20):
            r0.publish({"i": i, "text": "x" * i}, type="reading")
        await wait_for(lambda: r2.counters["dispatched"] >= 20, timeout=10)
        for i in range(20, 25):  # one of them opted out
            r0.publish({"i": i}, meta={"mesh_cache": False} if i == 22 else None)
        await wait_for(lambda: r2.counters["dispatched"] >= 25, timeout=10)
        await wait_for(lambda: len(r1.mesh_cache) >= 24, timeout=10)  # type: ignore[arg-type]

        cached = r1.mesh_cache.query()  # type: ignore[union-attr]
        want = [e for e in seen if e.values["i"] != 22]
        assert [(e.id, e.type, e.values, e.meta) for e in cached] == [
            (e.id, e.type, e.values, e.meta) for e in want
        ]
        assert all(
            e.meta[META_PATH] == [r0.id, r1.id] and e.meta[META_TTL] == want[0].meta[META_TTL]
            for e in cached
        )
        # The relayed groups were kept as received (a block with the hop beside its bytes).
        assert any(b.hop is not None for b in r1.mesh_cache._blocks)  # type: ignore[union-attr]
