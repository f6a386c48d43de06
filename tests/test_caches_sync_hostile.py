"""A hostile peer's anti-entropy messages (issue 16) — huge digests, unknown caches, endless id
lists, oversized batches — are refused whole or answered within a bound, over a real link, and
the router goes on repairing honest peers' caches. The same for the store's anti-entropy."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from support import FAST, wait_for

from aa.mesh import Event, PatternSpec
from aa.mesh.protocol import event_to_wire
from aa.router import CacheConfig, ExpiryPolicy, Router, RouterConfig, StoreConfig
from aa.router.caches import CACHE_SYNC_TOPIC
from aa.router.caches.sync import (
    DEFS_PER_MESSAGE,
    EVENTS_PER_MESSAGE,
    MAX_DIGEST_CACHES,
    MAX_IDS_PER_MESSAGE,
)
from aa.router.store import SYNC_TOPIC
from aa.router.store.sync import MAX_BUCKETS, MAX_SYNC_IDS, SYNC_IDS_PART


@pytest.fixture
async def pair(tmp_path: Any) -> AsyncIterator[tuple[Router, Router]]:
    """A (the target) and B (the hostile peer, a real router whose links we borrow)."""
    quiet = CacheConfig(sweep_interval=0.05, sync_interval=0)  # only what the test sends
    store = StoreConfig(sync_interval=0)

    def config(name: str) -> RouterConfig:
        return RouterConfig(
            port=0, name=name, mesh=FAST, caches=quiet, store=store, data_dir=tmp_path / name
        )

    async with Router(config("a")) as a, Router(config("b")) as b:
        b.mesh.add_peer(a.endpoint)
        await wait_for(lambda: a.peer_count() == 1 and b.peer_count() == 1, timeout=10)
        yield a, b


async def settle(a: Router, counter: str, n: int) -> None:
    await wait_for(lambda: a.caches.sync.counters[counter] >= n, timeout=10)


def send(b: Router, a: Router, body: dict[str, Any], topic: str = CACHE_SYNC_TOPIC) -> None:
    assert b.mesh.send_control(a.id, topic, body)


async def test_oversized_or_malformed_cache_sync_messages_are_refused_whole(pair) -> None:
    a, b = pair
    a.caches.register("phone", PatternSpec(source="True"), ExpiryPolicy(), 600.0)
    await wait_for(lambda: "phone" in b.caches)
    before = dict(a.caches.sync.counters)
    huge = [[f"c{i}", [1, "x"], None, 0, 0, "0"] for i in range(MAX_DIGEST_CACHES + 1)]
    send(b, a, {"op": "digest", "caches": huge, "gone": [], "complete": True})
    send(
        b,
        a,
        {"op": "ids", "client": "phone", "ids": [f"e{i}" for i in range(MAX_IDS_PER_MESSAGE + 1)]},
    )
    send(b, a, {"op": "events", "client": "phone", "events": [{}] * (EVENTS_PER_MESSAGE + 1)})
    send(b, a, {"op": "defs", "caches": [{}] * (DEFS_PER_MESSAGE + 1)})
    send(b, a, {"op": "gone", "caches": [["phone", "not a version"]]})
    send(b, a, {"op": "digest", "caches": [["phone", [1, "x"], None, -5, 0, "0"]]})  # negative idle
    send(b, a, {"op": "what"})
    send(b, a, {"op": "events", "client": "phone", "events": [{}]})  # not an event
    await settle(a, "refused", 8)
    assert len(a.caches) == 1 and "phone" in a.caches  # nothing applied, not even in part
    sent = {
        k: v - before.get(k, 0) for k, v in a.caches.sync.counters.items() if k.startswith("sent_")
    }
    assert not any(sent.values()), sent  # and nothing answered


async def test_unknown_caches_and_endless_id_lists_cost_a_bounded_answer(pair) -> None:
    a, b = pair
    a.caches.register("phone", PatternSpec(source="True"), ExpiryPolicy(), 600.0)
    await wait_for(lambda: "phone" in b.caches)
    for i in range(50):
        a.publish({"i": i})
    await wait_for(lambda: b.caches.info("phone").size == 50)
    # Unknown caches: ignored, nothing created, nothing kept about them.
    for i in range(200):
        send(b, a, {"op": "ids", "client": f"nobody-{i}", "ids": ["x"], "reply": True})
        send(b, a, {"op": "events", "client": f"nobody-{i}", "events": []})
    await settle(a, "unknown_cache", 400)
    assert len(a.caches) == 1 and not a.caches.sync.gone
    # Endless id lists for a real cache, each claiming to lack everything: one answer per
    # second per cache, not one per message (each answer is up to the whole cache).
    a.caches.sync.min_gap = 600.0  # the whole burst falls within one gap, however slow the machine
    a.caches.sync.counters["dropped_busy"] = 0
    sent_before = a.caches.sync.counters["sent_events"]
    received_before = a.caches.sync.counters["received_ids"]
    for _ in range(300):
        send(b, a, {"op": "ids", "client": "phone", "ids": [], "reply": True})
    await settle(
        a, "received_ids", received_before + 300
    )  # the burst's own, however many turns it takes
    assert a.caches.sync.counters["sent_events"] - sent_before == 1  # 50 events: one message
    assert a.caches.sync.counters["dropped_busy"] == 299
    a.caches.sync.min_gap = 0.0
    # A digest naming thousands of caches we lack: one `want` (bounded by the digest's cap),
    # and an honest peer that has none of them sends nothing, so nothing is created.
    names = [[f"ghost-{i}", [1, "x"], None, 0, 0, "0"] for i in range(5000)]
    send(b, a, {"op": "digest", "caches": names, "gone": [], "complete": False})
    await wait_for(lambda: b.caches.sync.counters["received_want"] >= 1)
    assert len(a.caches) == 1 and b.caches.sync.counters["sent_defs"] == 0


async def test_a_peer_cannot_put_into_a_cache_what_its_pattern_does_not_take(pair) -> None:
    a, b = pair
    a.caches.register("phone", PatternSpec(source="i >= 0"), ExpiryPolicy(), 600.0)
    await wait_for(lambda: "phone" in b.caches)
    stamp = {"time": datetime.now(UTC)}
    forged = [
        Event(values={"evil": 1}, id="forged-1", meta=stamp),
        Event(values={"i": 1}, meta=stamp),
        Event(values={"i": 2}, id="real-2", meta=stamp),
    ]
    send(b, a, {"op": "events", "client": "phone", "events": [event_to_wire(e) for e in forged]})
    await settle(a, "received_events", 1)
    assert [e.id for e in a.caches.fetch("phone").events] == [
        "real-2"
    ]  # not the unmatched, not the id-less


async def test_after_a_hostile_burst_honest_repair_still_works(pair) -> None:
    a, b = pair
    a.caches.register("phone", PatternSpec(source="i >= 0"), ExpiryPolicy(max_count=100), 600.0)
    await wait_for(lambda: "phone" in b.caches)
    for _ in range(10):
        send(
            b, a, {"op": "digest", "caches": [[f"c{j}", 1, None, 0, 0, "0"] for j in range(100)]}
        )  # bad versions
    await settle(a, "refused", 10)
    a.caches.sync.min_gap = b.caches.sync.min_gap = 0.0  # (B's link-up digest may be < 1 s old)
    b.caches._caches.remove("phone")  # B lost its copy behind the mesh's back
    b.caches.sync.versions.pop("phone")
    for i in range(20):
        a.publish({"i": i})
    b.caches.link_up(a.id)  # B's honest digest, as on a new link
    await wait_for(lambda: "phone" in b.caches and b.caches.info("phone").size == 20, timeout=10)


async def test_the_store_sync_refuses_huge_digests_and_id_lists(pair) -> None:
    a, b = pair
    send(
        b,
        a,
        {"op": "digest", "buckets": [["t", h, 1, "0"] for h in range(MAX_BUCKETS + 1)]},
        SYNC_TOPIC,
    )
    send(
        b,
        a,
        {
            "op": "ids",
            "buckets": [["t", 0]],
            "ids": [["x"] * SYNC_IDS_PART] * (MAX_SYNC_IDS // SYNC_IDS_PART + 1),
            "reply": True,
        },
        SYNC_TOPIC,
    )
    send(
        b,
        a,
        {"op": "ids", "buckets": [["t", h] for h in range(MAX_BUCKETS + 1)], "ids": []},
        SYNC_TOPIC,
    )
    send(b, a, {"op": "digest", "buckets": [["t", "noon", 1, "0"]]}, SYNC_TOPIC)
    for bad_slice in (
        [0, 0],
        [2, 2],
        [2, -1],
        [10**9, 1],
        ["2", 1],
        [2],
    ):  # k ≥ 1, 0 ≤ j < k ≤ 1024
        send(b, a, {"op": "ids", "buckets": [["t", 0]], "ids": [], "slice": bad_slice}, SYNC_TOPIC)
    await wait_for(lambda: a.storage.sync.counters["refused"] >= 10, timeout=10)
    assert not a.storage.sync.counters["sent_ids"] and not a.storage.sync.counters["sent_events"]
