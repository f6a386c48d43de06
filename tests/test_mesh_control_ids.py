"""Control messages' ids are kept apart from events' and bounded: a flood of controls (a
client's cache requests, each flooded to the mesh) costs a router bounded memory, on a lone
router as on a mesh, and cannot push events' ids out of their window."""

from __future__ import annotations

import asyncio
import tracemalloc

import pytest

import aa.mesh.flood
from aa.mesh import Connection, FloodRules, PatternSpec
from aa.mesh.flood import CONTROL_IDS_MAX, CONTROL_IDS_MAX_AGE
from aa.mesh.protocol import CacheClear, CacheDone, CacheRegister, Error, Hello
from aa.router import Router, RouterConfig

MB = 2**20


def test_control_ids_are_capped_and_kept_apart_from_events() -> None:
    events = FloodRules("r1")
    controls = events.for_controls()
    assert events.originate("ev-1", now=0.0) is not None
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(3 * CONTROL_IDS_MAX):
            assert controls.originate(f"{i:032x}", now=i * 1e-4) is not None
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(controls.seen) <= CONTROL_IDS_MAX
    assert len(events.seen) == 1 and "ev-1" in events.seen  # the events' window is untouched
    # About 100 bytes an id (the id string and its dict slot), whatever the flood's length.
    assert held < CONTROL_IDS_MAX * 200, f"{held / MB:.1f} MB for the control ids"


def test_control_ids_live_shorter_than_events() -> None:
    controls = FloodRules("r1").for_controls()
    assert controls.originate("c-1", now=0.0) is not None
    assert controls.receive("c-1", ttl=5, path=["r2"], now=1.0) is None  # a copy: dropped
    controls.seen.expire(CONTROL_IDS_MAX_AGE)
    assert "c-1" not in controls.seen


async def test_a_clients_flood_of_cache_requests_fills_the_control_set_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A small cap, so that the flood passes it many times over in a test's time.
    cap = 400
    monkeypatch.setattr(aa.mesh.flood, "CONTROL_IDS_MAX", cap)
    requests = 5 * cap
    async with Router(RouterConfig(port=0, name="lone")) as router:
        seen_events = router.mesh.rules.seen
        seen_controls = router.mesh.relay.control_rules.seen
        events_before = len(seen_events)
        host, _, port = router.endpoint.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        codec = Connection()
        register = CacheRegister(req=0, pattern=PatternSpec(source="x > 1"), timeout=60.0)
        writer.write(codec.send(Hello(client_id="flooder")) + codec.send(register))
        done = 0
        async with asyncio.timeout(60):
            for start in range(1, requests + 1, 100):
                writer.write(
                    b"".join(codec.send(CacheClear(req=r)) for r in range(start, start + 100))
                )
                while done < start + 99:
                    data = await reader.read(1 << 16)
                    assert data, "the router closed the connection"
                    codec.receive_data(data)
                    for got in codec.next_messages():
                        assert not isinstance(got, Error), got
                        done += isinstance(got, CacheDone)
                assert len(seen_controls) <= cap
        writer.close()
        assert router.caches.counters["flooded_clear"] == requests
        assert len(seen_events) == events_before  # no control id among the events'
