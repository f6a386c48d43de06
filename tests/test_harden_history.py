"""History replays for clients that never read (attack a12): at most a few replays run per
connection (the others wait, holding nothing but their hold), and a closed connection's
replays, running or waiting, end and let go of their memory."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from support import wait_for

from aa.mesh import Connection, PatternSpec
from aa.mesh.protocol import Hello, Subscribe
from aa.router import Router, RouterConfig

SUBSCRIBES = 10


async def test_a_client_that_never_reads_gets_few_replays_at_once_and_closing_ends_them(
    tmp_path: Path,
) -> None:
    async with Router(RouterConfig(port=0, data_dir=tmp_path / "r")) as router:
        for i in range(20_000):
            router.publish({"x": i, "pad": "p" * 200}, type="t", meta={"persist": True})
        await router.storage.flush()
        replay = router.storage.replay
        host, port = router.address
        s = socket.create_connection((host, port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        codec = Connection()
        data = codec.send(Hello(client_id=os.urandom(8).hex()))
        for i in range(SUBSCRIBES):
            data += codec.send(
                Subscribe(sub_id=i + 1, pattern=PatternSpec(source="True"), history={"since": None})
            )
        s.sendall(data)  # and never reads
        await wait_for(lambda: replay.running + replay.waiting == SUBSCRIBES, timeout=20)
        assert replay.running <= 2 and replay.waiting >= SUBSCRIBES - 2
        s.close()
        await wait_for(lambda: not replay._tasks, timeout=20)  # every replay ended
        assert replay.running == replay.waiting == 0 and not replay._owners
