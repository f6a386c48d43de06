"""Clients say what happens to their connection: a real router stopped and started again
on the same port; `aa subscribe` prints "disconnected from" and "reconnected to" and gets
the event published after the restart; the library's callbacks say the same; the back-off
after a loss stays short for the first minute."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from support import free_tcp_port, wait_for

from aa.client import AsyncClient, ClientConfig
from aa.mesh import PeerTable, Source
from aa.router import Router, RouterConfig

AA = str(Path(sys.executable).with_name("aa"))


async def _router(port: int) -> Router:
    router = Router(RouterConfig(port=port, name="restarting"))
    await router.start()
    return router


async def _line(stream: asyncio.StreamReader) -> str:
    async with asyncio.timeout(30):
        return (await stream.readline()).decode()


async def test_aa_subscribe_says_disconnected_and_reconnected_and_gets_events_after():
    port = free_tcp_port()
    router = await _router(port)
    proc = await asyncio.create_subprocess_exec(
        AA,
        "subscribe",
        "--router",
        f"127.0.0.1:{port}",
        "--count",
        "1",
        "Temperature > 100",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        await wait_for(lambda: len(router.engine) == 1, timeout=20)
        await router.aclose()
        gone = await _line(proc.stderr)
        assert gone == f"aa subscribe: disconnected from 127.0.0.1:{port}; reconnecting\n"
        router = await _router(port)  # the same port, a new router: nothing of the old one
        back = await _line(proc.stderr)
        assert back == f"aa subscribe: reconnected to 127.0.0.1:{port}\n"
        await wait_for(lambda: len(router.engine) == 1, timeout=20)  # subscribed again
        router.publish({"Temperature": 120})
        assert await _line(proc.stdout) == "Temperature=120\n"
        async with asyncio.timeout(20):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await router.aclose()


async def test_the_library_calls_on_disconnect_and_on_reconnect():
    port = free_tcp_port()
    router = await _router(port)
    said: list[tuple[str, str]] = []
    lost, back = asyncio.Event(), asyncio.Event()

    def on_disconnect(endpoint: str) -> None:
        said.append(("lost", endpoint))
        lost.set()

    def on_reconnect(endpoint: str) -> None:
        said.append(("back", endpoint))
        back.set()

    try:
        async with AsyncClient(
            f"127.0.0.1:{port}", on_disconnect=on_disconnect, on_reconnect=on_reconnect
        ) as client:
            sub = await client.subscribe("x == 1")
            await router.aclose()
            async with asyncio.timeout(20):
                await lost.wait()
            router = await _router(port)
            async with asyncio.timeout(20):
                await back.wait()
            await wait_for(lambda: len(router.engine) == 1, timeout=20)
            router.publish({"x": 1})
            async with asyncio.timeout(20):
                assert (await sub.get()).values == {"x": 1}
        assert said == [("lost", f"127.0.0.1:{port}"), ("back", f"127.0.0.1:{port}")]
    finally:
        await router.aclose()


def test_a_lost_router_is_retried_within_the_fast_cap_whatever_the_failures():
    table = PeerTable(retry_base=0.2, retry_max=30.0)
    table.add("127.0.0.1:1", source=Source.CONFIGURED, now=0.0)
    for _ in range(12):  # uncapped, the interval would be 30 s by now
        uncapped = table.retry_delay(12)
        at = table.record_failure("127.0.0.1:1", 100.0, cap=2.0)
    assert uncapped > 20 and at is not None and at <= 102.0
    assert ClientConfig().retry_fast_max <= 5 and ClientConfig().retry_fast_period >= 60
