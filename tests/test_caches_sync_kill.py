"""Anti-entropy of the client caches with real processes (issue 16): three `aa router`
processes in a line A–B–C, a phone's cache registered through A, events published on A and on
C while B — C's only path to A — is killed with SIGKILL (its caches, in memory, die with it)
and started again. Once B is back, the phone finds the same events through any router, each
once, without anyone publishing or registering again."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from support import free_tcp_port, wait_until
from test_store_sync_kill import no_router_left, publish, start  # noqa: F401 (a fixture)

from aa.client import AsyncClient, ClientConfig

#: Seconds from B's restart to every copy agreeing: the issue's 10 s after reconnecting, counted
#: from before the links are even back (about 2 s measured on the shared 2-core machine).
CONVERGE_WITHIN = 10.0


def phone(port: int) -> AsyncClient:
    return AsyncClient(
        config=ClientConfig(routers=(f"127.0.0.1:{port}",), client_id="phone", connect_timeout=2.0)
    )


async def cached_ids(port: int) -> list[str] | None:
    """The phone's cache as the router on *port* holds it (None: it has none)."""
    try:
        async with phone(port) as client:
            return [e.id for e in await client.cache_fetch()]  # type: ignore[misc]
    except Exception:  # unknown-cache, or the router is still starting
        return None


async def test_every_copy_of_a_cache_converges_after_a_kill_9_of_the_middle_router(
    tmp_path: Path,
) -> None:
    pa, pb, pc = free_tcp_port(), free_tcp_port(), free_tcp_port()
    a = await start("a", pa, tmp_path)
    b = await start("b", pb, tmp_path, pa)
    c = await start("c", pc, tmp_path, pb)
    procs = [a, b, c]
    try:
        async with phone(pa) as client:
            await client.cache_register("i >= 0", max_count=1000, timeout=600)
        await wait_until(lambda: _has(pc, 0), timeout=30, every=0.2)  # the registration reached C
        await publish(pa, 100, 0)
        await wait_until(lambda: _has(pc, 100), timeout=30, every=0.2)
        os.kill(b.pid, signal.SIGKILL)
        await b.wait()
        await publish(pa, 200, 100)  # reaches neither B nor C
        await publish(pc, 50, 300)  # reaches neither B nor A
        assert len(await cached_ids(pa) or []) == 300 and len(await cached_ids(pc) or []) == 150
        b = await start("b", pb, tmp_path, pa)
        procs[1] = b
        restarted = time.monotonic()

        async def converged() -> bool:
            copies = [await cached_ids(p) for p in (pa, pb, pc)]
            return (
                copies[0] is not None
                and len(copies[0]) == 350
                and all(sorted(x or []) == sorted(copies[0]) for x in copies)
            )

        await wait_until(converged, timeout=60, every=0.3)
        took = time.monotonic() - restarted
        assert took < CONVERGE_WITHIN, f"the copies agreed {took:.1f} s after B restarted"
        for port in (pa, pb, pc):
            ids = await cached_ids(port)
            assert ids is not None and len(ids) == len(set(ids)) == 350
    finally:
        for p in procs:
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            async with asyncio.timeout(20):
                await p.wait()


async def _has(port: int, n: int) -> bool:
    ids = await cached_ids(port)
    return ids is not None and len(ids) >= n
