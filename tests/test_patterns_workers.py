"""The worker tier: patterns that are code run in sandbox worker processes, and everything
that worked in-process keeps working there (groups, round-robin, parametric updates)."""

from __future__ import annotations

import asyncio
import os
import signal
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
from support import wait_for

from aa.mesh import Event, PatternError, PatternSpec, UsageError
from aa.router import Router
from aa.router.patterns.workers import WorkerConfig


async def until(condition: Any, timeout: float = 10.0) -> None:
    """Await *condition()* becoming true (`support.wait_for`)."""
    await wait_for(condition, timeout)


def worker_pids(router: Router) -> list[int]:
    pool = router.engine.workers
    assert pool is not None
    return [s.proc.pid for s in pool._slots if s.proc is not None and s.proc.pid is not None]


def proc_file(pid: int, name: str) -> str:
    """/proc/<pid>/<name> (the kernel answers at once: no blocking worth an executor)."""
    return Path(f"/proc/{pid}/{name}").read_text()


@pytest.mark.parametrize(
    "source, fmt, kernel, tier",
    [
        ("Temperature > 100 and Sensor.startswith('lab')", "expr", "python", "predicate"),
        ("n % k == 0", "expr", "python", "predicate"),
        ("len(Name) < 5 or Name.lower() in ('a', 'b')", "expr", "python", "predicate"),
        ("pow(a, b, m) > 0", "expr", "python", "worker"),
        ("re.match('x', Name) is not None", "expr", "python", "worker"),
        ("sorted(Readings)[0] > 1", "expr", "python", "worker"),
        ("2 ** n > 4", "expr", "python", "predicate"),
        ("forward()", "script", "python", "worker"),
        ("/event/values/T > 1", "expr", "xpath", "worker"),
    ],
)
def test_each_pattern_gets_its_tier(source: str, fmt: str, kernel: str, tier: str) -> None:
    """The closed grammar is the predicate compiler's (`grammar.py`); everything else is
    pattern code, for the workers."""
    from datetime import datetime

    from aa.router.patterns import HostFacts, PatternEngine

    host = HostFacts(
        router_id="r",
        router_name="r",
        clock=lambda: datetime.now(UTC),
        peer_count=lambda: 0,
    )
    engine = PatternEngine(host=host, on_failure=lambda *a: None, isolation="workers")
    assert engine.tier(PatternSpec(kernel=kernel, format=fmt, source=source)) == tier


def test_config_is_validated() -> None:
    with pytest.raises(UsageError):
        WorkerConfig(workers=0)
    with pytest.raises(UsageError):
        WorkerConfig(kill_after=-1)
    with pytest.raises(UsageError):
        WorkerConfig(memory=1024)


async def test_a_script_runs_in_a_worker_and_derives_events(router, make_client):
    # An in-process subscription: the client library drops every id-less (derived) event
    # after the first as a duplicate (reported to the lead), which is not under test here.
    got: list[Event] = []
    router.subscribe(
        "if Temperature > 30:\n    forward(event.with_values(Alarm=True))",
        got.append,
        format="script",
    )
    pub = await make_client()
    for t in (10, 40, 20, 50):
        pub.publish_nowait({"Temperature": t})
    await until(lambda: len(got) == 2)
    assert [e.values for e in got] == [
        {"Temperature": 40, "Alarm": True},
        {"Temperature": 50, "Alarm": True},
    ]
    assert all(e.id is None for e in got)  # derived events have no id of their own
    pids = worker_pids(router)
    assert pids and os.getpid() not in pids


async def test_an_expression_in_a_worker_reads_or_like_python(router, make_client):
    """A missing name makes only its own comparison false in the worker tier too."""
    got: list[Event] = []
    source = 'sorted([1]) and (Temperature > 100 or Flag == "x")'
    router.subscribe(source, got.append)
    assert router.engine.tier(PatternSpec(source=source)) == "worker"
    pub = await make_client()
    for values in ({"Flag": "x"}, {"Flag": "y"}, {"Temperature": 200}, {"Temperature": "hot"}):
        pub.publish_nowait(values)
    pub.publish_nowait({"Flag": "x", "last": True})
    await until(lambda: len(got) == 3)
    assert [e.values for e in got] == [
        {"Flag": "x"},
        {"Temperature": 200},
        {"Flag": "x", "last": True},
    ]


async def test_the_worker_holds_nothing_but_its_pipe_and_is_limited(router, make_client):
    c = await make_client()
    got: list[Event] = []
    await c.subscribe("forward()", got.append, format="script")
    (await make_client()).publish_nowait({"x": 1})
    await until(lambda: got)
    (pid,) = worker_pids(router)
    fds = sorted(int(n) for n in os.listdir(f"/proc/{pid}/fd"))
    assert fds == [0, 1]
    limits = proc_file(pid, "limits")
    assert "Max open files            2" in limits
    assert "Max address space         unlimited" not in limits
    assert "Max cpu time              unlimited" not in limits


async def test_groups_share_state_and_round_robin_in_a_worker(router, make_client):
    script = (
        "n = state.get('n', 0)\n"
        "state['n'] = n + 1\n"
        "forward(event.with_values(n=n), to=subscribers[n % len(subscribers)])\n"
    )
    got_a: list[Event] = []
    got_b: list[Event] = []
    router.subscribe(script, got_a.append, format="script")  # in-process: see above
    router.subscribe(script, got_b.append, format="script")
    assert router.engine.instance_count == 1
    pub = await make_client()
    for i in range(6):
        pub.publish_nowait({"i": i})
    await until(lambda: len(got_a) + len(got_b) == 6)
    assert [e.values["n"] for e in got_a] == [0, 2, 4]
    assert [e.values["n"] for e in got_b] == [1, 3, 5]


