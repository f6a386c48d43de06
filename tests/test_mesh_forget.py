"""Forgetting routers that are gone: `aa mesh forget ROUTER` (by id, name or address; for
administrators only), routers of no use for `forget_after` not read back from the topology
file, and routers whose summaries stopped shown as gone in `aa mesh`."""

from __future__ import annotations

import asyncio
import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import FAST, line, mesh, wait_for

from aa.client import AsyncClient
from aa.mesh import PeerTable, RemoteError, Source, load_topology, save_topology
from aa.router import MeshConfig, Router, RouterConfig
from aa.router.security import Permissions, SecurityConfig
from aa.tools.mesh_cmd import format_mesh

AA = str(Path(sys.executable).with_name("aa"))
A, B = "10.0.0.2:7447", "10.0.0.3:7447"
#: Summaries every few seconds: a stopped router's summary is still held while the test runs.
SLOW_INFO = MeshConfig(
    retry_base=0.05, retry_max=0.5, retry_jitter=0.0, keepalive=0.3, info_interval=5.0
)


async def run_aa(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        AA, *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    async with asyncio.timeout(30):
        out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


def test_the_peer_table_forgets_by_address_or_id_whatever_the_source() -> None:
    t = PeerTable(jitter=0.0)
    t.add(A, source=Source.CONFIGURED, now=0.0, router_id="ra")
    t.add(B, source=Source.TOLD, now=0.0, router_id="rb")
    assert [e.address for e in t.forget("ra")] == [A]
    assert t.forget(A) == [] and t.forget("nobody") == []
    assert [e.router_id for e in t.forget(B)] == ["rb"] and len(t) == 0


def test_routers_of_no_use_for_forget_after_are_not_read_back(tmp_path: Path) -> None:
    """A router stopped long ago is not dialled again at every start (`make run` after the
    mesh example redialled the example's routers for a week)."""
    path = tmp_path / "topology.json"
    t = PeerTable(jitter=0.0, forget_after=3600.0)
    t.add(A, source=Source.DISCOVERED, now=0.0)  # last of use at 0
    t.add(B, source=Source.DISCOVERED, now=3000.0)  # last of use 10 minutes before the save
    save_topology(path, t, now=3600.0, wall_now=1_000_000.0)
    again = PeerTable(jitter=0.0, forget_after=3600.0)
    assert load_topology(path, again, now=50.0, wall_now=1_000_000.0) == 1
    assert [e.address for e in again] == [B]


def test_admin_is_for_loopback_without_a_file_and_for_admin_users_with_one(
    tmp_path: Path,
) -> None:
    open_ = Permissions.open()
    for host in ("127.0.0.1", "::1", "::ffff:127.0.0.1", "127.5.6.7"):
        assert open_.admin_refusal("anonymous", host) is None, host
    for host in ("10.0.0.5", "::ffff:10.0.0.5", "fe80::1%eth0", "?"):
        refusal = open_.admin_refusal("anonymous", host)
        assert refusal is not None and "loopback" in refusal and "admin = true" in refusal
    perms = tmp_path / "perms.toml"
    perms.write_text("[anonymous]\nsubscribe = ['*']\n\n[users.ops]\nadmin = true\n")
    rules = Permissions.load(perms)
    assert rules.admin_refusal("ops", "10.0.0.5") is None  # the file decides, not the host
    assert rules.admin_refusal("anonymous", "127.0.0.1") == (
        f"not allowed to administer this router (rule admin = false in [anonymous] in {perms})"
    )
    assert "no rule" in (rules.admin_refusal("mallory", "127.0.0.1") or "")
    perms.write_text("[users.ops]\nsubscribe = ['*']\nadmin = 'yes'\n")
    with pytest.raises(ValueError, match=r"line 3: admin in \[users.ops\] must be true or false"):
        Permissions.load(perms)


async def test_aa_mesh_forget_drops_a_stopped_router_from_the_table_the_file_and_the_picture(
    tmp_path: Path,
) -> None:
    data = tmp_path / "a"
    path = data / "topology.json"
    b = Router(RouterConfig(port=0, name="b", mesh=SLOW_INFO))
    await b.start()
    try:
        a = Router(RouterConfig(port=0, name="a", data_dir=data, mesh=SLOW_INFO))
        async with a:
            a.mesh.dialer.add(b.endpoint, Source.DISCOVERED, time.monotonic(), None)
            await wait_for(lambda: b.id in a.mesh.links and b.id in a.mesh.view.known())
            await wait_for(lambda: path.exists() and b.endpoint in path.read_text())
            # Linked: not forgotten, one line saying why; nothing changes.
            code, out, err = await run_aa("mesh", "forget", "b", "--router", a.endpoint)
            assert (code, out) == (1, "")
            assert (
                err == "aa mesh: not forgotten: b is linked with this router now: stop it first\n"
            )
            assert b.endpoint in a.mesh.table
            await b.aclose()
            await wait_for(lambda: b.id not in a.mesh.links)
            # By name, as `aa mesh` shows it: gone from the table, the picture and the file.
            code, out, err = await run_aa("mesh", "--router", a.endpoint, "forget", "b")
            assert (code, err) == (0, "")
            assert out == f"forgot b {b.id} ({b.endpoint})\n"
            assert b.endpoint not in a.mesh.table
            assert [r["id"] for r in a.mesh_info()["routers"]] == [a.id]
            await wait_for(lambda: b.endpoint not in path.read_text())
            # Once more: it knows of no such router, and says so in one line.
            code, out, err = await run_aa("mesh", "forget", b.endpoint, "--router", a.endpoint)
            assert code == 1 and out == ""
            assert err.startswith(f"aa mesh: the router knows of no router '{b.endpoint}'")
            # Itself: refused.
            async with AsyncClient(a.endpoint) as c:
                with pytest.raises(RemoteError, match="is this router"):
                    await c.forget_router(a.id, timeout=5)
        # The file a restart reads no longer names it.
        saved = json.loads(path.read_text())
        assert b.endpoint not in {r["address"] for r in saved["routers"]}
    finally:
        await b.aclose()


async def test_forget_needs_admin_when_the_router_has_a_permissions_file(
    tmp_path: Path,
) -> None:
    perms = tmp_path / "perms.toml"
    perms.write_text("[anonymous]\nsubscribe = ['*']\npatterns = 'predicates'\n")
    security = SecurityConfig(permissions=perms)
    async with Router(RouterConfig(port=0, security=security, mesh=FAST)) as r:
        r.mesh.dialer.add("127.0.0.1:9", Source.TOLD, time.monotonic(), None)
        code, out, err = await run_aa("mesh", "forget", "127.0.0.1:9", "--router", r.endpoint)
        assert (code, out) == (1, "")
        assert err == (
            "aa mesh: not forgotten: user 'anonymous' is not allowed to administer this router "
            f"(rule admin = false in [anonymous] in {perms})\n"
        )
        assert "127.0.0.1:9" in r.mesh.table  # nothing changed
        perms.write_text("[anonymous]\nadmin = true\n")
        r.security.reload()
        code, out, err = await run_aa("mesh", "forget", "127.0.0.1:9", "--router", r.endpoint)
        assert (code, err, out) == (0, "", "forgot 127.0.0.1:9 (127.0.0.1:9)\n")
        assert "127.0.0.1:9" not in r.mesh.table


async def test_a_router_whose_summaries_stopped_is_shown_as_gone() -> None:
    async with mesh(2, line(2)) as (r0, r1):
        await wait_for(lambda: r1.id in r0.mesh.view.known())
        now = time.monotonic()
        fresh = {r["id"]: r for r in r0.mesh.view.info(now)["routers"]}
        assert not fresh[r0.id]["gone"] and not fresh[r1.id]["gone"]
        # Three of its intervals later without a new one: gone (the router itself never is).
        later = {r["id"]: r for r in r0.mesh.view.info(now + 3 * FAST.info_interval)["routers"]}
        assert later[r1.id]["gone"] and not later[r0.id]["gone"]
        out = io.StringIO()
        format_mesh({"router": r0.id, "routers": list(later.values())}, out)
        text = out.getvalue()
        assert re.search(r" gone \d+\.\ds\n", text)
        assert "    gone: its summaries stopped" in text and "aa mesh forget r1" in text
        assert "peers: r0" not in text  # a gone router's last peers are not shown as live
        # Much later its summary is dropped.
        ids = [r["id"] for r in r0.mesh.view.info(now + 60 * FAST.info_interval)["routers"]]
        assert ids == [r0.id]
