"""The endpoint on a real uvicorn server inside the router's loop: ready means ready, SSE over
a socket, the feed against the RFC 4287 schema, and `aa router` with HTTP on and off."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_helpers import bearer, open_server
from lxml import etree
from support import wait_for

from aa.http_api import HttpEndpoint
from aa.router import Router, RouterConfig

AA = str(Path(sys.executable).with_name("aa"))
ATOM_NS = {"a": "http://www.w3.org/2005/Atom"}
XHTML_NS = {**ATOM_NS, "x": "http://www.w3.org/1999/xhtml"}
SCHEMA = etree.RelaxNG(etree.parse(str(Path(__file__).with_name("atom.rng"))))


async def test_start_returns_with_the_real_port_bound_and_aclose_frees_it() -> None:
    async with open_server() as (router, endpoint):
        host, port = endpoint.address
        assert host == "127.0.0.1" and port != 0 and endpoint.url == f"http://127.0.0.1:{port}/"
        async with httpx.AsyncClient(base_url=endpoint.url) as http:  # no wait: it answers at once
            assert (await http.get("/health")).json()["id"] == router.id
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


async def test_head_answers_as_get_without_a_body() -> None:
    # monitors ask HEAD (RFC 9110 §9.3.2): it was 405 on every resource
    async with (
        open_server() as (router, endpoint),
        httpx.AsyncClient(base_url=endpoint.url) as http,
    ):
        for path in ("/health", "/docs", "/", "/events"):
            got, head = await http.get(path), await http.head(path)
            assert head.status_code == got.status_code == 200, path
            assert (
                head.content == b"" and head.headers["content-type"] == got.headers["content-type"]
            ), path
        r = await http.put("/health")
        assert r.status_code == 405 and "HEAD" in r.headers["allow"].split(", ")


async def test_a_taken_port_fails_start() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        endpoint = HttpEndpoint(port=taken.getsockname()[1])
        router = Router(RouterConfig(port=0), endpoints=[endpoint])
        with pytest.raises(OSError):
            await router.start()
        await router.aclose()


async def test_sse_stream_over_a_socket() -> None:
    async with open_server() as (router, endpoint):
        async with (
            httpx.AsyncClient(base_url=endpoint.url) as http,
            http.stream("GET", "/stream", params={"pattern": "n > 1"}) as r,
        ):
            assert r.status_code == 200 and r.headers["content-type"].startswith(
                "text/event-stream"
            )
            lines = r.aiter_lines()
            async with asyncio.timeout(10):
                assert (await anext(lines)).startswith("retry:")
                router.publish({"n": 1})
                router.publish({"n": 2, "b": b"\x01"})
                async for line in lines:
                    if line.startswith("data:"):
                        data = json.loads(line[5:])
                        break
            assert data["event"]["values"] == {"n": 2, "b": {"$bytes": "AQ=="}}
        # The server saw the stream go and dropped its pattern.
        await wait_for(lambda: router.stats()["subscriptions"] == 0, timeout=10)


async def test_open_streams_do_not_hold_up_shutdown() -> None:
    async with open_server() as (router, endpoint):
        http = httpx.AsyncClient(base_url=endpoint.url)
        cm = http.stream("GET", "/stream")
        r = await cm.__aenter__()
        assert r.status_code == 200
        async with asyncio.timeout(10):
            await endpoint.aclose()
        await http.aclose()


async def test_the_feed_validates_against_the_rfc_4287_schema() -> None:
    async with (
        open_server() as (router, endpoint),
        httpx.AsyncClient(base_url=endpoint.url) as http,
    ):
        r = await http.post(
            "/clients",
            json={"name": "schema <&>", "patterns": [{"source": "True"}, {"source": "i > 2"}]},
        )
        c = r.json()
        feed_url = f"/clients/{c['id']}/feed"
        empty = etree.fromstring((await http.get(feed_url, headers=bearer(c["token"]))).content)
        assert SCHEMA.validate(empty), SCHEMA.error_log
        for i in range(5):
            router.publish(
                {"i": i, "s": "odd \x01 chars <&>", "b": b"\x00"}, type="t<&>" if i else None
            )
        r = await http.get(feed_url, params={"limit": 2}, headers=bearer(c["token"]))
        doc = etree.fromstring(r.content)
        assert SCHEMA.validate(doc), SCHEMA.error_log
        # The RFC's two Schematron rules, which RELAX NG leaves aside:
        assert doc.xpath("a:author or not(a:entry[not(a:author)])", namespaces=ATOM_NS)
        for entry in doc.xpath("a:entry", namespaces=ATOM_NS):
            assert entry.xpath(
                "a:link[@rel='alternate'] or a:link[not(@rel)] or a:content", namespaces=ATOM_NS
            )
            assert entry.xpath("a:content[@type='xhtml']/x:div", namespaces=XHTML_NS)
        assert doc.xpath("a:link[@rel='next']/@href", namespaces=ATOM_NS)


async def run_router(*args: str) -> tuple[asyncio.subprocess.Process, list[str]]:
    env = {**os.environ, "AA_DISCOVERY_INTERFACES": "lo"}
    proc = await asyncio.create_subprocess_exec(
        AA,
        "router",
        "--port",
        "0",
        "--no-discovery",
        *args,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    assert proc.stdout is not None
    lines = []
    async with asyncio.timeout(30):
        lines.append((await proc.stdout.readline()).decode())
        if "--no-http" not in args:
            lines.append((await proc.stdout.readline()).decode())
    return proc, lines


async def stop(proc: asyncio.subprocess.Process) -> int:
    proc.send_signal(signal.SIGTERM)
    async with asyncio.timeout(20):
        return await proc.wait()


async def test_aa_router_serves_http_by_default_and_stops_on_sigterm() -> None:
    proc, lines = await run_router("--http-port", "0")
    try:
        m = re.search(r"HTTP endpoint and monitor on (http://127\.0\.0\.1:\d+/)", lines[1])
        assert m, lines
        async with httpx.AsyncClient(base_url=m.group(1)) as http:
            assert (await http.get("/health")).json()["status"] == "ok"
            assert (await http.post("/events", json={"values": {"a": 1}})).status_code == 201
            assert (await http.get("/")).status_code == 200
    finally:
        assert await stop(proc) == 0


async def test_aa_router_no_http() -> None:
    proc, lines = await run_router("--no-http")
    try:
        assert "listening on" in lines[0]
        assert proc.stdout is not None
        with pytest.raises(TimeoutError):  # nothing more is printed: no HTTP endpoint
            async with asyncio.timeout(1):
                await proc.stdout.readline()
    finally:
        assert await stop(proc) == 0


async def test_aa_router_refuses_a_bad_allow_range() -> None:
    proc = await asyncio.create_subprocess_exec(
        AA,
        "router",
        "--port",
        "0",
        "--no-discovery",
        "--http-allow",
        "10.0.0.0/99",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        out, err = await proc.communicate()
    assert proc.returncode == 2 and b"not an address range" in err


async def test_a_feed_answer_leaves_in_one_write_and_whole_when_the_connection_closes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Head and body in one `send` (half the system calls and packets of a poll), and a
    client that asks to close gets the whole answer before the close."""
    from asyncio import selector_events

    writes: list[bytes] = []
    transport: Any = selector_events._SelectorSocketTransport  # what uvicorn writes to
    real = transport.write

    def write(self: object, data: bytes) -> None:
        writes.append(bytes(data))
        real(self, data)

    monkeypatch.setattr(transport, "write", write)
    async with (
        open_server() as (router, endpoint),
        httpx.AsyncClient(base_url=endpoint.url) as http,
    ):
        r = await http.post("/clients", json={"patterns": [{"source": "True"}]})
        c = r.json()
        router.publish({"i": 1})
        url, auth = f"/clients/{c['id']}/feed", bearer(c["token"])
        writes.clear()
        r = await http.get(url, headers=auth)
        answers = [w for w in writes if w.startswith(b"HTTP/1.1")]
        assert r.status_code == 200 and len(answers) == 1 and answers[0].endswith(r.content)
        closing = await http.get(url, headers={**auth, "Connection": "close"})
        assert closing.status_code == 200 and closing.content == r.content
        assert closing.headers["connection"] == "close"