async def test_updates_in_a_worker_lose_nothing_and_double_nothing(router, client, make_client):
    got: list[Event] = []
    sub = await client.subscribe(
        "if n % k == 0:\n    forward()", got.append, params={"k": 2}, format="script"
    )
    pub = await make_client()
    for i in range(2000):
        pub.publish_nowait({"n": i, "phase": 0})
    await pub.flush(timeout=20)
    await sub.update(k=3)
    for i in range(2000):
        pub.publish_nowait({"n": i, "phase": 1})
    await pub.flush(timeout=20)
    expected0, expected1 = list(range(0, 2000, 2)), list(range(0, 2000, 3))
    await until(lambda: len(got) >= len(expected0) + len(expected1), timeout=30)
    assert [e.values["n"] for e in got if e.values["phase"] == 0] == expected0
    assert [e.values["n"] for e in got if e.values["phase"] == 1] == expected1
    assert len({e.id for e in got}) == len(got)


async def test_a_short_bad_script_is_refused_at_subscribe(client):
    with pytest.raises(PatternError) as info:
        await client.subscribe("import os\nforward()", format="script")
    assert info.value.code == "pattern-refused"


async def test_a_long_bad_script_is_refused_by_its_worker(router, client, make_client):
    source = "x = 1\n" * 200 + "import os\n"
    assert len(source) > 512
    sub = await client.subscribe(source, format="script")
    with pytest.raises(PatternError) as info:
        async with asyncio.timeout(20):
            await sub.get()
    assert info.value.code == "pattern-refused" and "import" in str(info.value)


async def test_a_killed_worker_is_replaced_and_its_patterns_recreated(router, make_client):
    counter = "state['n'] = state.get('n', 0) + 1\nforward(event.with_values(n=state['n']))"
    got: list[Event] = []
    router.subscribe(counter, got.append, format="script")  # in-process: see above
    pub = await make_client()
    pub.publish_nowait({"i": 0})
    await until(lambda: len(got) == 1)
    (pid,) = worker_pids(router)
    os.kill(pid, signal.SIGKILL)
    await until(lambda: worker_pids(router) and worker_pids(router)[0] != pid)
    pub.publish_nowait({"i": 1})
    await until(lambda: len(got) == 2)
    # Re-created from its source: its state started again (the README says so).
    assert got[1].values == {"i": 1, "n": 1}
    assert router.engine.workers.counters["replaced"] == 1


async def test_a_stuck_pattern_is_stopped_and_its_neighbours_recreated(router, make_client):
    neighbour, attacker = await make_client(client_id="n1"), await make_client(client_id="a1")
    got: list[Event] = []
    await neighbour.subscribe("forward()", got.append, format="script")
    # Same worker as the neighbour? Only with one worker: force it.
    router.engine.workers.config = WorkerConfig(workers=1)
    bad = await attacker.subscribe(
        "import re\nif i == 1:\n    re.match('(a+)+$', 'a' * 34 + 'b')", format="script"
    )
    pub = await make_client()
    for i in range(4):
        pub.publish_nowait({"i": i})
    with pytest.raises(PatternError) as info:
        async with asyncio.timeout(20):
            await bad.get()
    assert info.value.code == "pattern-timeout"
    await until(lambda: len(got) == 4)
    assert [e.values["i"] for e in got] == [0, 1, 2, 3]


async def test_a_worker_that_falls_behind_gets_a_capped_backlog(router, monkeypatch):
    import aa.router.patterns.workers.pool as pool_module

    monkeypatch.setattr(pool_module, "MAX_BACKLOG_EVENTS", 50)
    got: list[Event] = []
    router.subscribe("for i in range(2000):\n    pass\nforward()", got.append, format="script")
    router.publish({"i": -1})
    await until(lambda: got)  # the worker is up
    for i in range(500):  # dispatched in one go: the worker cannot have answered meanwhile
        router.publish({"i": i})
    pool = router.engine.workers
    assert pool.counters["dropped"] >= 500 - 50 - pool_module.MAX_BATCH_EVENTS
    await until(lambda: pool.warm, timeout=30)
    kept = [e.values["i"] for e in got[1:]]
    assert kept == sorted(kept) and len(kept) == 500 - pool.counters["dropped"]


async def test_workers_are_forked_and_still_replaced_once_their_zygote_is_gone(router, make_client):
    got: list[Event] = []
    router.subscribe("forward()", got.append, format="script")
    pub = await make_client()
    pub.publish_nowait({"i": 0})
    await until(lambda: len(got) == 1)
    pool = router.engine.workers
    zygote = await pool._the_zygote()
    assert zygote is not None and zygote._proc is not None
    (pid,) = worker_pids(router)
    assert f"PPid:\t{zygote._proc.pid}\n" in proc_file(pid, "status")  # forked by it
    os.kill(zygote._proc.pid, signal.SIGKILL)
    await until(lambda: zygote.gone)
    await until(lambda: pool.warm, timeout=30)
    os.kill(pid, signal.SIGKILL)  # its exit code is nobody's to tell now: a crash, replaced
    await until(lambda: worker_pids(router) and worker_pids(router)[0] != pid, timeout=30)
    pub.publish_nowait({"i": 1})
    await until(lambda: len(got) == 2, timeout=30)
    assert pool.counters["replaced"] == 1
