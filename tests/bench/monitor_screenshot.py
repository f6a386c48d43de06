"""Take the docs' picture of the web monitor: a headless Chromium watching a router under a
little load for a while, then a screenshot.

    ./.venv/bin/python tests/bench/monitor_screenshot.py docs/images/monitor-charts.png

The router has a data folder (a store and an event log), a peer, a reader, a publisher whose
rate rises and falls, and, half-way, a subscriber that stops reading (its drops show as
"slow subscriber"). Everything binds 127.0.0.1. Needs chromium and chromedriver.
"""

from __future__ import annotations

import asyncio
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from http_helpers import chromium
from support.meshes import FAST
from test_http_metrics import deaf_subscriber

from aa.client import AsyncClient
from aa.http_api import HttpEndpoint
from aa.router import Router, RouterConfig

#: Seconds of load before the picture: enough for the lines to have a shape.
LOAD_S = 150.0


async def main(out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="aa-shot-") as data, chromium(window="1400,1250") as d:
        endpoint = HttpEndpoint(host="127.0.0.1", port=0)
        config = RouterConfig(port=0, name="lab-router", data_dir=Path(data), mesh=FAST)
        async with (
            Router(config, endpoints=[endpoint]) as router,
            Router(RouterConfig(port=0, name="peer-router", mesh=FAST)) as peer,
            AsyncClient(router.endpoint, name="sensors") as pub,
            AsyncClient(router.endpoint, name="dashboard") as reader,
            AsyncClient(peer.endpoint, name="archive") as far,
        ):
            router.mesh.add_peer(peer.endpoint)
            await reader.subscribe("Temperature > 20", lambda e: None)
            await far.subscribe("True", lambda e: None)
            await asyncio.to_thread(d.get, endpoint.url)
            start = time.monotonic()
            n = 0
            deaf = None
            narrowed = False
            while (elapsed := time.monotonic() - start) < LOAD_S:
                rate = 150 + 120 * math.sin(elapsed / 20)  # events a second
                for _ in range(max(1, int(rate / 10))):
                    n += 1
                    await pub.publish(
                        {"Sensor": f"lab-{n % 7}", "Temperature": 15 + n % 13, "blob": "x" * 2000}
                    )
                await pub.flush(5)
                if deaf is None and elapsed > LOAD_S / 2:
                    deaf = deaf_subscriber(router.address[1], "blob != ''")
                    await deaf.__aenter__()
                if not narrowed and elapsed > LOAD_S - 6:  # the list: a pattern's own events
                    narrowed = True
                    await asyncio.to_thread(
                        d.execute_script,
                        "document.getElementById('pattern').value = 'Temperature > 25';"
                        "document.getElementById('subscribe-btn').click()",
                    )
                await asyncio.sleep(0.1)  # the load's pace, ten rounds a second
            await asyncio.to_thread(d.save_screenshot, str(out))  # under load: lines to "now"
            if deaf is not None:
                await deaf.__aexit__(None, None, None)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
