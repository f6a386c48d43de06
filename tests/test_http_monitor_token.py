"""The web monitor (``/``) on a router that refuses anonymous callers, in a real headless
Chromium against a real uvicorn endpoint: it asks for a token, refuses a wrong one with the
router's reason, keeps a right one for the tab (sessionStorage), and shows live events its
user may receive over a stream opened with a one-use ticket (EventSource sends no headers).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives import serialization
from http_helpers import bearer, chromium, page_until

from aa.http_api import HttpEndpoint
from aa.router import Router, RouterConfig
from aa.router.security import SecurityConfig
from aa.router.security.tokens import issue_token
from aa.tools.certs_cmd import init_ca, issue

RULES = """\
[users.bob]
publish = ["alarm"]
subscribe = ["alarm"]
patterns = "predicates"
"""


class Tab:
    """A Chromium tab driven from the test's event loop (selenium blocks: each call runs in
    a thread while the router answers on this loop)."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    async def js(self, script: str, *args: Any) -> Any:
        return await asyncio.to_thread(self.driver.execute_script, script, *args)

    async def get(self, url: str) -> None:
        await asyncio.to_thread(self.driver.get, url)

    async def until(self, script: str, timeout: float = 30.0) -> Any:
        """Await a JavaScript expression (``return …``) to be truthy; its value."""
        return await asyncio.to_thread(page_until, self.driver, script, timeout)

    async def soon(self, script: str) -> None:
        """Await *script* to be truthy for half a second at most (the caller checks again)."""
        with contextlib.suppress(TimeoutError):
            await self.until(script, timeout=0.5)

    async def type_token(self, token: str) -> None:
        await self.js(
            "document.getElementById('token').value = arguments[0];"
            "document.getElementById('token-btn').click()",
            token,
        )

    async def events(self) -> list[str]:
        return await self.js(  # type: ignore[no-any-return]
            "return [...document.querySelectorAll('#events li')].map(li => li.textContent)"
        )


@asynccontextmanager
async def open_tab() -> AsyncIterator[Tab]:
    manager = chromium()
    driver = await asyncio.to_thread(manager.__enter__)
    try:
        yield Tab(driver)
    finally:
        await asyncio.to_thread(manager.__exit__, None, None, None)


def _token(pki: Path, user: str) -> str:
    key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), password=None)
    return issue_token(key, user, now=time.time(), days=1)  # type: ignore[arg-type]


async def test_monitor_asks_for_a_token_and_streams_its_users_events(tmp_path: Path) -> None:
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
    config = RouterConfig(port=0, name="monitor-home", security=security)
    bob = _token(pki, "bob")
    async with (
        Router(config, endpoints=[endpoint]) as router,
        httpx.AsyncClient(base_url=endpoint.url) as http,
        open_tab() as tab,
    ):
        await tab.get(endpoint.url)
        await tab.until("return document.body.dataset.auth === 'asking'")
        assert await tab.js("return !document.getElementById('token-form').hidden")
        assert await tab.js("return document.querySelectorAll('#events li').length") == 0

        # A wrong token: the router's reason, and still asking.
        await tab.type_token("aa1.not.valid")
        reason = await tab.until("return document.getElementById('token-result').textContent")
        assert "401" in reason and "malformed token" in reason, reason
        assert await tab.js("return document.body.dataset.auth") == "asking"

        # Bob's token: the mesh picture, then live events of the types bob may receive.
        await tab.type_token(bob)
        await tab.until("return document.body.dataset.routers === '1'")
        assert await tab.js("return document.body.dataset.auth") == "token"
        assert await tab.js("return sessionStorage.getItem('aa.monitor.token')") == bob
        assert await tab.js("return document.getElementById('token-form').hidden")

        async def publish(n: int) -> None:
            for kind in ("reading", "alarm"):  # the reading is not bob's to see
                router.publish({"n": n}, type=kind)

        # The stream opens with a ticket; publish until it carries events (no 'open' signal
        # reaches the test from the page otherwise).
        async with asyncio.timeout(30):
            n = 0
            while not await tab.js("return document.body.dataset.events"):
                await publish(n)
                n += 1
                await tab.soon("return document.body.dataset.events")
        await publish(-1)  # now that it is open, both types go by; only the alarm shows
        await tab.until("return document.getElementById('events').textContent.includes('n=-1')")
        shown = await tab.events()
        assert shown and all(line.startswith("alarm") for line in shown), shown

        # Another pattern starts a new list: only its own events are shown and counted.
        await tab.js(
            "document.getElementById('pattern').value = 'n == 7';"
            "document.getElementById('subscribe-btn').click()"
        )
        await tab.until("return !document.getElementById('events').children.length")
        async with asyncio.timeout(30):
            while not await tab.js("return document.body.dataset.events"):
                await publish(7)
                await tab.soon("return document.body.dataset.events")
        counted = int(await tab.js("return document.body.dataset.events"))
        await publish(8)
        await publish(7)
        await tab.until(f"return Number(document.body.dataset.events) > {counted}")
        shown = await tab.events()
        assert shown and all(line.startswith("alarm") and "n=7" in line for line in shown), shown

        # A reload keeps the token for this tab: no form, and the stream opens again.
        await asyncio.to_thread(tab.driver.refresh)
        await tab.until("return document.body.dataset.routers === '1'")
        assert await tab.js("return document.body.dataset.auth") == "token"
        async with asyncio.timeout(30):
            while not await tab.js("return document.body.dataset.events"):
                await publish(1000)
                await tab.soon("return document.body.dataset.events")

        # Anonymous calls stay refused; the page's token is bob's.
        assert (await http.get("/mesh")).status_code == 401
        assert (await http.get("/mesh", headers=bearer(bob))).status_code == 200
        logs = await asyncio.to_thread(tab.driver.get_log, "browser")
        # The refused calls before the token (401) are logged by Chromium as failed loads.
        errors = [e for e in logs if e["level"] == "SEVERE" and "401" not in e["message"]]
        assert errors == [], errors
