"""The web monitor's charts in a real headless Chromium against a real router: the lines
are the router's own figures (``GET /metrics``), so what a test publishes is what they draw;
and a router that refuses anonymous callers shows no figures until a token is given."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from http_helpers import open_server
from support import wait_for
from support.meshes import FAST
from test_http_monitor_token import RULES, _token, open_tab

from aa.client import AsyncClient
from aa.http_api import HttpEndpoint
from aa.router import Router, RouterConfig
from aa.router.security import SecurityConfig
from aa.tools.certs_cmd import init_ca, issue

#: The peer link must outlive a busy machine's pauses (Chromium, other tests' JVMs): with
#: FAST's keep-alive a second's stall ends it, and the chart rightly draws 0 links.
STEADY = dataclasses.replace(FAST, keepalive=1.0, info_interval=1.0)

#: Each line of the charts: "chart/series" → (last, peak, area), numbers or None.
LINES = """
return Object.fromEntries([...document.querySelectorAll('#charts path.series')].map(p => [
  p.closest('figure').dataset.chart + '/' + p.dataset.series,
  [p.dataset.last, p.dataset.peak, p.dataset.area].map(v => v === '' ? null : Number(v)),
]))
"""


async def test_the_charts_draw_what_the_router_counted() -> None:
    async with (
        open_server() as (router, endpoint),
        Router(RouterConfig(port=0, name="peer", mesh=STEADY)) as peer,
        AsyncClient(router.endpoint, name="publisher") as pub,
        AsyncClient(router.endpoint, name="reader") as reader,
        open_tab() as tab,
    ):
        router.mesh.add_peer(peer.endpoint)
        await wait_for(lambda: bool(router.mesh.links) and bool(peer.mesh.links))
        got: list[Any] = []
        await reader.subscribe("n >= 0", got.append)
        await tab.get(endpoint.url)
        await tab.until("return Number(document.body.dataset.polls) >= 2")
        for batch in range(20):
            for i in range(25):
                await pub.publish({"n": batch * 25 + i})
            await pub.flush(5)
        await wait_for(lambda: len(got) == 500, timeout=10)

        async def lines() -> dict[str, list[float | None]]:
            return await tab.js(LINES)  # type: ignore[no-any-return]

        # the area under "published/s" is the events published, once the page polled after
        await tab.until(
            "return [...document.querySelectorAll('#charts path.series')].some("
            "p => p.dataset.series === 'published' && Number(p.dataset.area) >= 499.5)"
        )
        seen = await lines()
        for name in ("events/published", "events/delivered"):
            last, peak, area = seen[name]
            assert area is not None and abs(area - 500) < 0.01, (name, seen[name])
            assert peak is not None and peak > 0
        assert seen["connections/TCP clients"][0] == 2, seen
        assert seen["connections/peer links"][0] == 1, seen
        assert seen["latency/p99"][1] is not None and seen["latency/p99"][1] > 0, seen
        assert seen["drops/slow subscriber"][1] == 0, seen
        assert seen["backlog/store"] == [None, None, 0], seen  # this router keeps no store
        legend = await tab.js(
            "return document.querySelector('figure[data-chart=\"connections\"] figcaption')"
            ".textContent"
        )
        assert "TCP clients 2" in legend and "peer links 1" in legend, legend


async def test_a_router_that_asks_for_a_token_shows_no_figures_without_one(
    tmp_path: Path,
) -> None:
    pki = tmp_path / "pki"
    init_ca(pki)
    issue(pki, "r1", "router", days=30)
    perms = tmp_path / "perms.toml"
    perms.write_text(RULES)
    security = SecurityConfig(
        cert=pki / "r1.pem",
        key=pki / "r1.key",
        ca=pki / "ca.pem",
        permissions=perms,
        anonymous=False,
    )
    endpoint = HttpEndpoint(host="127.0.0.1", port=0)
    config = RouterConfig(port=0, name="charts-home", security=security)
    async with Router(config, endpoints=[endpoint]) as router, open_tab() as tab:
        await tab.get(endpoint.url)
        await tab.until("return document.body.dataset.auth === 'asking'")
        assert await tab.js("return document.querySelectorAll('#charts figure').length") == 0
        await tab.type_token(_token(pki, "bob"))
        await tab.until("return Number(document.body.dataset.polls) >= 2")
        router.publish({"n": 1}, type="alarm")
        await tab.until(
            "return [...document.querySelectorAll('#charts path.series')].some("
            "p => p.dataset.series === 'TCP clients' && p.dataset.last === '0')"
        )
