"""The CPU each pattern costs, on each tier: counted (the thread's CPU clock in the router,
the workers' per-batch figures), ranked by `PatternEngine.cpu_top`, served at
``GET /patterns/live`` and shown by ``aa top``'s patterns pane."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from http_helpers import open_server
from support import wait_for
from support.worker_bench import CHEAP, COSTLY, batch, charged, in_process_worker, subscribe
from test_cli_top import aa_top

from aa.client import AsyncClient
from aa.mesh import Event, PatternSpec
from aa.router.patterns import CPU_SAMPLE_EVERY, MAX_CPU_TOP, HostFacts, PatternEngine
from aa.router.patterns.workers import child


def in_process() -> PatternEngine:
    host = HostFacts(
        router_id="r",
        router_name="r",
        clock=lambda: datetime(2024, 5, 1, tzinfo=UTC),
        peer_count=lambda: 0,
    )
    return PatternEngine(host=host, on_failure=lambda keys, code, message: None)


def script(source: str) -> PatternSpec:
    return PatternSpec(format="script", source=source)


def test_the_costly_script_ranks_first_in_process() -> None:
    engine = in_process()
    engine.subscribe("cheap", script(CHEAP))
    engine.subscribe("costly-1", script(COSTLY))
    engine.subscribe("costly-2", script(COSTLY))
    engine.subscribe("predicate", PatternSpec(source="n > 5 and kind == 'x'"))
    for n in range(CPU_SAMPLE_EVERY * 4):
        engine.match(Event(values={"n": n, "kind": "x"}))
    top = engine.cpu_top(10)
    assert [c.spec.source for c in top[:2]] == [COSTLY, CHEAP]
    assert top[0].tier == "sandbox" and top[0].subscribers == 2
    assert top[0].cpu > 10 * top[1].cpu > 0
    predicate = next(c for c in top if c.tier == "predicate")
    assert predicate.cpu > 0 and predicate.subscribers == 1
    # of some subscribers only, and capped
    assert [c.spec.source for c in engine.cpu_top(10, ["cheap"])] == [CHEAP]
    assert len(engine.cpu_top(MAX_CPU_TOP + 50)) == 3
    assert engine.cpu_top(0) == []
    # a pattern whose subscribers left is not listed, and a cheap one that turns dear rises
    engine.unsubscribe("costly-1")
    engine.unsubscribe("costly-2")
    assert [c.spec.source for c in engine.cpu_top(10)][:1] == [CHEAP]
    engine.subscribe("costly-3", script(COSTLY))
    for n in range(CPU_SAMPLE_EVERY * 2):
        engine.match(Event(values={"n": n, "kind": "x"}))
    assert [c.spec.source for c in engine.cpu_top(1)] == [COSTLY]


async def test_worker_scripts_report_their_cpu_and_aa_top_ranks_them() -> None:
    async with (
        open_server() as (router, endpoint),
        httpx.AsyncClient(base_url=endpoint.url) as http,
        AsyncClient(router.endpoint, name="watcher") as watcher,
    ):
        got: list[Any] = []
        await watcher.subscribe(COSTLY, got.append, format="script")
        await watcher.subscribe(CHEAP, got.append, format="script")
        assert router.engine.by_tier()["worker"] == 2
        sent = 0

        async def ranked() -> bool:
            nonlocal sent
            for _ in range(20):
                router.publish({"n": sent})
                sent += 1
            items = (await http.get("/patterns/live")).json()["items"]
            return len(items) == 2 and items[1]["cpu"] > 0

        async with asyncio.timeout(30):
            while not await ranked():
                await wait_for(lambda want=2 * sent: len(got) >= want, timeout=10)
        items = (await http.get("/patterns/live")).json()["items"]
        assert [x["pattern"] for x in items] == [COSTLY, CHEAP]
        assert [x["tier"] for x in items] == ["worker", "worker"]
        assert items[0]["cpu"] > 2 * items[1]["cpu"]
        assert (await http.get("/patterns/live", params={"limit": 1000})).status_code == 422

        flowing = True

        async def publish() -> None:  # paced by the deliveries: the worker keeps up
            nonlocal sent
            while flowing:
                for _ in range(2):
                    router.publish({"n": sent})
                    sent += 1
                await wait_for(lambda want=2 * sent: len(got) >= want, timeout=10)

        task = asyncio.create_task(publish())
        try:
            code, out, err = await aa_top("--once", "--interval", "1", endpoint.url)
        finally:
            flowing = False
            await task
    assert code == 0 and err == "", err
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "patterns, the most CPU first" in line)
    header = lines[start + 1].split()
    assert header == ["PATTERN", "KIND", "TIER", "SUBSCRIBERS", "CPU%", "CPU"], out
    first, second = lines[start + 2].strip(), lines[start + 3].strip()
    assert first.startswith("total = 0 for i in range(1000):") and "worker" in first, out
    assert second.startswith("if n >= 0: forward()"), out
    assert float(first.split()[-2]) > float(second.split()[-2]), out


def test_a_worker_charges_each_script_its_cpu_not_the_wall_time_others_took(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The machine gives the worker's core to another process in the middle of every
    evaluation (its wall clock jumps a millisecond between any two readings): the cheap
    script is still charged its own CPU, a small fraction of the costly one's."""
    wall = [0.0]

    def busy_machine() -> float:
        wall[0] += 0.001
        return wall[0]

    monkeypatch.setattr(child, "_perf", busy_machine)
    with in_process_worker() as (worker, replies):
        subscribe(worker, 1, COSTLY, "a")
        subscribe(worker, 2, CHEAP, "a")
        for seq in range(5):
            batch(worker, seq, 40)
    assert [r[0] for r in replies] == ["done"] * 5, replies
    assert sum(len(r[2]) for r in replies) == 2 * 2 * 5 * 40  # every event to both
    spent = charged(replies)
    assert spent[1] > 3 * spent[2] > 0, spent