async def test_connections_that_do_not_send_a_request_head_in_time_are_closed() -> None:
    # A silent connection, and one trickling its headers (slowloris), each held a file
    # descriptor for good: uvicorn times only the idle wait between two requests.
    endpoint = HttpEndpoint(host="127.0.0.1", port=0, request_head_deadline=0.5)
    async with Router(RouterConfig(port=0, name="http-silent"), endpoints=[endpoint]):
        host, port = endpoint.address
        silent = await asyncio.open_connection(host, port)
        trickle = await asyncio.open_connection(host, port)
        trickle[1].write(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
        keep = await asyncio.open_connection(host, port)  # an ordinary keep-alive client

        async def health() -> bytes:
            keep[1].write(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            async with asyncio.timeout(5):
                head = await keep[0].readuntil(b"\r\n\r\n")
                length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))  # type: ignore[union-attr]
                await keep[0].readexactly(length)
            return head

        assert (await health()).startswith(b"HTTP/1.1 200")
        started = asyncio.get_running_loop().time()
        async with asyncio.timeout(5):
            assert await silent[0].read() == b"" and await trickle[0].read() == b""
        assert (
            asyncio.get_running_loop().time() - started < 4.0
        )  # the 0.5 s deadline, not uvicorn's 5 s keep-alive
        assert (await health()).startswith(
            b"HTTP/1.1 200"
        )  # idle between requests: uvicorn's keep-alive
        for _, writer in (silent, trickle, keep):
            writer.close()


async def test_one_address_cannot_take_every_http_connection() -> None:
    # uvicorn holds 1,000 connections in all: one address (a NAT, or an attacker) could take
    # them all and leave everybody else with 503s. Another address still gets in.
    endpoint = HttpEndpoint(host="127.0.0.1", port=0, max_connections_per_address=3)
    async with Router(RouterConfig(port=0, name="http-per-address"), endpoints=[endpoint]):
        host, port = endpoint.address
        held = [await asyncio.open_connection(host, port) for _ in range(3)]
        for reader, writer in held:  # each served: they count
            writer.write(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            async with asyncio.timeout(5):
                assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        reader, writer = await asyncio.open_connection(host, port)
        async with asyncio.timeout(5):
            refused = await reader.read()  # answered and closed without a request
        assert (
            refused.startswith(b"HTTP/1.1 503")
            and b"3 connections from 127.0.0.1 already" in refused
        )
        writer.close()
        other = await asyncio.open_connection(host, port, local_addr=("127.0.0.2", 0))
        other[1].write(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        async with asyncio.timeout(5):
            assert (await other[0].read()).startswith(b"HTTP/1.1 200")
        held[0][1].close()
        await held[0][1].wait_closed()

        async def served_again() -> bool:
            r, w = await asyncio.open_connection(host, port)
            w.write(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            async with asyncio.timeout(5):
                answer = await r.read()
            w.close()
            return answer.startswith(b"HTTP/1.1 200")

        async with asyncio.timeout(5):  # a slot is free once the server has seen the close
            while not await served_again():
                pass
        for _, w in held[1:]:
            w.close()
