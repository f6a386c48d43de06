"""Memory of client caches once they go: what the router keeps after thousands of caches were
removed (tombstones past their time, tables sized for the most caches) is given back, a
router that takes and loses thousands of caches again and again does not grow, and under
the C allocator (``PYTHONMALLOC=malloc``) its resident memory comes back down."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from support.routerproc import RouterProcess
from support.waits import wait_for

from aa.mesh import Connection, Event, PatternSpec
from aa.mesh.protocol import CacheDone, CacheRegister, Error, Hello
from aa.router import ExpiryPolicy, Router, RouterConfig
from aa.router.caches import CacheConfig, CacheIndex, service
from aa.router.caches.compact import shrunk
from aa.router.caches.service import TRIM_AFTER_REMOVALS, TRIM_AGAIN_AFTER
from aa.router.caches.tombstones import Tombstones

CACHES = 2_000
MB = 2**20
#: Registers, bursts and removes caches in a router of its own process, then reads its RSS.
PROBE = Path(__file__).resolve().parent / "bench" / "probe_cache_arenas.py"


def _pattern(i: int) -> str:
    return f"x > {i} and y < {i}"


async def _register(endpoint: str, client_id: str, pattern: str, timeout: float) -> None:
    """One client: hello as *client_id*, register its cache, await the answer, close."""
    host, _, port = endpoint.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    codec = Connection()
    request = CacheRegister(req=1, pattern=PatternSpec(source=pattern), timeout=timeout)
    try:
        writer.write(codec.send(Hello(client_id=client_id)) + codec.send(request))
        while True:
            data = await reader.read(1 << 16)
            assert data, f"{client_id}: the router closed the connection"
            codec.receive_data(data)
            for got in codec.next_messages():
                assert not isinstance(got, Error), got
                if isinstance(got, CacheDone):
                    return
    finally:
        writer.close()


async def test_removed_caches_and_their_tombstones_give_back_what_they_held(
    router: Router,
) -> None:
    caches = router.caches
    now = [1_000_000.0]
    caches._clock = lambda: now[0]  # the router's clock, moved instead of waiting
    policy = ExpiryPolicy(max_count=10)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(CACHES):
            caches.register(f"phone-{i}", PatternSpec(source=_pattern(i)), policy, timeout=30.0)
        held = tracemalloc.get_traced_memory()[0] - before
        for i in range(CACHES):
            assert caches.remove(f"phone-{i}")
        assert len(caches) == 0 and len(caches.sync.gone) == CACHES  # tombstones kept, for now
        now[0] += 3600.0  # past every tombstone's time
        caches.sweep()
        gc.collect()
        left = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert not caches.sync.gone and caches.pattern_count == 0
    # The caches held megabytes; what is left is a few tables' worth, however many there were
    # (the flood's seen ids, which age on their own, are the rest).
    assert held > 2 * MB
    assert left < held * 0.1, f"{left / MB:.2f} MB of {held / MB:.2f} MB still held"


def test_a_router_taking_and_losing_thousands_of_caches_does_not_grow() -> None:
    async def round_of_caches(endpoint: str, n: int, tag: str) -> None:
        todo = iter(range(n))

        async def one_client_at_a_time() -> None:
            for i in todo:
                await _register(endpoint, f"{tag}-{i}", _pattern(i), timeout=2.0)

        async with asyncio.timeout(300):
            await asyncio.gather(*(one_client_at_a_time() for _ in range(16)))

    with RouterProcess("--cache-sweep-interval", "0.2", name="caches-memory") as r:
        asyncio.run(round_of_caches(r.endpoint, CACHES // 10, "warm-up"))  # code paths, buffers
        start = r.rss()
        asyncio.run(round_of_caches(r.endpoint, CACHES, "first"))
        first = r.rss()
        for n in range(3):  # the same load again: the freed memory is reused, not added to
            asyncio.run(round_of_caches(r.endpoint, CACHES, f"again{n}"))
        last = r.rss()
        assert r.alive()
    grown = first - start
    again = last - first
    # Each round's caches are gone before the next (they lapse): were their memory not reused,
    # three rounds would cost three times the first. What stays per round is the flood's
    # seen ids of the registrations (kept minutes, `aa.mesh.flood.SeenIds`) and the pages they
    # keep from going back.
    assert again < grown * 1.5, (
        f"{CACHES} caches cost {grown / MB:.1f} MB; three more rounds added {again / MB:.1f} MB"
    )


async def test_the_index_rebuilt_smaller_still_finds_the_caches_left(router: Router) -> None:
    index = CacheIndex()
    for i in range(1_200):
        spec = PatternSpec(source=f"x > {i} and y < {i + 1000}")
        index.add(i, spec, router.engine.matcher(spec))
    for i in range(1_200):
        if i % 10:
            index.remove(i)  # past seven in eight gone, the index is placed anew
    assert len(index) == 120
    assert index.match(Event(values={"x": 505, "y": 600})) == list(range(0, 505, 10))
    for i in range(0, 1_200, 10):
        index.remove(i)
    assert len(index) == 0 and index.match(Event(values={"x": 505, "y": 600})) == []


def test_tombstones_hold_no_object_per_removed_cache() -> None:
    # A removed cache's tombstone is kept for its timeout; were it objects of its own, each
    # would pin a page of the freed caches around it and their memory would stay resident.
    tombs = Tombstones()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for i in range(10_000):
            tombs.put(f"alice/phone-{i}", 1_000_000 + i, "r1a2b3c4", until=3600.0 + i)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    blocks = sum(s.count_diff for s in after.compare_to(before, "filename"))
    assert blocks < 100, f"{blocks} allocations held for 10,000 tombstones"
    assert tombs.get("alice/phone-42") == (1_000_042, "r1a2b3c4") and len(tombs) == 10_000
    assert tombs.oldest() == "alice/phone-0"
    assert tombs.expire(now=3600.0 + 5_000.5) == 5_001 and "alice/phone-5000" not in tombs
    assert dict(tombs.items())["alice/phone-9999"] == (1_009_999, "r1a2b3c4")


def test_what_is_left_after_the_caches_go_is_not_made_anew() -> None:
    # Objects made just after thousands of caches were freed land among their freed blocks
    # (Python's allocator fills its partly used pools first), and each one living on keeps a
    # 1 MiB arena from going back: the tables and tombstones that shrink keep their objects.
    table = {f"phone-{i}": i for i in range(10_000)}
    for i in range(9_990):
        del table[f"phone-{i}"]
    assert shrunk(table) is table and len(table) == 10
    assert sys.getsizeof(table) < 2_000 and table["phone-9995"] == 9_995
    emptied = {i: i for i in range(10_000)}
    for i in range(10_000):
        del emptied[i]
    assert shrunk(emptied) is emptied and sys.getsizeof(emptied) == sys.getsizeof({})

    tombs = Tombstones()
    for i in range(10_000):
        tombs.put(f"alice/phone-{i}", i, "r1a2b3c4", until=3600.0 + i)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        assert tombs.expire(now=10_000.0 + 3600.0) == 10_000
        gc.collect()  # empties the free lists, whose blocks tracemalloc counts as in use
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    made = sum(
        s.count_diff
        for s in after.compare_to(before, "filename")
        if s.count_diff > 0 and s.traceback[0].filename.endswith("tombstones.py")
    )
    # The slot table and the key buffer, resized in place; new arrays would be six more.
    assert made <= 2, f"{made} blocks made anew once every tombstone expired"
    assert not tombs and "alice/phone-0" not in tombs
    tombs.put("alice/phone-0", 1, "r1a2b3c4", until=1.0)  # and it works on
    assert tombs.get("alice/phone-0") == (1, "r1a2b3c4")


async def test_the_heap_is_asked_again_once_the_removals_flood_ids_are_forgotten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The removals' flood ids outlive the caches by a minute or more, a page of the freed
    # caches pinned by each: a trim at the removal alone leaves those pages resident.
    trims: list[float] = []
    async with Router(RouterConfig(port=0, caches=CacheConfig(sweep_interval=0.02))) as router:
        caches = router.caches
        now = [1_000_000.0]
        caches._clock = lambda: now[0]  # the router's clock, moved instead of waiting
        monkeypatch.setattr(service, "give_back", lambda: trims.append(now[0]))
        sweeps = [0]
        sweep = caches.sweep

        def counted_sweep(now: float | None = None) -> list[str]:
            sweeps[0] += 1
            return sweep(now)

        async def a_few_sweeps() -> None:
            target = sweeps[0] + 3
            await wait_for(lambda: sweeps[0] >= target)

        monkeypatch.setattr(caches, "sweep", counted_sweep)
        policy = ExpiryPolicy(max_count=10)
        for i in range(TRIM_AFTER_REMOVALS):
            caches.register(f"phone-{i}", PatternSpec(source=_pattern(i)), policy, timeout=30.0)
        for i in range(TRIM_AFTER_REMOVALS):
            caches.remove(f"phone-{i}")
        assert trims == [now[0]]  # at the removal
        now[0] += TRIM_AGAIN_AFTER - 1.0
        await a_few_sweeps()  # none is due yet
        assert len(trims) == 1
        now[0] += 1.0
        await wait_for(lambda: len(trims) == 2)
        now[0] += TRIM_AGAIN_AFTER * 2
        await a_few_sweeps()
        assert len(trims) == 2  # once: a quiet router walks its heap no more


@pytest.mark.timeout(600)
def test_under_the_c_allocator_a_router_gives_back_the_memory_its_caches_took() -> None:
    # The workload, scaled down: caches registered over TCP, a 1,000-event burst
    # acknowledged while they live, then every cache removed and its tombstone and flood ids
    # past their time (the router's clock is moved, not waited for). In a process of its own,
    # so that this one's heap does not count; the router's own second heap trim is awaited.
    # Python's allocator keeps its arenas (docs/storage.md): the C allocator is the
    # documented way to have the memory back.
    env = {**os.environ, "AA_DISCOVERY_INTERFACES": "lo", "PYTHONMALLOC": "malloc"}
    args = ["--no-trace", "--json", "--caches", str(CACHES), "--events", "1000", "--settle", "0"]
    done = subprocess.run(
        [sys.executable, str(PROBE), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rss = json.loads(done.stdout.splitlines()[-1])
    took = rss["rss_with"] - rss["rss_before"]
    kept = rss["rss_after"] - rss["rss_before"]
    assert took > 3 * MB, f"{CACHES} caches took only {took / MB:.1f} MB: nothing to measure"
    assert kept < took / 2, f"{kept / MB:.1f} of the {took / MB:.1f} MB the caches took kept"
