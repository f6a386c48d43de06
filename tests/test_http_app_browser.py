"""The phone app (``/app/``) in a real headless Chromium with a phone's screen (412×915,
touch), against real routers with real uvicorn endpoints: installable, events once each
across a cut network and a reload, an event published offline reaching a TCP subscriber
once, and the app carrying on through another router of the mesh when its own stops.
Screenshots land in the test's temporary folder; with ``AA_SCREENSHOTS=docs`` in
docs/images/, for the manual (the suite leaves the clone's files as they are).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from http_helpers import chromium, page_until
from support import wait_for

from aa.client import AsyncClient
from aa.http_api import HttpEndpoint
from aa.router import MeshConfig, Router, RouterConfig

#: The manual's pictures, refreshed from these tests when AA_SCREENSHOTS=docs.
DOCS_IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"
PHONE = {"width": 412, "height": 915, "deviceScaleFactor": 2, "mobile": True}


class Phone:
    """A Chromium tab with a phone's screen, driven from the test's event loop (each call in
    a thread: selenium blocks, and the routers answer it on this loop)."""

    def __init__(self, driver: Any, images: Path) -> None:
        self.driver = driver
        #: Where `shot` saves its pictures.
        self.images = images

    async def cdp(self, cmd: str, args: dict[str, Any] | None = None) -> Any:
        return await asyncio.to_thread(self.driver.execute_cdp_cmd, cmd, args or {})

    async def js(self, script: str, *args: Any) -> Any:
        return await asyncio.to_thread(self.driver.execute_script, script, *args)

    async def get(self, url: str) -> None:
        await asyncio.to_thread(self.driver.get, url)

    async def until(self, script: str, timeout: float = 30.0) -> Any:
        """Await a JavaScript expression (``return …``) to be truthy; its value."""
        return await asyncio.to_thread(page_until, self.driver, script, timeout)

    async def offline(self, cut: bool) -> None:
        await self.cdp(
            "Network.emulateNetworkConditions",
            {"offline": cut, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
        )

    async def shot(self, name: str) -> Path:
        self.images.mkdir(parents=True, exist_ok=True)
        path = self.images / name
        await asyncio.to_thread(self.driver.save_screenshot, str(path))
        return path

    async def events(self) -> list[str]:
        return await self.js(  # type: ignore[no-any-return]
            "return [...document.querySelectorAll('#events li')].map(li => li.dataset.id)"
        )

    async def errors(self) -> list[dict[str, Any]]:
        logs = await asyncio.to_thread(self.driver.get_log, "browser")
        # The app's own calls to an unreachable router are logged by Chromium as failed
        # loads: expected while offline, so only script errors count.
        return [e for e in logs if e["level"] == "SEVERE" and "Failed to load" not in e["message"]]


@asynccontextmanager
async def open_phone(tmp_path: Path) -> AsyncIterator[Phone]:
    """A phone whose screenshots go to *tmp_path*, or to docs/images with AA_SCREENSHOTS=docs."""
    images = DOCS_IMAGES if os.environ.get("AA_SCREENSHOTS") == "docs" else tmp_path
    manager = chromium(window="412,915")
    driver = await asyncio.to_thread(manager.__enter__)
    try:
        phone = Phone(driver, images)
        await phone.cdp("Emulation.setDeviceMetricsOverride", PHONE)
        await phone.cdp("Emulation.setTouchEmulationEnabled", {"enabled": True})
        await phone.cdp("Network.enable")
        yield phone
    finally:
        await asyncio.to_thread(manager.__exit__, None, None, None)


def _endpoint() -> HttpEndpoint:
    return HttpEndpoint(host="127.0.0.1", port=0)


async def _publish(base: str, values: dict[str, Any], type: str = "reading") -> str:
    async with httpx.AsyncClient(base_url=base) as http:
        r = await http.post("/events", json={"values": values, "type": type})
        assert r.status_code == 201, r.text
        return r.json()["id"]  # type: ignore[no-any-return]


async def test_app_installs_keeps_events_offline_and_publishes_once(tmp_path: Path) -> None:
    endpoint = _endpoint()
    async with (
        Router(RouterConfig(port=0, name="phone-home"), endpoints=[endpoint]) as router,
        AsyncClient(router.endpoint) as tcp,
        open_phone(tmp_path) as phone,
    ):
        got: list[Any] = []
        await tcp.subscribe("m == 1", got.append)
        url = endpoint.url
        await phone.get(f"{url}app?pattern={quote('n >= 0')}")
        await phone.until("return document.body.dataset.ready === 'true'")
        await phone.until("return document.querySelector('#patterns code')?.textContent")
        assert await phone.js("return location.search") == ""  # the shared link is consumed

        # Installable once the service worker is active: awaited in the page.
        await phone.until("return navigator.serviceWorker.controller !== null")
        answer = await phone.cdp("Page.getInstallabilityErrors")
        assert answer["installabilityErrors"] == [], answer

        ids = [await _publish(url, {"n": i, "Sensor": f"lab-{i}"}) for i in range(3)]
        await phone.until("return document.querySelectorAll('#events li').length === 3")
        assert sorted(await phone.events()) == sorted(ids)

        # The network cut: events go on in the mesh, one is published from the app.
        await phone.offline(True)
        await phone.until("return document.body.dataset.online === 'false'")
        ids += [await _publish(url, {"n": i, "Sensor": f"lab-{i}"}) for i in range(3, 6)]
        await phone.js("document.querySelector('nav [data-view=publish]').click()")
        await phone.js(
            'document.getElementById(\'publish-values\').value = \'{"m": 1, "note": "train"}\';'
            "document.getElementById('publish-type').value = 'from-phone';"
            "document.getElementById('publish-btn').click()"
        )
        await phone.until("return document.body.dataset.outbox === '1'")
        await phone.shot("app-outbox-offline.png")

        # A reload with no network: the shell from the service worker, the events from
        # IndexedDB, the outbox still waiting.
        await asyncio.to_thread(phone.driver.refresh)
        await phone.until("return document.body.dataset.ready === 'true'")
        await phone.until("return document.querySelectorAll('#events li').length === 3")
        assert await phone.js("return document.body.dataset.outbox") == "1"
        assert got == []

        # Back: the three missed events once each, and the outbox sent once.
        await phone.offline(False)
        await phone.until("return document.querySelectorAll('#events li').length === 6")
        await phone.until("return document.body.dataset.outbox === '0'")
        await wait_for(lambda: len(got) >= 1, timeout=20)
        shown = await phone.events()
        assert sorted(shown) == sorted(ids) and len(set(shown)) == 6
        # Another round of polls later, still once each, and one event at the TCP side.
        marker = await _publish(url, {"n": 99})
        await phone.until(f"return document.querySelector('#events li[data-id=\"{marker}\"]')")
        assert len(await phone.events()) == 7
        assert [e.values for e in got] == [{"m": 1, "note": "train"}]

        # Odd values: shown bounded, and as text (nothing of the event becomes HTML).
        odd = {
            "n": 100,
            "html": '<img src=x onerror="window.pwned=1"><b>bold</b>',
            "long": "x" * 100_000,
            "deep": {"a": [[[[[[{"b": 1}]]]]]]},
            "blob": {"$bytes": "AAEC" * 1000},
            "at": {"$datetime": "2026-05-01T12:00:00+00:00"},
        }
        odd_id = await _publish(url, odd, type="odd")
        row = f"document.querySelector('#events li[data-id=\"{odd_id}\"]')"
        await phone.until(f"return {row}")
        assert await phone.js("return document.querySelectorAll('#events img').length") == 0
        assert await phone.js("return window.pwned === undefined")
        text = await phone.js(f"return {row}.textContent")
        assert '<img src=x onerror="window.pwned=1">' in text
        assert len(text) < 2000 and "2.9 KiB (3,000 bytes)" in text  # cut text, bytes as a size
        await phone.js(f"{row}.click()")
        detail = await phone.until("return document.getElementById('detail').open")
        assert detail
        await phone.shot("app-event-detail.png")
        await phone.js("document.querySelector('#detail .close').click()")

        # A pattern typed wrong: the router's error in the form.
        await phone.js("document.querySelector('nav [data-view=subscribe]').click()")
        await phone.js(
            "document.getElementById('pattern-expr').value = 'n >';"
            "document.getElementById('pattern-add').click()"
        )
        error = await phone.until("return document.getElementById('pattern-error').textContent")
        assert "n >" in error or "syntax" in error.lower(), error
        await phone.js("document.getElementById('pattern-expr').value = ''")
        # The form: a type and a condition; then the QR code of the subscription.
        await phone.js(
            "document.getElementById('pattern-type').value = 'reading';"
            "document.querySelector('.c-name').value = 'n';"
            "document.querySelector('.c-value').value = '2';"
            "document.getElementById('pattern-add').click()"
        )
        await phone.until("return document.querySelectorAll('#patterns code').length === 2")
        assert await phone.js(
            "return document.querySelectorAll('#patterns code')[1].textContent"
        ) == ('type == "reading" and n > 2')
        await phone.shot("app-subscribe.png")
        await phone.js("document.querySelector('#patterns .share').click()")
        await phone.until("return document.querySelector('#share svg path')")
        await phone.shot("app-share-qr.png")
        await phone.js("document.querySelector('#share .close').click()")
        await phone.js("document.querySelector('nav [data-view=events]').click()")
        await phone.shot("app-events.png")
        assert await phone.errors() == []


async def test_app_roams_to_another_router_when_its_own_stops(tmp_path: Path) -> None:
    fast = MeshConfig(info_interval=0.2)
    home_http, other_http = _endpoint(), _endpoint()
    other = Router(RouterConfig(port=0, name="other", mesh=fast), endpoints=[other_http])
    await other.start()
    home = Router(
        RouterConfig(port=0, name="home", peers=(other.endpoint,), mesh=fast), endpoints=[home_http]
    )
    await home.start()
    try:
        await wait_for(lambda: home.peer_count() == 1 and other.peer_count() == 1, timeout=20)
        async with open_phone(tmp_path) as phone:
            pattern = quote("kind == 'door'")
            await phone.get(f"{home_http.url}app/?pattern={pattern}&router={quote(other_http.url)}")
            await phone.until("return document.body.dataset.ready === 'true'")
            # Both routers hold a client of the app's before anything is missed.
            await phone.until("return document.querySelectorAll('#routers .ok').length === 2")
            first = await _publish(home_http.url, {"kind": "door", "n": 1})
            await phone.until("return document.querySelectorAll('#events li').length === 1")

            await home.aclose()  # the app's own router is gone, HTTP and all
            later = [await _publish(other_http.url, {"kind": "door", "n": n}) for n in (2, 3)]
            other_origin = other_http.url.rstrip("/")
            await phone.until(f"return document.body.dataset.router === '{other_origin}'")
            await phone.until("return document.querySelectorAll('#events li').length === 3")
            # A reload of the app's page, whose router is down: from the service worker.
            await asyncio.to_thread(phone.driver.refresh)
            await phone.until("return document.body.dataset.ready === 'true'")
            last = await _publish(other_http.url, {"kind": "door", "n": 4})
            await phone.until("return document.querySelectorAll('#events li').length === 4")
            shown = await phone.events()
            assert sorted(shown) == sorted([first, *later, last])
            await phone.js("document.querySelector('nav [data-view=routers]').click()")
            await phone.shot("app-roaming.png")
    finally:
        await home.aclose()
        await other.aclose()


@pytest.mark.parametrize("version", range(1, 16))
def test_qr_encoder_matches_an_independent_one(version: int, tmp_path: Path) -> None:
    """The app's QR encoder (qr.js, run by Node) draws the same modules as segno for the same
    text, version and mask."""
    import json
    import shutil
    import subprocess

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    segno = pytest.importorskip("segno")
    from segno import encoder

    # segno pads a byte-aligned stream with a whole zero byte; the standard adds nothing. And
    # segno writes text that Latin-1 holds in Latin-1, qr.js in UTF-8: the texts are ASCII.
    real = encoder.write_padding_bits
    encoder.write_padding_bits = lambda buff, v, length: buff.extend([0] * ((8 - length % 8) % 8))
    try:
        qr = Path(__file__).resolve().parent.parent / "http_api" / "static" / "app" / "qr.js"
        module = tmp_path / "qr.mjs"
        module.write_text(qr.read_text())
        capacity = [14, 26, 42, 62, 84, 106, 122, 152, 180, 213, 251, 287, 331, 362, 412]
        text = "http://127.0.0.1:7448/app/?pattern=" + "Temp%20%3E%20100%20and%20" * 40
        cases = [(text[: capacity[version - 1] - m], m) for m in range(8)]
        script = tmp_path / "run.mjs"
        script.write_text(
            f"import {{ qrMatrix }} from {json.dumps(str(module))};\n"
            f"const cases = {json.dumps(cases)};\n"
            "console.log(JSON.stringify(cases.map(([t, m]) =>\n"
            f"  qrMatrix(t, {{ version: {version}, mask: m }})"
            ".map((r) => r.map((b) => (b ? 1 : 0)).join('')))));\n"
        )
        got = json.loads(
            subprocess.run([node, str(script)], capture_output=True, check=True, text=True).stdout
        )
        for (t, m), rows in zip(cases, got, strict=True):
            want = segno.make(t, version=version, error="m", mask=m, mode="byte", boost_error=False)
            assert rows == ["".join("1" if b else "0" for b in row) for row in want.matrix], (t, m)
    finally:
        encoder.write_padding_bits = real
