"""Faults with real `aa router` processes on loopback: `kill -9` of a client's router and of a
router in the middle of a ring; `aa mesh` against the survivors."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from support import FAST, mesh, wait_for

from aa.client import AsyncClient, ClientConfig
from aa.router import Router, RouterConfig
from aa.tools.mesh_cmd import format_mesh

AA = str(Path(sys.executable).with_name("aa"))
#: Short protocol intervals: a dead peer is retried within half a second at most.
FAST_ROUTER = (
    "--no-discovery",
    "--no-http",
    "--retry-base",
    "0.05",
    "--retry-max",
    "0.5",
    "--keepalive",
    "0.3",
    "--info-interval",
    "0.2",
)


class RouterProcess:
    def __init__(self, proc: asyncio.subprocess.Process, endpoint: str) -> None:
        self.proc = proc
        self.endpoint = endpoint

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)


StartRouter = Callable[..., Awaitable[RouterProcess]]


@pytest.fixture
async def start_router() -> AsyncIterator[StartRouter]:
    """Start `aa router` processes; every one still running is stopped at the end."""
    procs: list[asyncio.subprocess.Process] = []

    async def start(*args: str) -> RouterProcess:
        proc = await asyncio.create_subprocess_exec(
            AA,
            "router",
            "--port",
            "0",
            *FAST_ROUTER,
            *args,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        procs.append(proc)
        assert proc.stdout is not None
        async with asyncio.timeout(30):
            line = (await proc.stdout.readline()).decode()
        m = re.search(r"listening on (\S+)", line)
        assert m, line
        return RouterProcess(proc, m.group(1))

    yield start
    for p in procs:
        if p.returncode is None:
            p.terminate()
    for p in procs:
        try:
            async with asyncio.timeout(10):
                await p.wait()
        except TimeoutError:
            p.kill()
            await p.wait()


def client_config(*routers: str) -> ClientConfig:
    return ClientConfig(routers=routers, retry_base=0.05, retry_max=0.5, connect_timeout=2.0)


async def test_client_fails_over_when_its_router_is_killed(start_router: StartRouter) -> None:
    async with Router(RouterConfig(port=0, name="f2", mesh=FAST)) as r2:
        r1 = await start_router("--name", "f1", "--peer", r2.endpoint)
        await wait_for(lambda: r2.peer_count() == 1, timeout=10)
        await _fail_over(r1, r2)


async def _fail_over(r1: RouterProcess, r2: Router) -> None:
    got: list[str] = []
    orphan_got: list[str] = []
    async with (
        AsyncClient(config=client_config(r2.endpoint)) as watcher,
        AsyncClient(config=client_config(r1.endpoint, r2.endpoint)) as orphan,
        AsyncClient(config=client_config(r1.endpoint, r2.endpoint)) as pub,
    ):
        await watcher.subscribe("True", lambda ev: got.append(ev.id))
        await orphan.subscribe("True", lambda ev: orphan_got.append(ev.id))
        assert pub.router is not None and pub.router[2] == r1.endpoint
        assert orphan.router is not None and orphan.router[2] == r1.endpoint

        ids = [pub.publish_nowait({"n": i}) for i in range(1000)]
        await pub.flush(10)  # acknowledged by r1
        ids += [pub.publish_nowait({"n": i}) for i in range(1000, 2000)]  # some in flight
        r1.kill9()
        killed = time.monotonic()
        ids += [pub.publish_nowait({"n": i}) for i in range(2000, 3000)]  # into the outbox

        await wait_for(lambda: pub.router is not None and pub.router[2] == r2.endpoint, timeout=5)
        assert time.monotonic() - killed < 5.0
        await pub.flush(10)  # the outbox drained into r2
        marker = await pub.publish({"marker": True})
        await pub.flush(5)
        await wait_for(lambda: marker in got, timeout=10)
        # r2 dispatched the marker after everything acknowledged before it: all is in.
        assert len(got) == len(set(got)), "an event was delivered twice"
        assert set(got) == set(ids) | {marker}, (
            f"{len(set(ids) - set(got))} acknowledged events lost"
        )

        # The subscriber whose router died is on r2 within 5 s, its pattern registered again.
        await wait_for(
            lambda: orphan.router is not None and orphan.router[2] == r2.endpoint, timeout=5
        )
        assert time.monotonic() - killed < 5.0
        probes: list[str] = []
        async with asyncio.timeout(5):
            while not set(probes) & set(orphan_got):
                probes.append(await pub.publish({"probe": len(probes)}))
                await pub.flush(5)
        assert len(orphan_got) == len(set(orphan_got))


async def test_router_killed_in_the_middle_of_a_ring(start_router: StartRouter) -> None:
    # a - b - c - d - a, with b a process of its own (killed with SIGKILL), the rest here.
    async with mesh(3, [(2, 1), (2, 0)]) as (a, c, d):
        b = await start_router("--name", "rb", "--peer", a.endpoint, "--peer", c.endpoint)
        await wait_for(lambda: a.peer_count() == 2 and c.peer_count() == 2, timeout=10)
        got: list[int] = []
        c.subscribe("n >= 0", lambda ev: got.append(ev.values["n"]))
        async with AsyncClient(config=client_config(a.endpoint)) as pub:
            for i in range(500):
                pub.publish_nowait({"n": i})
            await pub.flush(10)
            await wait_for(lambda: len(got) >= 500)
            b.kill9()
            killed = time.monotonic()
            await pub.publish({"n": 500})
            await pub.flush(5)
            await wait_for(lambda: 500 in got, timeout=5)  # round by d
            assert time.monotonic() - killed < 5.0
            for i in range(501, 1000):
                pub.publish_nowait({"n": i})
            await pub.flush(10)
            await wait_for(lambda: len(got) >= 1000)
        assert sorted(got) == list(range(1000))
        assert [r.counters["dispatched"] for r in (a, c, d)] == [1000, 1000, 1000]

        # a and c notice that b is gone and keep it on their poison lists; `aa mesh` shows it.
        await wait_for(lambda: a.peer_count() == 1 and c.peer_count() == 1)
        proc = await asyncio.create_subprocess_exec(
            AA,
            "mesh",
            "--router",
            a.endpoint,
            "--json",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        async with asyncio.timeout(30):
            out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        info = json.loads(out)
        own = info["routers"][0]
        assert own["name"] == "r0" and own["poisoned"][0]["address"] == b.endpoint
        assert own["counters"]["dispatched"] == 1000
        assert {"r0", "r1", "r2"} <= {r["name"] for r in info["routers"]}
        text = io.StringIO()
        format_mesh(c.mesh_info(), text)
        assert "as seen by r1" in text.getvalue() and f"poisoned: {b.endpoint}" in text.getvalue()
        assert (
            "FROM PEERS  TO PEERS" in text.getvalue()
        )  # flood copies, not the events clients published


async def test_events_acknowledged_by_a_router_that_died_before_flooding_are_not_lost(
    start_router: StartRouter,
) -> None:
    """The harshest case of a lost flood: r1 acknowledges events while it has no peer at all,
    then is killed. The publisher's replay window brings them to r2 after the fail-over."""
    async with Router(RouterConfig(port=0, name="r2", mesh=FAST)) as r2:
        r1 = await start_router("--name", "lonely")
        got: list[int] = []
        r2.subscribe("n >= 0", lambda ev: got.append(ev.values["n"]))
        async with AsyncClient(config=client_config(r1.endpoint, r2.endpoint)) as pub:
            assert pub.router is not None and pub.router[2] == r1.endpoint
            for i in range(300):
                pub.publish_nowait({"n": i})
            await pub.flush(10)  # acknowledged by r1, which floods to nobody
            r1.kill9()
            await wait_for(
                lambda: pub.router is not None and pub.router[2] == r2.endpoint, timeout=5
            )
            await pub.publish({"n": 300})
            await pub.flush(10)
            await wait_for(lambda: 300 in got, timeout=5)
        assert sorted(got) == list(range(301))


