"""Silent connections cannot hold the router (attack a9/a10): a connection that never says
hello is cut after the hello deadline, the oldest silent ones make room for new callers, a
cap per address and in total refuses with a reason, and a router at 1,024 open files still
lets a client in while a stranger holds more sockets than that."""

from __future__ import annotations

import asyncio
import os
import re
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import wait_for

from aa.client import AsyncClient
from aa.mesh import Connection
from aa.mesh.protocol import Error
from aa.router import Router, RouterConfig
from aa.router.security import SecurityConfig

AA = str(Path(sys.executable).with_name("aa"))


async def closed_by_router(reader: asyncio.StreamReader, timeout: float) -> bytes:
    """Everything the router wrote before it closed the connection."""
    data = b""
    async with asyncio.timeout(timeout):
        while chunk := await reader.read(1 << 16):
            data += chunk
    return data


async def test_a_connection_that_never_says_hello_is_cut_and_a_client_stays() -> None:
    async with Router(RouterConfig(port=0, security=SecurityConfig(hello_deadline=0.5))) as router:
        host, port = router.address
        client = await AsyncClient(router.endpoint, name="real").connect()
        try:
            reader, writer = await asyncio.open_connection(host, port)
            data = await closed_by_router(reader, timeout=15)
            codec = Connection()
            codec.receive_data(data)
            [err] = codec.next_messages()
            assert isinstance(err, Error) and err.code == "hello-timeout"
            writer.close()
            got: list[object] = []
            await client.subscribe("x == 1", got.append)
            await client.publish({"x": 1})
            await wait_for(lambda: len(got) == 1, timeout=10)  # the client that said hello is kept
        finally:
            await client.aclose()


async def test_connections_past_the_cap_per_address_are_refused_with_a_reason() -> None:
    async with Router(
        RouterConfig(port=0, security=SecurityConfig(max_connections_per_address=3))
    ) as router:
        host, port = router.address
        held = [await asyncio.open_connection(host, port) for _ in range(3)]
        reader, writer = await asyncio.open_connection(host, port)
        data = await closed_by_router(reader, timeout=15)
        codec = Connection()
        codec.receive_data(data)
        [err] = codec.next_messages()
        assert isinstance(err, Error) and err.code == "busy" and "per address" in err.message
        for _, w in held:
            w.close()
        writer.close()
        await wait_for(lambda: router.security.admission.pending == 0, timeout=10)
        client = await AsyncClient(router.endpoint).connect(timeout=10)  # room again
        await client.aclose()


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
async def test_a_router_at_1024_open_files_lets_a_client_in_past_a_stranger_with_1100_sockets(
    tmp_path: Path,
) -> None:
    """The a10 attack on a real `aa router` process: the stranger's oldest silent sockets
    are closed to make room; a real client connects while the stranger keeps opening."""
    # Popen returns at once and nothing else runs on the loop until the router is up (its
    # first line is read with select's timeout): the blocking calls here are harmless.
    proc = subprocess.Popen(  # noqa: ASYNC220
        [
            "prlimit",
            "--nofile=1024:1024",
            AA,
            "router",
            "--port",
            "0",
            "--no-discovery",
            "--no-http",
            "--data-dir",
            str(tmp_path / "r"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ),
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline().decode() if ready else ""
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        assert m, line
        port = int(m.group(1))
        held = []
        for _ in range(1100):
            held.append(await asyncio.open_connection("127.0.0.1", port))
        client = await AsyncClient(f"127.0.0.1:{port}").connect(timeout=20)
        got: list[object] = []
        await client.subscribe("x == 1", got.append)
        await client.publish({"x": 1})
        await wait_for(lambda: len(got) == 1, timeout=20)
        await client.aclose()
        for _, w in held:
            w.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    # One line per interval about failing accepts, not one per attempt.
    assert err.decode(errors="replace").count("out of system resource") <= 2
