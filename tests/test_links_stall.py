"""No peer can wedge acknowledgements: a peer that stops reading (or a cable cut TCP has
not noticed) holds a publisher's acks for at most the keep-alive window, then its link is
cut and tried again later."""

from __future__ import annotations

import asyncio
import time

from support import wait_for

from aa.client import AsyncClient
from aa.mesh import Connection, PeerHello
from aa.mesh.protocol import Ping
from aa.router import MeshConfig, Router, RouterConfig


async def test_a_peer_that_pings_but_never_reads_holds_acks_for_one_keepalive_window() -> None:
    config = MeshConfig(keepalive=0.5, retry_base=30.0, retry_max=60.0, retry_jitter=0.0)
    async with Router(RouterConfig(port=0, mesh=config)) as router:
        reader, writer = await asyncio.open_connection(*router.address)
        codec = Connection()
        writer.write(
            codec.send(PeerHello(router_id="impostor", name="impostor", peer="127.0.0.1:9"))
        )
        loop = asyncio.get_running_loop()

        def ping() -> None:  # a sign of life every 0.2 s, and never a byte read
            if not writer.is_closing():
                writer.write(codec.send(Ping(token=1)))
                loop.call_later(0.2, ping)

        ping()
        await wait_for(lambda: "impostor" in router.mesh.links)
        async with AsyncClient(router.endpoint) as pub:
            blob = "x" * 1000
            started = time.monotonic()
            for i in range(60_000):  # some 60 MB: more than the kernel buffers of a link
                await pub.publish({"i": i, "pad": blob})
            await pub.flush(timeout=30)
            waited = time.monotonic() - started
        # Cut for holding acks (or, on a machine too loaded to read its pings in time, for
        # silence): either way no longer a peer, and the publisher was not held.
        assert "impostor" not in router.mesh.links
        assert waited < 30
        writer.close()
