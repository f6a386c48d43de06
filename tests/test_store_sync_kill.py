"""Anti-entropy with real processes (issue 16): three `aa router` processes in a line A–B–C,
persisted events published on A and on C while B — C's only path to A — is killed with
SIGKILL and started again. Once B is back, every store holds every acknowledged event, each
id once, without anyone publishing again."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support import free_tcp_port, wait_for, wait_until

from aa.client import AsyncClient, ClientConfig

AA = str(Path(sys.executable).with_name("aa"))
PERSIST = {"persist": True}
#: Seconds between two routers' periodic comparisons of their stores (`aa router
#: --store-sync-interval`): short, so that a test waits on the exchange, not on the clock.
SYNC_INTERVAL = 1.0
#: Every router `start` started in the current test, killed at its end if still running.
STARTED: list[asyncio.subprocess.Process] = []


@pytest.fixture(autouse=True)
async def no_router_left() -> AsyncIterator[None]:
    """No router of a test outlives it: one whose start timed out, or one started before
    another's start failed, is killed here (a test stops the routers it knows of itself)."""
    yield
    left, STARTED[:] = list(STARTED), []
    for proc in left:
        if proc.returncode is None:
            proc.kill()
            async with asyncio.timeout(20):
                await proc.wait()


async def start(name: str, port: int, data: Path, *peers: int) -> asyncio.subprocess.Process:
    args = [
        AA,
        "router",
        "--port",
        str(port),
        "--data-dir",
        str(data / name),
        "--no-http",
        "--no-discovery",
        "--retry-base",
        "0.1",
        "--retry-max",
        "0.5",
        "--store-sync-interval",
        str(SYNC_INTERVAL),
        "--name",
        name,
    ]
    for p in peers:
        args += ["--peer", f"127.0.0.1:{p}"]
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    STARTED.append(proc)
    assert proc.stdout is not None
    async with asyncio.timeout(30):
        line = (await proc.stdout.readline()).decode()
    assert re.search(r"listening on 127\.0\.0\.1:\d+", line), line
    return proc


def stored_ids(data: Path, name: str) -> list[str]:
    path = data / name / "events.db"
    if not path.exists():
        return []
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as db:
        return sorted(row[0] for row in db.execute("SELECT id FROM aa_events"))


async def publish(port: int, n: int, start_at: int) -> list[str]:
    config = ClientConfig(routers=(f"127.0.0.1:{port}",), connect_timeout=2.0)
    async with AsyncClient(config=config) as client:
        ids = [
            await client.publish({"i": start_at + i}, type="reading", meta=PERSIST)
            for i in range(n)
        ]
        await client.flush(timeout=30)
    return ids


@pytest.mark.timeout(300)
async def test_every_store_converges_after_a_kill_9_of_the_middle_router(tmp_path: Path) -> None:
    pa, pb, pc = free_tcp_port(), free_tcp_port(), free_tcp_port()
    a = await start("a", pa, tmp_path)
    b = await start("b", pb, tmp_path, pa)
    c = await start("c", pc, tmp_path, pb)
    procs = [a, b, c]
    try:
        acked = await publish(pa, 200, 0)
        await wait_for(lambda: len(stored_ids(tmp_path, "c")) == 200, timeout=30)
        os.kill(b.pid, signal.SIGKILL)
        await b.wait()
        acked += await publish(pa, 300, 200)  # reaches neither B nor C
        acked += await publish(pc, 100, 500)  # reaches neither B nor A
        b = await start("b", pb, tmp_path, pa)
        procs[1] = b

        async def converged() -> bool:
            stores = [stored_ids(tmp_path, n) for n in "abc"]
            return stores[0] == stores[1] == stores[2] and set(acked) <= set(stores[0])

        # Links up, each pair compares stores at once; what must cross B (C's events to A, A's
        # to C) may wait for the next periodic exchange (`--store-sync-interval`), and
        # the routers' own start takes seconds on a busy machine: two intervals, then a margin.
        await wait_until(converged, timeout=2 * SYNC_INTERVAL + 30, every=0.2)
        for name in "abc":
            ids = stored_ids(tmp_path, name)
            assert len(ids) == len(set(ids)) == 600
    finally:
        for p in procs:
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            async with asyncio.timeout(20):
                await p.wait()
