"""Pattern code never runs in the router: client caches, quench dry runs, history replay and
history queries of worker-tier patterns are evaluated in the workers (issue 11), and a
worker that falls behind tells its subscribers how many events they missed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from support import wait_for

from aa.mesh import META_HISTORICAL, Event, PatternSpec
from aa.router import Router, RouterConfig
from aa.router.store import ExpiryPolicy

PERSIST = {"persist": True}


@pytest.fixture
def in_router(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every evaluation of pattern code in this (the router's) process, recorded: the
    worker processes are others, so this stays empty when nothing runs here."""
    from aa.router.patterns.sandbox import python_kernel, xpath_kernel

    ran: list[str] = []
    for cls in (python_kernel.ScriptProgram, python_kernel.ExprProgram, xpath_kernel.XPathProgram):
        original = cls.run

        def run(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            ran.append(type(self).__name__)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "run", run)
    return ran


@pytest.fixture
async def srouter(tmp_path: Path) -> AsyncIterator[Router]:
    """A router with a SQLite store."""
    async with Router(RouterConfig(port=0, data_dir=tmp_path)) as r:
        yield r


def cache_events(router: Router, client_id: str) -> list[Any]:
    return [e.values["i"] for e in router.caches.fetch(client_id).events]


async def test_a_client_cache_script_runs_in_a_worker(router: Router, in_router: list[str]) -> None:
    spec = PatternSpec(
        format="script", source="if i % 2 == 0:\n    forward(event.with_values(x=1))"
    )
    router.caches.register("phone-1", spec, ExpiryPolicy(max_count=100), 60)
    router.caches.register("phone-2", spec, ExpiryPolicy(max_count=100), 60)  # one matcher for both
    pool = router.engine.workers
    assert pool is not None and len(pool) == 1
    for i in range(10):
        router.publish({"i": i})
    await wait_for(lambda: len(cache_events(router, "phone-1")) == 5, 20)
    # The events as published (not what the script derived), in order, in both caches.
    assert cache_events(router, "phone-1") == cache_events(router, "phone-2") == [0, 2, 4, 6, 8]
    assert router.caches.fetch("phone-1").events[0].values == {"i": 0}
    assert in_router == []
    router.caches.remove("phone-1")
    router.caches.remove("phone-2")
    assert len(pool) == 0


async def test_a_stuck_client_cache_pattern_is_stopped_and_the_router_goes_on(
    router: Router, make_client: Any
) -> None:
    bad = "import re\nif i == 3:\n    re.match('(a+)+$', 'a' * 34 + 'b')\nforward()"
    router.caches.register(
        "evil", PatternSpec(format="script", source=bad), ExpiryPolicy(max_count=100), 60
    )
    victim = await make_client(client_id="victim")
    got: list[Event] = []
    await victim.subscribe("i >= 0", got.append)
    pub = await make_client()
    for i in range(3):
        pub.publish_nowait({"i": i})
    await wait_for(lambda: len(cache_events(router, "evil")) == 3, 20)
    for i in range(3, 8):
        pub.publish_nowait({"i": i})
    await wait_for(lambda: len(got) == 8, 20)
    matcher = router.caches._matchers[("python", "script", bad)][0]
    await wait_for(lambda: matcher.stopped is not None, 20)
    assert "time budget" in matcher.stopped
    assert cache_events(router, "evil") == [0, 1, 2]  # taken before it was stopped, nothing after
    assert router.engine.workers.counters["kills"] == 1


async def test_quench_dry_runs_of_scripts_happen_in_their_worker(
    router: Router, make_client: Any, in_router: list[str]
) -> None:
    pub = await make_client()
    q = await pub.quench({"Price": 100.0})
    sub = await make_client()
    await sub.subscribe("if Price > 1000:\n    forward()", format="script")
    para = await sub.subscribe(
        "if Price > limit:\n    forward()", params={"limit": 50}, format="script"
    )
    await q.wait_interested(timeout=20)
    assert len(q.interest) == 1  # only the second
    await para.update(limit=500)
    await q.wait_uninterested(timeout=20)
    await para.update(limit=5)
    await q.wait_interested(timeout=20)
    assert in_router == []


async def test_history_replay_of_a_script_runs_in_its_worker(
    srouter: Router, open_client: Any, in_router: list[str]
) -> None:
    pub = await open_client(srouter)
    for i in range(10):
        await pub.publish({"i": i}, meta=PERSIST)
    await pub.flush()
    got: list[Event] = []
    await pub.subscribe(
        "if i % 2 == 0:\n    forward()", got.append, format="script", history={"since": None}
    )
    await wait_for(lambda: len(got) == 5, 20)
    await pub.publish({"i": 12})
    await wait_for(lambda: len(got) == 6, 20)
    assert [e.values["i"] for e in got] == [0, 2, 4, 6, 8, 12]
    assert [bool(e.meta.get(META_HISTORICAL)) for e in got] == [True] * 5 + [False]
    # A one-shot history query with a script: evaluated in a worker too.
    found = await srouter.history(
        PatternSpec(format="script", source="if i > 6:\n    forward()"), limit=2
    )
    assert [e.values["i"] for e in found] == [7, 8]
    # ... and a mesh-cache query (`GetCached`) from a client.
    cached = await pub.cached("if i > 7:\n    forward()", format="script")
    assert [e.values["i"] for e in cached] == [8, 9, 12]
    assert in_router == []


async def test_a_worker_that_drops_events_tells_its_subscribers_how_many(
    router: Router, make_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import aa.router.patterns.workers.pool as pool_module

    monkeypatch.setattr(pool_module, "MAX_BACKLOG_EVENTS", 50)
    c = await make_client()
    got: list[Event] = []
    missed: list[int] = []
    await c.subscribe(
        "for i in range(2000):\n    pass\nforward()",
        got.append,
        format="script",
        on_missed=missed.append,
    )
    router.publish({"i": -1})
    await wait_for(lambda: got, 20)  # the worker is up
    for i in range(500):  # dispatched in one go: the worker cannot have answered meanwhile
        router.publish({"i": i})
    pool = router.engine.workers
    dropped = pool.counters["dropped"]
    assert dropped >= 500 - 50 - pool_module.MAX_BATCH_EVENTS
    await wait_for(lambda: pool.warm, 30)
    router.publish({"i": 1000})  # a delivery after the drop carries the notice first
    await wait_for(lambda: got and got[-1].values["i"] == 1000, 30)
    assert sum(missed) == dropped
    assert len(got) - 2 + sum(missed) == 500
