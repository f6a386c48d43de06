"""Anti-entropy (issue 16): stores that missed events while a router was down, or a link cut,
get them once the mesh is connected again — every store the same set, each id once."""

from __future__ import annotations

from pathlib import Path

from support import FAST, wait_for, wait_until

from aa.router import Router, RouterConfig, StoreConfig

PERSIST = {"persist": True}
QUICK_SYNC = StoreConfig(sync_interval=0.3)


async def ids_in(router: Router) -> list[str]:
    return sorted(e.id for e in await router.history("True", include_cache=False))  # type: ignore[misc]


async def test_a_router_that_was_down_catches_up_and_so_does_the_one_behind_it(
    tmp_path: Path,
) -> None:
    """A line A–B–C; B (C's only path) is down while A takes persisted events, and C takes
    some of its own: once B is back, all three stores hold every event, once."""

    def config(name: str) -> RouterConfig:
        return RouterConfig(
            port=0, name=name, mesh=FAST, data_dir=tmp_path / name, store=QUICK_SYNC
        )

    async with Router(config("a")) as a, Router(config("c")) as c:
        b = Router(config("b"))
        await b.start()
        b.mesh.add_peer(a.endpoint)
        c.mesh.add_peer(b.endpoint)
        await wait_for(lambda: b.peer_count() == 2, timeout=10)
        for i in range(20):
            a.publish({"i": i}, type="t", meta=PERSIST)
        await wait_for(
            lambda: False if not c.storage.store else c.storage.store.stats().written >= 20,
            timeout=10,
        )
        await b.aclose()  # B goes down
        for i in range(20, 50):
            a.publish({"i": i}, type="t", meta=PERSIST)  # reaches neither B nor C
        for i in range(50, 60):
            c.publish({"i": i}, type="t", meta=PERSIST)  # reaches neither B nor A
        b = Router(config("b"))  # B is back, with its store and topology
        await b.start()
        try:
            b.mesh.add_peer(a.endpoint)
            c.mesh.add_peer(b.endpoint)

            async def converged() -> bool:
                stores = [await ids_in(r) for r in (a, b, c)]
                return len(stores[0]) == 60 and stores[0] == stores[1] == stores[2]

            await wait_until(converged, timeout=30)
            assert len(set(await ids_in(b))) == 60  # each id once
            assert b.storage.sync.counters["events_repaired"] > 0
        finally:
            await b.aclose()
