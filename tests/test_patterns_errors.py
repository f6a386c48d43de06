"""Run-time errors of pattern code reach the subscriber: counted, rate-limited, with the line;
a missing value is no error; a pattern that only errs is stopped. In the engine (time moved
by hand), through a real router's worker processes to `AsyncClient`, `Client` and local
subscriptions, and to a real `aa subscribe` process's stderr."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support import wait_for

from aa.client import AsyncClient, Client
from aa.mesh import Event, PatternSpec
from aa.router.patterns import HostFacts, PatternEngine

AA = str(Path(sys.executable).with_name("aa"))

#: The first bug everyone writes: `state["n"]` read before it was ever set.
COUNT_SCRIPT = 'state["n"] += 1\nif state["n"] % 2 == 0:\n    forward()\n'


class _Engine:
    """A bare engine (patterns run in-process) with a clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.notices: list[tuple[list[object], object]] = []
        self.stops: list[tuple[list[object], str, str]] = []
        host = HostFacts(
            router_id="r1",
            router_name="r",
            clock=lambda: datetime.now(UTC),
            peer_count=lambda: 0,
        )
        self.engine = PatternEngine(
            host=host,
            on_failure=lambda keys, code, message: self.stops.append((keys, code, message)),
            on_errors=lambda keys, notice: self.notices.append((keys, notice)),
            monotonic=lambda: self.now,
        )


def test_a_script_error_is_told_at_once_then_at_most_once_a_second_with_a_count():
    e = _Engine()
    e.engine.subscribe("count", PatternSpec(format="script", source=COUNT_SCRIPT))
    for i in range(5):
        assert e.engine.match(Event(values={"x": i})) == []
    assert len(e.notices) == 1
    keys, notice = e.notices[0]
    assert keys == ["count"]
    assert (notice.error, notice.line, notice.text, notice.count) == (
        "KeyError: 'n'",
        1,
        'state["n"] += 1',
        1,
    )
    e.now = 0.9
    e.engine.match(Event(values={"x": 5}))
    assert len(e.notices) == 1  # still inside the second
    e.now = 1.0
    e.engine.match(Event(values={"x": 6}))
    assert len(e.notices) == 2 and e.notices[1][1].count == 6  # the 5 held back, and this one
    assert "KeyError: 'n'" in str(e.notices[1][1]) and "6 times" in str(e.notices[1][1])
    assert e.stops == []


def test_a_missing_value_is_no_error_but_a_misspelt_call_is():
    e = _Engine()
    e.engine.subscribe("missing", PatternSpec(source="len(Name) > 1"))
    e.engine.subscribe("typo", PatternSpec(format="script", source="x = 1\nfoward()\n"))
    e.engine.match(Event(values={"Other": 1}))
    assert [(k, n.error, n.line) for k, n in e.notices] == [
        (["typo"], "NameError: name 'foward' is not defined", 2)
    ]


def test_an_expression_error_is_told_and_a_clean_run_keeps_the_pattern():
    e = _Engine()
    e.engine.subscribe("div", PatternSpec(source="100 / Count > 2"))
    engine = e.engine
    for i in range(2500):  # every other run raises: never 1,000 in a row
        out = engine.match(Event(values={"Count": i % 2}))
        assert [k for k, _ in out] == (["div"] if i % 2 else [])
    assert e.stops == [] and len(engine) == 1
    assert e.notices[0][1].error == "ZeroDivisionError: division by zero"


def test_a_pattern_that_only_errs_is_stopped_with_the_reason():
    e = _Engine()
    e.engine.subscribe("count", PatternSpec(format="script", source=COUNT_SCRIPT))
    e.engine.subscribe("fine", PatternSpec(format="script", source="forward()\n"))
    for i in range(1000):
        e.engine.match(Event(values={"x": i}))
    assert [(k, c) for k, c, _ in e.stops] == [(["count"], "pattern-errors")]
    assert "1,000 runs all raised" in e.stops[0][2] and "KeyError: 'n'" in e.stops[0][2]
    assert e.engine.keys() == ["fine"]


async def test_a_worker_script_error_reaches_async_and_blocking_clients_and_local_subs(router):
    """Scripts run in a worker process: the notice crosses the worker's pipe, the router,
    the wire, to each kind of subscriber."""
    told: list[object] = []
    async with AsyncClient(router.endpoint, name="async") as client:
        sub = await client.subscribe(COUNT_SCRIPT, format="script", on_error=told.append)
        assert sub.tier == "worker"
        local = router.subscribe(COUNT_SCRIPT, lambda ev: None, format="script")
        blocking = await asyncio.to_thread(Client, router.endpoint, name="blocking")
        try:
            bsub = await asyncio.to_thread(
                blocking.subscribe, COUNT_SCRIPT, format="script", on_error=lambda n: None
            )
            await wait_for(lambda: len(router.engine) == 3, timeout=20)
            router.publish({"x": 1})
            await wait_for(lambda: told and local.errors and bsub.errors, timeout=20)
        finally:
            await asyncio.to_thread(blocking.close)
        notice = told[0]
        assert (notice.error, notice.line, notice.count) == ("KeyError: 'n'", 1, 1)
        assert sub.errors == 1 and sub.last_error == notice
        assert local.last_error.error == "KeyError: 'n'"
        assert sub.closed is False  # it goes on
        local.close()


async def test_aa_subscribe_prints_each_notice_on_stderr_in_one_line(router, tmp_path):
    script = tmp_path / "count.py"
    script.write_text(COUNT_SCRIPT)
    proc = await asyncio.create_subprocess_exec(
        AA,
        "subscribe",
        "--router",
        router.endpoint,
        "--script",
        str(script),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        await wait_for(lambda: len(router.engine) == 1, timeout=20)
        for i in range(3):
            router.publish({"x": i})
        assert proc.stderr is not None
        async with asyncio.timeout(20):
            line = (await proc.stderr.readline()).decode()
    finally:
        proc.kill()
        await proc.wait()
    assert line.startswith("aa subscribe: the pattern raised: line 1: KeyError: 'n'"), line
    assert 'state["n"] += 1' in line and line.endswith("\n") and line.count("\n") == 1


@pytest.mark.parametrize("bad", [1, None, "x", [[1, 2]], [["w", "e", "c", "l", "t"]]])
def test_a_broken_worker_notice_is_ignored(bad):
    from aa.router.patterns.workers.pool import WorkerPool

    told: list[object] = []
    pool = WorkerPool.__new__(WorkerPool)
    pool._on_errors = lambda keys, notice: told.append(keys)
    pool._by_wkey = {}
    pool._errors(object(), bad)  # type: ignore[arg-type]
    assert told == []


def test_the_predicate_tier_tells_errors_but_a_missing_value_or_type_is_no_match():
    e = _Engine()
    for key, source in (
        ("div", "100 / Count > 2"),
        ("missing", "Count / Other > 1"),
        ("types", "Temperature > 100"),
    ):
        e.engine.subscribe(key, PatternSpec(source=source))
        assert e.engine.tier(PatternSpec(source=source)) == "predicate"
    for values in ({"Count": 0}, {"Other": 1}, {"Temperature": "hot"}):
        e.engine.match(Event(values=values))
    assert [(k, n.error, n.text) for k, n in e.notices] == [
        (["div"], "ZeroDivisionError: division by zero", "100 / Count > 2")
    ]
    for _ in range(1500):  # told, never stopped: its clean runs are not tracked
        e.engine.match(Event(values={"Count": 0}))
    assert e.stops == [] and len(e.engine) == 3
