"""Anti-entropy of the client caches (issue 16): a router that was down, or cut off, while
cached events arrived — or while caches were created, changed, removed — catches up once
linked again: every copy of a cache holds the same ids, once, within its own limits."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest
from support import FAST, wait_for

from aa.mesh import Event, PatternSpec
from aa.router import CacheConfig, ExpiryPolicy, Router, RouterConfig
from aa.router.caches import ClientCacheService

QUICK = CacheConfig(sweep_interval=0.05, sync_interval=0.3)
#: Seconds within which copies must agree once the mesh is connected again (the issue's 10 s).
CONVERGE_WITHIN = 10.0


def config(name: str) -> RouterConfig:
    return RouterConfig(port=0, name=name, mesh=FAST, caches=QUICK)


def ids(router: Router, client: str) -> list[str]:
    return [e.id for e in router.caches.fetch(client).events]  # type: ignore[misc]


class Cable:
    """A TCP relay on 127.0.0.1 between two routers that the test can cut and mend: cut, it
    drops the connections it carries and refuses new ones (real sockets: a real partition)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.up = True
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Cable:
        self._server = await asyncio.start_server(self._carry, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cut()
        assert self._server is not None
        self._server.close()

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def cut(self) -> None:
        self.up = False
        for w in self._writers:
            w.transport.abort()
        self._writers.clear()

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.up:
            writer.transport.abort()
            return
        r2, w2 = await asyncio.open_connection(*self.target)
        self._writers |= {writer, w2}

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            finally:
                dst.transport.abort()

        await asyncio.gather(pump(reader, w2), pump(r2, writer))


async def test_a_router_that_was_down_catches_up_and_so_does_the_one_behind_it() -> None:
    """A line A–B–C. B (C's only path) is down while A and C cache events and A creates,
    changes and removes caches; once B is back, the three copies of each cache agree."""
    async with Router(config("a")) as a, Router(config("c")) as c:
        b = Router(config("b"))
        await b.start()
        b.mesh.add_peer(a.endpoint)
        c.mesh.add_peer(b.endpoint)
        await wait_for(lambda: b.peer_count() == 2, timeout=10)
        a.caches.register(
            "phone", PatternSpec(source="i >= 0"), ExpiryPolicy(max_count=1000), 600.0
        )
        a.caches.register("few", PatternSpec(source="i >= 0"), ExpiryPolicy(max_count=25), 600.0)
        a.caches.register("doomed", PatternSpec(source="i >= 0"), ExpiryPolicy(), 600.0)
        await wait_for(
            lambda: all(n in r.caches for r in (b, c) for n in ("phone", "few", "doomed")),
            timeout=10,
        )
        for i in range(20):
            a.publish({"i": i})
        await wait_for(lambda: len(ids(c, "phone")) == 20, timeout=10)
        a.caches.ack("phone", ids(a, "phone")[4])  # acked: the first five go everywhere
        await wait_for(lambda: len(ids(c, "phone")) == 15, timeout=10)

        await b.aclose()  # B goes down: its caches (in memory) are gone
        a.caches.register(
            "late", PatternSpec(source="i >= 40"), ExpiryPolicy(), 600.0
        )  # C never hears of it
        for i in range(20, 50):
            a.publish({"i": i})  # reaches neither B nor C
        for i in range(50, 60):
            c.publish({"i": i})  # reaches neither B nor A
        a.caches.ack("phone", ids(a, "phone")[4])  # five more; the ack does not reach C
        a.caches.set_policy("few", ExpiryPolicy(max_count=30))  # nor this change
        a.caches.remove("doomed")  # nor this removal
        assert (
            len(ids(c, "phone")) == 25
            and len(ids(a, "phone")) == 40
            and "doomed" in c.caches
            and "late" not in c.caches
        )

        b = Router(config("b"))  # B is back, empty
        await b.start()
        try:
            b.mesh.add_peer(a.endpoint)
            c.mesh.add_peer(b.endpoint)
            await wait_for(lambda: b.peer_count() == 2, timeout=10)
            linked = time.monotonic()
            routers = (a, b, c)

            def converged() -> bool:
                if any("doomed" in r.caches or "late" not in r.caches for r in routers):
                    return False
                return all(
                    len({tuple(sorted(ids(r, n))) for r in routers}) == 1
                    for n in ("phone", "few", "late")
                )

            try:
                await wait_for(converged, timeout=30)
            except TimeoutError:
                state = {
                    r.name: {
                        n: sorted(ids(r, n)) if n in r.caches else None
                        for n in ("phone", "few", "late", "doomed")
                    }
                    for r in routers
                }
                raise AssertionError(f"copies differ: {state}") from None
            took = time.monotonic() - linked
            assert took < CONVERGE_WITHIN, f"converged {took:.1f} s after the mesh reconnected"
            phone = ids(b, "phone")
            assert len(phone) == len(set(phone)) == 50  # 60 published, 10 acknowledged, each once
            assert {e.values["i"] for e in b.caches.fetch("phone").events} == set(range(10, 60))
            assert len(ids(b, "few")) == 30 and all(
                r.caches.info("few").policy.max_count == 30 for r in routers
            )
            assert (
                ids(a, "few") == ids(b, "few") == ids(c, "few")
            )  # the same newest 30, in the same order
            assert sorted(e.values["i"] for e in c.caches.fetch("late").events) == list(
                range(40, 50)
            )  # C took 50–59 before it knew the cache
            assert b.caches.sync.counters["events_repaired"] > 0
        finally:
            await b.aclose()


async def test_a_partition_heals_both_ways_and_the_age_limit_holds() -> None:
    """Two routers cut apart (the link closed, neither restarted) cache events each on its own
    side; after the cut both hold both sides' events; events past the age limit stay out."""
    async with Router(config("a")) as a, Router(config("b")) as b, Cable(a.address) as cable:
        b.mesh.add_peer(cable.endpoint)
        await wait_for(lambda: a.peer_count() == 1, timeout=10)
        a.caches.register(
            "app", PatternSpec(source="True"), ExpiryPolicy(max_age=timedelta(seconds=3)), 600.0
        )
        await wait_for(lambda: "app" in b.caches, timeout=10)
        cable.cut()
        await wait_for(lambda: a.peer_count() == 0 and b.peer_count() == 0, timeout=10)
        for i in range(10):
            a.publish({"i": i})
            b.publish({"i": 100 + i})
        assert len(ids(a, "app")) == len(ids(b, "app")) == 10
        cable.up = True  # mended: B's next redial goes through
        try:
            await wait_for(
                lambda: sorted(ids(a, "app")) == sorted(ids(b, "app")) and len(ids(a, "app")) == 20,
                timeout=CONVERGE_WITHIN,
            )
        except TimeoutError:
            raise AssertionError(
                f"{a.peer_count()} {b.peer_count()} {len(ids(a, 'app'))} {len(ids(b, 'app'))} "
                f"{a.caches.sync.counters} {b.caches.sync.counters}"
            ) from None
        assert ids(a, "app") == ids(b, "app")  # one order everywhere
        # The age limit is the events' own: they leave both copies together, none comes back.
        await wait_for(lambda: ids(a, "app") == [] and ids(b, "app") == [], timeout=10)
        await wait_for(lambda: b.caches.sync.counters["received_digest"] >= 3, timeout=10)
        assert ids(a, "app") == ids(b, "app") == []


async def test_a_cache_whose_pattern_runs_in_a_worker_heals_too() -> None:
    """A script pattern never runs in the router, so a peer's events for its cache could not
    be checked there and were never repaired (such caches caught up by the flood only): they
    are checked in a worker, then kept."""
    script = PatternSpec(kernel="python", format="script", source="if i % 2 == 0:\n    forward()")
    async with Router(config("a")) as a, Router(config("b")) as b, Cable(a.address) as cable:
        b.mesh.add_peer(cable.endpoint)
        await wait_for(lambda: a.peer_count() == 1, timeout=10)
        a.caches.register("app", script, ExpiryPolicy(), 600.0)
        await wait_for(lambda: "app" in b.caches, timeout=10)
        cable.cut()
        await wait_for(lambda: a.peer_count() == 0 and b.peer_count() == 0, timeout=10)
        for i in range(20):
            a.publish({"i": i})
            b.publish({"i": 100 + i})
        await wait_for(
            lambda: len(ids(a, "app")) == len(ids(b, "app")) == 10, timeout=10
        )  # the workers' verdicts
        cable.up = True
        try:
            await wait_for(
                lambda: sorted(ids(a, "app")) == sorted(ids(b, "app")) and len(ids(a, "app")) == 20,
                timeout=CONVERGE_WITHIN,
            )
        except TimeoutError:
            raise AssertionError(
                f"{len(ids(a, 'app'))} {len(ids(b, 'app'))} {a.caches.sync.counters} "
                f"{b.caches.sync.counters}"
            ) from None
        assert sorted(e.values["i"] for e in a.caches.fetch("app").events) == [
            *range(0, 20, 2),
            *range(100, 120, 2),
        ]
        assert (
            a.caches.sync.counters["events_repaired"]
            == b.caches.sync.counters["events_repaired"]
            == 10
        )


class Cut:
    """Controls whose floods go nowhere: two services that only anti-entropy connects."""

    def on_control(self, topic: str, callback: object) -> object:
        return lambda: None

    def flood_control(self, topic: str, body: object = None, *, to: object = None) -> str:
        return "lost"


def service() -> ClientCacheService:
    return ClientCacheService(
        CacheConfig(), controls=Cut(), matcher=lambda spec, scope=None: lambda e: True, sinks=[]
    )


def exchange(x: ClientCacheService, y: ClientCacheService, now: float) -> int:
    """Run the sans-I/O exchange between *x* and *y* to its end; the messages it took."""
    queue = [(y, "x", x.sync.digest(now)), (x, "y", y.sync.digest(now))]
    sent = 0
    while queue:
        to, frm, body = queue.pop(0)
        sent += 1
        assert sent < 100, "the exchange does not end"
        back, name = (x, "y") if frm == "x" else (y, "x")
        queue += [(back, name, reply) for reply in to.sync.receive(frm, body, now)]
    return sent


def test_concurrent_changes_the_last_one_wins_everywhere_and_a_removal_stays_removed() -> None:
    a, b = service(), service()
    a.register("c", PatternSpec(source="True"), ExpiryPolicy(max_count=10), 600.0)
    exchange(a, b, time.time())
    assert "c" in b and b.info("c").policy.max_count == 10
    # Cut apart: each side changes the cache; B's change is the later one.
    a.set_policy("c", ExpiryPolicy(max_count=5))
    b.set_policy("c", ExpiryPolicy(max_count=7))
    exchange(a, b, time.time() + 2)
    assert a.info("c").policy.max_count == b.info("c").policy.max_count == 7
    # A removes it while B (cut off again) keeps it alive: the removal is later, it wins, and
    # B's copy does not bring the cache back at the next exchanges.
    a.remove("c")
    assert b.keepalive("c")
    exchange(a, b, time.time() + 4)
    exchange(a, b, time.time() + 6)
    assert "c" not in a and "c" not in b
    # A client that registers again afterwards gets its cache back everywhere.
    b.register("c", PatternSpec(source="True"), ExpiryPolicy(), 600.0)
    exchange(a, b, time.time() + 8)
    assert "c" in a


def test_equal_copies_cost_one_digest_each_way() -> None:
    a, b = service(), service()
    a.register("c", PatternSpec(source="True"), ExpiryPolicy(), 600.0)
    now = time.time()
    exchange(a, b, now)
    a._offer(Event(values={"i": 1}, id="e1", meta={"time": datetime.now(UTC)}))
    assert exchange(a, b, now + 2) > 2 and [e.id for e in b.fetch("c").events] == ["e1"]
    assert exchange(a, b, now + 4) == 2  # nothing differs: the two digests, nothing more


def test_a_digest_hashes_each_shared_log_once_and_a_lone_router_hashes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Many clients caching the same pattern share one log: the periodic digest must not
    hash it once per client (a low-privilege user's hundreds of caches stalled the loop for
    everyone), yet say for each cache exactly what a peer would compute from its events."""
    from aa.router.caches import clientcaches

    a = service()
    now = time.time()
    for k in range(200):
        a.register(f"c{k}", PatternSpec(source="True"), ExpiryPolicy(), 600.0)
    for i in range(300):
        a._offer(Event(values={"i": i}, id=f"e{i}", meta={"time": datetime.now(UTC)}))
    a.ack("c7", "e99")  # one cache acknowledged part of the shared log
    hashed = 0
    real = clientcaches.id_hash

    def counting(eid: str) -> int:
        nonlocal hashed
        hashed += 1
        return real(eid)

    monkeypatch.setattr(clientcaches, "id_hash", counting)
    rows = {r[0]: (r[4], int(r[5], 16)) for r in a.sync.digest(now)["caches"]}
    assert hashed <= 300, hashed  # one pass over the shared log, not 200
    for client in ("c0", "c7", "c199"):
        events = a.fetch(client).events
        xor = 0
        for e in events:
            xor ^= real(e.id or "")
        assert rows[client] == (len(events), xor)
    assert rows["c7"][0] == 200 and rows["c0"][0] == 300
    # A router without peers has no one to tell: its sync round hashes nothing.
    hashed = 0
    a._peers = Peers()
    a._spread()
    assert hashed == 0


class Peers:
    def peer_ids(self) -> list[str]:
        return []