def test_the_outbox_keeps_bytes_and_gives_back_the_same_events() -> None:
    """Events waiting, in flight and in the window of acknowledged ones (up to 20,000, for
    10 s) are kept as their bytes, not as the event and its maps: as objects, every full pass
    of the publisher's collector walked them (13-19 ms, the blocking client's longest
    latency at 5,000 events/s; 22 % of a fast publisher's CPU). After a fail-over they go
    out again, in order, under their ids and with their values."""
    import gc

    from aa.client.outbox import Outbox
    from aa.mesh import Event
    from aa.mesh.protocol import packed_event, unpacked_event

    outbox = Outbox(max_events=100_000)
    gc.collect()
    tracked = len(gc.get_objects())

    def event(i: int) -> Event:
        return Event.checked(
            {"Seq": i, "Sensor": "lab-1", "At": [i, 0.5]}, "reading", {}, f"pub:{i}"
        )

    for i in range(20_000):
        outbox.add(event(i))
    gc.collect()
    assert len(gc.get_objects()) - tracked < 100  # waiting: no object per event
    while (batch := outbox.next_batch()) is not None:
        outbox.acked(batch[0], now=1.0)
    gc.collect()
    assert (
        len(gc.get_objects()) - tracked < 200
    )  # a list per acknowledged frame, not 3 objects per event
    outbox.reconnected(now=2.0)
    again = []
    while (batch := outbox.next_batch()) is not None:
        again += batch[1]
        outbox.acked(batch[0], now=2.0)
    assert again[7] == packed_event(event(7))  # the bytes first sent, not packed again
    events = [unpacked_event(data) for data in again]
    assert [e.id for e in events] == [f"pub:{i}" for i in range(20_000)]
    assert (
        events[7].values == {"Seq": 7, "Sensor": "lab-1", "At": [7, 0.5]}
        and events[7].type == "reading"
    )
