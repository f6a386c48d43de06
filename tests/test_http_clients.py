"""Real clients against a real server: feedparser, curl, newsboat, and the web monitor in
headless Chromium (through chromedriver). A test whose program is missing skips and says
which Debian package brings it (tests/setup/system-deps.sh installs them where it can)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import feedparser
import httpx
import pytest
from http_helpers import chromium, open_server
from support import wait_for

from aa.mesh import from_json
from aa.router import MeshConfig, Router, RouterConfig

#: Where the monitor's screenshot is also left for people to look at.
SCREENSHOT = Path(tempfile.gettempdir()) / "aa-monitor.png"
NO_PROXY = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()} | {"NO_PROXY": "*"}


def need(program: str, package: str) -> str:
    path = shutil.which(program)
    if path is None:
        pytest.skip(
            f"{program} is not installed (Debian package {package}; see tests/setup/system-deps.sh)"
        )
    return path


async def registered(http: httpx.AsyncClient, *patterns: str, **body: Any) -> dict[str, Any]:
    r = await http.post("/clients", json={"patterns": [{"source": p} for p in patterns], **body})
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


async def test_feedparser_reads_the_feed_and_conditional_get() -> None:
    async with open_server() as (router, endpoint):
        async with httpx.AsyncClient(base_url=endpoint.url) as http:
            c = await registered(http, "kind == 'reading'", name="feedparser")
        ids = [
            router.publish({"kind": "reading", "n": i, "x": i / 2}, type="reading").id
            for i in range(3)
        ]
        url = f"{endpoint.url}clients/{c['id']}/feed"
        auth = {"Authorization": f"Bearer {c['token']}"}
        d = await asyncio.to_thread(feedparser.parse, url, request_headers=auth)
        assert d.status == 200 and not d.bozo, d.get("bozo_exception")
        assert d.version == "atom10" and d.feed.title == "Aa events for feedparser"
        assert [e.id for e in d.entries] == [f"urn:aa:event:{i}" for i in ids]
        first = d.entries[0]
        assert first.updated_parsed is not None
        assert {t.term for t in first.tags} == {"reading", "p1"}
        values = from_json(json.loads(first.aa_event)["values"])  # the typed event, for programs
        assert values == {"kind": "reading", "n": 0, "x": 0.0} and type(values["x"]) is float
        assert first.content[0].type == "application/xhtml+xml"  # for people
        assert "<b>x</b>: 0.0 <i>(float)</i>" in first.content[0].value
        assert (
            first.link == f"{endpoint.url}clients/{c['id']}/events/{ids[0]}"
            and first.author == f"local:{router.id}"
        )
        again = await asyncio.to_thread(feedparser.parse, url, request_headers=auth, etag=d.etag)
        assert again.status == 304
        again = await asyncio.to_thread(
            feedparser.parse, url, request_headers=auth, modified=d.modified
        )
        assert again.status == 304


async def curl(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        need("curl", "curl"),
        "-sS",
        "--noproxy",
        "*",
        *args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err
    return proc.returncode, out.decode()


async def test_curl_publishes_registers_and_polls() -> None:
    async with open_server() as (router, endpoint):
        base = endpoint.url.rstrip("/")
        sub = router.subscribe("True")
        _, out = await curl(
            "-X",
            "POST",
            f"{base}/clients",
            "-H",
            "Content-Type: application/json",
            "-d",
            '{"patterns": [{"source": "t > 30"}]}',
        )
        c = json.loads(out)
        _, out = await curl(
            "-w",
            "\n%{http_code}",
            "-X",
            "POST",
            f"{base}/events",
            "-H",
            "Content-Type: application/json",
            "-d",
            '{"values": {"t": 31, "at": {"$datetime": "2026-01-01T00:00:00+00:00"}}}',
        )
        body, status = out.rsplit("\n", 1)
        assert status == "201" and json.loads(body)["id"]
        async with asyncio.timeout(5):
            assert type((await sub.get()).values["t"]) is int
        _, feed = await curl(
            "-D", "-", "-u", f"{c['id']}:{c['token']}", f"{base}/clients/{c['id']}/feed"
        )
        head, _, xml = feed.partition("\r\n\r\n")
        assert head.startswith("HTTP/1.1 200") and "<entry>" in xml
        etag = next(
            line.split(":", 1)[1].strip()
            for line in head.splitlines()
            if line.lower().startswith("etag:")
        )
        _, code = await curl(
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-H",
            f"If-None-Match: {etag}",
            "-H",
            f"Authorization: Bearer {c['token']}",
            f"{base}/clients/{c['id']}/feed",
        )
        assert code == "304"
        _, code = await curl(
            "-o", "/dev/null", "-w", "%{http_code}", f"{base}/clients/{c['id']}/feed"
        )
        assert code == "401"
        _, code = await curl(
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-X",
            "POST",
            f"{base}/events",
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            "{oops",
        )
        assert code == "400"
        # curl's -d without the header sends a form: the answer says what was missing
        _, out = await curl(
            "-w", "\n%{http_code}", "-X", "POST", f"{base}/events", "-d", '{"values": {"a": 1}}'
        )
        body, status = out.rsplit("\n", 1)
        assert status == "422"
        message = json.loads(body)["message"]
        assert message.startswith(
            "the body must be JSON, sent with 'Content-Type: application/json'"
        ), message
        assert "application/x-www-form-urlencoded" in message


async def test_newsboat_reloads_the_feed_into_its_cache(tmp_path: Path) -> None:
    newsboat = need("newsboat", "newsboat")
    async with open_server() as (router, endpoint):
        async with httpx.AsyncClient(base_url=endpoint.url) as http:
            c = await registered(http, "True", name="newsboat")
        ids = [router.publish({"n": i, "text": f"event {i}"}, type="note").id for i in range(4)]
        async with httpx.AsyncClient(base_url=endpoint.url) as http:  # and one over HTTP
            r = await http.post(
                "/events",
                json={"values": {"Temperature": 21.5, "Sensor": "lab-1"}, "type": "reading"},
            )
            ids.append(r.json()["id"])
        host, port = endpoint.address
        (tmp_path / "urls").write_text(
            f"http://{c['id']}:{c['token']}@{host}:{port}/clients/{c['id']}/feed\n"
        )
        (tmp_path / "config").write_text("")
        env = {
            **NO_PROXY,
            "HOME": str(tmp_path),
            "XDG_CONFIG_HOME": str(tmp_path),
            "XDG_DATA_HOME": str(tmp_path),
        }
        proc = await asyncio.create_subprocess_exec(
            newsboat,
            "-x",
            "reload",
            "-u",
            str(tmp_path / "urls"),
            "-c",
            str(tmp_path / "cache.db"),
            "-C",
            str(tmp_path / "config"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        async with asyncio.timeout(60):
            out, err = await proc.communicate()
        assert proc.returncode == 0, (out, err)
    with sqlite3.connect(tmp_path / "cache.db") as db:
        db.row_factory = sqlite3.Row
        rows = {
            r["guid"]: r
            for r in db.execute("SELECT guid, title, author, url, content FROM rss_item")
        }
        feeds = db.execute("SELECT title FROM rss_feed").fetchall()
    assert sorted(rows) == sorted(f"urn:aa:event:{i}" for i in ids)
    assert [tuple(f) for f in feeds] == [("Aa events for newsboat",)]
    note = rows[f"urn:aa:event:{ids[2]}"]
    assert "event 2" in note["title"] and note["author"] == f"local:{router.id}"
    assert note["url"] == f"http://{host}:{port}/clients/{c['id']}/events/{ids[2]}"
    # What newsboat shows as the body: the values with their types, the type, the time and
    # the publisher as text, not a base64 blob.
    reading = rows[f"urn:aa:event:{ids[4]}"]
    body = reading["content"]
    for words in (
        "<b>Temperature</b>: 21.5 <i>(float)</i>",
        "<b>Sensor</b>: lab-1 <i>(str)</i>",
        "Type <b>reading</b>",
        "published by HTTP client at 127.0.0.1:",
    ):
        assert words in body, (words, body)
    assert not re.search(r"[A-Za-z0-9+/=]{60,}", body), body  # no base64 blob
    assert reading["author"].startswith("HTTP client at 127.0.0.1:")


def _drive_monitor(url: str, out: Path) -> dict[str, Any]:
    """Open the monitor in headless Chromium, wait for the mesh picture, publish from the
    form, wait for the event to flow past, take a screenshot."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with chromium() as driver:
        driver.get(url)
        wait = WebDriverWait(driver, 20)
        body = driver.find_element(By.TAG_NAME, "body")
        wait.until(
            lambda d: (
                body.get_attribute("data-routers") == "3"
                and body.get_attribute("data-links") == "2"
            )
        )
        values = driver.find_element(By.ID, "values")
        values.clear()
        values.send_keys('{"Temperature": 123, "Sensor": "browser"}')
        driver.find_element(By.ID, "publish-btn").click()
        wait.until(lambda d: 'Sensor="browser"' in d.find_element(By.ID, "events").text)
        driver.find_element(By.ID, "register-btn").click()
        wait.until(lambda d: not d.find_element(By.ID, "poll-btn").get_property("disabled"))
        driver.save_screenshot(str(out))
        return {
            "circles": len(driver.find_elements(By.CSS_SELECTOR, "#mesh g.router circle")),
            "lines": len(driver.find_elements(By.CSS_SELECTOR, "#mesh line.link")),
            "result": driver.find_element(By.ID, "publish-result").text,
            "errors": [e for e in driver.get_log("browser") if e["level"] == "SEVERE"],
        }


