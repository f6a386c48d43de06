"""`aa router` with the security flags, `aa send` with $AA_CA/$AA_CERT/$AA_KEY, HTTPS on the
HTTP endpoint with the router's certificate, SIGHUP reloading permissions — real processes."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
from support import next_event

from aa.client import AsyncClient, ClientConfig
from aa.tools.certs_cmd import init_ca, issue
from aa.tools.service_cmd import unit_text

AA = str(Path(sys.executable).with_name("aa"))


async def _line(stream: asyncio.StreamReader, pattern: str) -> re.Match[str]:
    async with asyncio.timeout(20):
        while True:
            line = (await stream.readline()).decode()
            assert line, "the router exited"
            m = re.search(pattern, line)
            if m:
                return m


async def test_secured_router_on_the_console(tmp_path: Path) -> None:
    init_ca(tmp_path)
    issue(tmp_path, "r1", "router", days=5)
    issue(tmp_path, "alice", "client", days=5)
    perms = tmp_path / "perms.toml"
    perms.write_text('[users.alice]\npublish = ["*"]\nsubscribe = ["*"]\npatterns = "predicates"\n')
    env = {
        **os.environ,
        "AA_CERT": str(tmp_path / "r1.pem"),
        "AA_KEY": str(tmp_path / "r1.key"),
        "AA_CA": str(tmp_path / "ca.pem"),
    }
    proc = await asyncio.create_subprocess_exec(
        AA,
        "router",
        "--port",
        "0",
        "--no-discovery",
        "--no-anonymous",
        "--permissions",
        str(perms),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        endpoint = (await _line(proc.stdout, r"listening on (127\.0\.0\.1:\d+)")).group(1)
        url = (await _line(proc.stdout, r"HTTP endpoint and monitor on (\S+)")).group(1)
        assert url.startswith("https://")
        async with httpx.AsyncClient(
            verify=ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        ) as http:
            # served over TLS, and the gate asks a caller without a token for one
            assert (await http.get(url + "mesh")).status_code == 401
        config = ClientConfig(
            routers=(endpoint,),
            ca=tmp_path / "ca.pem",
            cert=tmp_path / "alice.pem",
            key=tmp_path / "alice.key",
        )
        async with AsyncClient(config=config) as alice:
            sub = await alice.subscribe('meta["user"] == "alice"')
            user_env = {
                **env,
                "AA_CERT": str(tmp_path / "alice.pem"),
                "AA_KEY": str(tmp_path / "alice.key"),
            }
            send = await asyncio.create_subprocess_exec(
                AA,
                "send",
                "--router",
                endpoint,
                "x=1",
                env=user_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            async with asyncio.timeout(30):
                _, err = await send.communicate()
            assert send.returncode == 0, err
            assert (await next_event(sub)).values == {"x": 1}
        perms.write_text("[users.alice\n")  # broken: the router says so and keeps the old rules
        proc.send_signal(signal.SIGHUP)
        assert "old rules stay" in (await _line(proc.stderr, r"permissions .*")).group(0)
    finally:
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            await proc.wait()
    assert proc.returncode == 0


async def test_bad_security_flags_get_one_line(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        AA,
        "router",
        "--port",
        "0",
        "--no-discovery",
        "--cert",
        str(tmp_path / "none.pem"),
        "--key",
        str(tmp_path / "none.key"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        _, err = await proc.communicate()
    assert proc.returncode == 2
    assert err.decode().strip().splitlines() == [
        f"aa router: certificate {tmp_path / 'none.pem'} does not exist"
    ]


def test_service_unit_runs_unprivileged_and_points_at_the_certificates() -> None:
    text = unit_text(
        "router", user=False, program="/usr/bin/aa", certs=Path("/etc/aa/certs"), cert_name="lab"
    )
    assert "DynamicUser=yes" in text and "NoNewPrivileges=yes" in text
    assert "LoadCredential=lab.key:/etc/aa/certs/lab.key" in text
    assert (
        "--cert ${CREDENTIALS_DIRECTORY}/lab.pem" in text
        and "--ca ${CREDENTIALS_DIRECTORY}/ca.pem" in text
    )


def test_service_unit_raises_the_open_file_limit() -> None:
    """systemd's default 1,024 open files would cap a router at about a thousand clients."""
    for user in (False, True):
        assert (
            "LimitNOFILE=65536"
            in unit_text("router", user=user, program="/usr/bin/aa").splitlines()
        )
