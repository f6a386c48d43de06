"""Safer defaults: an open mesh where a claimed router id never displaces a live link,
refusals logged once per source, a warning (and "open" in `aa mesh`) for a router reachable
off loopback without TLS, and a service unit that is secure as written."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from support import line, mesh, wait_for
from support.meshes import FAST
from support.wire import Wire

from aa.mesh import Event
from aa.mesh.protocol import Error, PeerHello
from aa.router.router import is_loopback
from aa.router.security import Permissions
from aa.router.security.gate import RefusalLog
from aa.tools.certs_cmd import init_ca, issue
from aa.tools.mesh_cmd import format_mesh
from aa.tools.service_cmd import unit_text

AA = str(Path(sys.executable).with_name("aa"))


def _impostor(host: str, port: int, claimed: str) -> Error | None:
    """A stranger calls claiming router id *claimed*; the error it is told, if any."""
    wire = Wire(host, port)
    try:
        wire.send(PeerHello(router_id=claimed, name="impostor"))
        wire.read_until(lambda got: any(type(m) is Error for m in got), timeout=10.0)
        errors = [m for m in wire.got if type(m) is Error]
        return errors[0] if errors else None  # type: ignore[return-value]
    finally:
        wire.close()


async def test_a_claimed_router_id_never_displaces_a_live_link(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="aa.router")
    async with mesh(2, line(2)) as (r0, r1):
        link = r0.mesh.links[r1.id]
        assert link.since is not None
        # A settled link (older than one keep-alive interval): what an attacker would cut.
        await wait_for(lambda: time.monotonic() - link.since >= FAST.keepalive)  # type: ignore[operator]
        got: list[Event] = []
        r0.subscribe("True", got.append)
        host, port = r0.address
        for _ in range(5):
            error = await asyncio.to_thread(_impostor, host, port, r1.id)
            assert error is not None and error.code == "duplicate-id", error
            assert "has a live link here" in error.message
        assert r0.mesh.links[r1.id] is link and link.state == "up"
        for n in range(20):
            r1.publish({"n": n})
        await wait_for(lambda: len(got) == 20)  # none lost on the real link
        assert [e.values["n"] for e in got] == list(range(20))
        refusals = [r for r in caplog.records if "that router id has a live link" in r.message]
        assert len(refusals) == 1, [r.message for r in refusals]  # one line per source


def test_refusals_are_logged_once_per_source_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="aa.router.security")
    log = RefusalLog(interval=60.0)
    assert log.note("10.0.0.1", "refusing a", now=100.0)
    assert not log.note("10.0.0.1", "refusing a", now=101.0)
    assert not log.note("10.0.0.1", "refusing a", now=159.0)
    assert log.note("10.0.0.2", "refusing b", now=102.0)  # another source is its own
    assert log.note("10.0.0.1", "refusing a", now=160.5)
    assert [r.getMessage() for r in caplog.records] == [
        "refusing a",
        "refusing b",
        "refusing a (2 more from 10.0.0.1 in the last 60 s)",
    ]


async def test_a_loopback_router_is_not_open_and_says_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="aa.router")
    async with mesh(1) as (r0,):
        assert not r0.open and r0.mesh_info()["routers"][0]["open"] is False
    assert "without TLS" not in caplog.text
    for host, loopback in (
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.20", False),
        ("router.example", False),
    ):
        assert is_loopback(host) is loopback, host


def test_aa_mesh_shows_an_open_router() -> None:
    info = {
        "router": "a",
        "routers": [
            {"id": "a", "name": "lab", "peer": "10.0.0.5:7447", "open": True},
            {"id": "b", "name": "safe", "peer": "10.0.0.6:7447", "open": False},
        ],
    }
    out = io.StringIO()
    format_mesh(info, out)
    text = out.getvalue().splitlines()
    lab = next(i for i, t in enumerate(text) if t.startswith("lab"))
    assert text[lab + 1].strip().startswith("open: listens off loopback without TLS")
    assert sum("open:" in t for t in text) == 1


def test_the_secured_service_unit_refuses_anonymous_and_reads_crl_and_permissions(
    tmp_path: Path,
) -> None:
    certs = tmp_path / "certs"
    init_ca(certs)
    issue(certs, "lab", "router", days=5)
    perms = tmp_path / "etc" / "permissions.toml"
    units = tmp_path / "units"
    args = ["service", "install", "router", "--certs", str(certs), "--cert-name", "lab"]
    args += ["--unit-dir", str(units), "--permissions", str(perms), "--program", "/usr/bin/aa"]
    done = subprocess.run([AA, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    text = (units / "aa-router.service").read_text()
    start = next(ln for ln in text.splitlines() if ln.startswith("ExecStart="))
    assert start.endswith(f"router --config {units / 'aa-router.toml'}")
    settings = tomllib.loads((units / "aa-router.toml").read_text())["security"]
    assert settings["anonymous"] is False
    assert settings["crl"] == str(certs / "crl.pem")  # read in place: revocations reach it live
    assert settings["permissions"] == str(perms)
    assert "ExecReload=/bin/kill -HUP $MAINPID" in text
    # The template parses and denies everything.
    rules = Permissions.load(perms)
    assert rules.rules_for("alice") is None and rules.rules_for("anonymous") is None
    # A filled-in file is never overwritten.
    perms.write_text('[users.alice]\nsubscribe = ["*"]\npatterns = "predicates"\n')
    done = subprocess.run([AA, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert Permissions.load(perms).rules_for("alice") is not None
    # Without --certs nothing changes (and the container gets no reload it cannot do).
    plain = unit_text("container", user=False, program="/usr/bin/aa")
    assert "--no-anonymous" not in plain and "ExecReload" not in plain


def test_aa_router_help_names_the_crl_flag() -> None:
    done = subprocess.run(
        [AA, "router", "--help"], capture_output=True, text=True, timeout=60, env=dict(os.environ)
    )
    assert "--crl FILE" in done.stdout
