"""`aa top --once` as a user runs it: a real `aa` process against a real router's HTTP
endpoint while events flow; one line, no traceback, when it cannot ask the router."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path

from http_helpers import open_server

from aa.client import AsyncClient

AA = str(Path(sys.executable).with_name("aa"))


async def aa_top(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        AA,
        "top",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "160", **(env or {})},
    )
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


async def test_once_shows_the_clients_and_their_rates_while_events_flow() -> None:
    async with (
        open_server() as (router, endpoint),
        AsyncClient(router.endpoint, name="publisher") as pub,
        AsyncClient(router.endpoint, name="watcher") as sub,
    ):
        await sub.subscribe("n >= 0")
        flowing = asyncio.Event()

        async def publish() -> None:
            n = 0
            while True:
                for _ in range(20):
                    await pub.publish({"n": n})
                    n += 1
                await pub.flush(5)
                flowing.set()

        task = asyncio.create_task(publish())
        try:
            async with asyncio.timeout(10):
                await flowing.wait()
            code, out, err = await aa_top("--once", "--interval", "0.3", endpoint.url)
        finally:
            task.cancel()
    assert code == 0 and err == "", err
    lines = out.splitlines()
    assert f"http-real ({router.id})" in lines[0]
    assert lines[1].startswith("clients 2 ")
    rates = dict(zip(lines[2].split()[1::2], lines[2].split()[2::2], strict=False))
    assert rates["published"] != "0" and rates["delivered"] != "0", lines[2]
    rows = {
        line.split()[1]: line.split()
        for line in lines
        if line.split()[1:2] in (["publisher"], ["watcher"])
    }
    assert set(rows) == {"publisher", "watcher"}, out
    header = next(line.split() for line in lines if line.split()[:1] == ["CLIENT"])
    watcher = dict(zip(header, rows["watcher"][:9], strict=False))
    publisher = dict(zip(header, rows["publisher"][:9], strict=False))
    assert watcher["OUT/s"] != "0" and publisher["IN/s"] != "0", out
    assert "1 (predicate 1)" in " ".join(rows["watcher"])


async def test_an_unreachable_router_is_one_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        code, out, err = await aa_top("--once", f"127.0.0.1:{port}")
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"aa top: cannot reach http://127.0.0.1:{port}/: connection refused")


async def test_a_secured_router_asks_for_a_token_in_one_line_and_takes_one(
    tmp_path: Path,
) -> None:
    import time

    from cryptography.hazmat.primitives import serialization

    from aa.http_api import HttpEndpoint
    from aa.router import Router, RouterConfig
    from aa.router.security import SecurityConfig
    from aa.router.security.tokens import issue_token
    from aa.tools.certs_cmd import init_ca, issue

    await asyncio.to_thread(init_ca, tmp_path)
    await asyncio.to_thread(issue, tmp_path, "r1", "router", days=1)
    (tmp_path / "perms.toml").write_text("[users.bob]\n")
    security = SecurityConfig(
        cert=tmp_path / "r1.pem",
        key=tmp_path / "r1.key",
        ca=tmp_path / "ca.pem",
        permissions=tmp_path / "perms.toml",
        anonymous=False,
    )
    key = serialization.load_pem_private_key((tmp_path / "ca.key").read_bytes(), password=None)
    token = issue_token(key, "bob", now=time.time(), days=1)  # type: ignore[arg-type]
    endpoint = HttpEndpoint(host="127.0.0.1", port=0)
    async with Router(
        RouterConfig(port=0, name="secured", security=security), endpoints=[endpoint]
    ):
        code, out, err = await aa_top("--once", endpoint.url, env={"AA_TOKEN": ""})
        assert code == 1 and out == "" and err.count("\n") == 1, err
        assert "asks for credentials: pass --token or set $AA_TOKEN" in err
        code, out, err = await aa_top(
            "--once", "--interval", "0.1", endpoint.url, env={"AA_TOKEN": token}
        )
        assert code == 0 and err == "" and "secured" in out.splitlines()[0], err
