"""Stores converge when they differ by more than a client frame's worth of events (issue 16).

Found by the partition tests: after a few partitions with publishers on every side, stores
stayed apart for good. The store-sync messages list every id of a bucket that differs (an
hour of one type); a link accepted by a router kept the item cap of the client session that
read the peer's hello (10,000), so a list longer than that was refused as malformed and the
link closed — and the same again at every retry. Two routers, each with 12,000 persisted
events of one type the other lacks: once linked, both hold all 24,000, each once, and the
link never broke.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from aa.router import Router, RouterConfig, StoreConfig
from aa.router.session import MAX_FRAME_ITEMS

from support import FAST, wait_for, wait_until

PERSIST = {"persist": True}
#: Events each router takes while they are apart: more than a client frame's item cap.
APART = MAX_FRAME_ITEMS + 2_000


async def publish_apart(router: Router, key: str) -> None:
    for i in range(APART):
        router.publish({key: i}, type="reading", meta=PERSIST)
        if i % 1000 == 999:
            await asyncio.sleep(0)  # let the store write between batches
    store = router.storage.store
    assert store is not None
    await wait_for(lambda: store.stats().written >= APART, timeout=60)


async def test_stores_apart_by_more_than_a_frames_item_cap_converge_without_breaking_the_link(tmp_path: Path) -> None:
    def config(name: str) -> RouterConfig:
        return RouterConfig(port=0, name=name, mesh=FAST, data_dir=tmp_path / name, store=StoreConfig(sync_interval=1.0))

    async with Router(config("a")) as a, Router(config("b")) as b:
        await asyncio.gather(publish_apart(a, "a"), publish_apart(b, "b"))
        b.mesh.add_peer(a.endpoint)  # a accepts the link: the side that had the client cap
        await wait_for(lambda: a.peer_count() == b.peer_count() == 1, timeout=10)

        async def converged() -> bool:
            counts = [len(await r.history("True", include_cache=False)) for r in (a, b)]
            return counts == [2 * APART, 2 * APART]

        await wait_until(converged, timeout=60, every=0.5)
        for r in (a, b):
            ids = [e.id for e in await r.history("True", include_cache=False)]
            assert len(ids) == len(set(ids)) == 2 * APART
        assert a.mesh.counters["peer_errors"] == b.mesh.counters["peer_errors"] == 0