async def test_monitor_in_headless_chromium_draws_the_mesh_and_publishes(tmp_path: Path) -> None:
    need("chromium", "chromium")
    need("chromedriver", "chromium-driver")
    pytest.importorskip("selenium", reason="selenium is a dev dependency (pip install -e '.[dev]')")
    fast = MeshConfig(info_interval=0.2)
    async with open_server() as (hub, endpoint):
        spokes = [
            Router(RouterConfig(port=0, name=f"spoke-{i}", peers=(hub.endpoint,), mesh=fast))
            for i in (1, 2)
        ]
        for s in spokes:
            await s.start()
        try:

            def whole_mesh() -> bool:
                routers = hub.mesh_info().get("routers", [])
                return len(routers) == 3 and all(r.get("peers") for r in routers)

            await wait_for(whole_mesh, timeout=20)
            async with httpx.AsyncClient(base_url=endpoint.url) as http:
                links = (await http.get("/mesh")).json()["links"]
            assert sorted(links) == sorted(sorted([hub.id, s.id]) for s in spokes)
            seen = hub.subscribe("Sensor == 'browser'")
            shot = tmp_path / "monitor.png"
            got = await asyncio.to_thread(_drive_monitor, endpoint.url, shot)
            async with asyncio.timeout(5):
                event = await seen.get()
            assert event.values == {"Temperature": 123, "Sensor": "browser"}
        finally:
            for s in spokes:
                await s.aclose()
    assert got["circles"] == 3 and got["lines"] == 2, got
    assert got["result"].startswith("published "), got
    assert got["errors"] == [], got["errors"]
    assert shot.stat().st_size > 10_000  # a real picture, not a blank page
    shutil.copyfile(shot, SCREENSHOT)


async def test_js_client_module_works_on_its_own_page(tmp_path: Path) -> None:
    """A page that imports only /static/aa.js: publish, subscribe, register, feed, ack."""
    need("chromium", "chromium")
    need("chromedriver", "chromium-driver")
    pytest.importorskip("selenium")
    async with open_server() as (router, endpoint):
        seen = router.subscribe("n == 2")
        script = """
            const done = arguments[arguments.length - 1];
            (async () => {
              const { AaClient, AaFloat } = await import('/static/aa.js');
              const aa = new AaClient('');
              let sub;
              const got = new Promise((resolve) => {
                sub = aa.subscribe('n == 2', (e) => { sub.close(); resolve(e); });
              });
              await new Promise((opened) => sub.source.addEventListener('open', opened));
              await aa.registerClient({ name: 'js', patterns: ['n >= 1'] });
              const id = await aa.publish({ n: 2, x: new AaFloat(1), b: new Uint8Array([0, 255]),
                                            t: new Date('2026-01-02T03:04:05Z') }, { type: 'js' });
              const live = await got;
              const page = await aa.feed();
              await aa.ack(page.cursor);
              const after = await aa.feed();
              return { id, live: live.values.n, bytes: Array.from(live.values.b),
                       feed: page.entries.map((e) => e.event.id), after: after.entries.length };
            })().then(done, (err) => done({ error: String(err) }));
        """
        result = await asyncio.to_thread(_run_script, endpoint.url, script)
        assert "error" not in result, result
        assert (
            result["live"] == 2 and result["bytes"] == [0, 255] and result["feed"] == [result["id"]]
        )
        assert result["after"] == 0
        event = await seen.get()  # the JS client sent a float as a float, bytes, a datetime
        assert event.values == {
            "n": 2,
            "x": 1.0,
            "b": b"\x00\xff",
            "t": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        }
        assert type(event.values["x"]) is float and event.type == "js"


def _run_script(url: str, script: str) -> dict[str, Any]:
    with chromium() as driver:
        driver.set_script_timeout(20)
        driver.get(url + "health")
        return driver.execute_async_script(script)  # type: ignore[no-any-return]
