"""Routers that enforce different permissions or revocation lists are reported by ``aa
mesh``: each router's summary carries a hash of its permissions' rules (not of the file) and
its CRL number, and ``aa mesh`` names the routers on each side."""

from __future__ import annotations

import asyncio
import io
import subprocess
import sys
from pathlib import Path

from support import wait_for, wait_shape
from support.meshes import FAST

from aa.router import Router, RouterConfig
from aa.router.security import Permissions, SecurityConfig
from aa.tools.mesh_cmd import format_mesh, mismatches

AA = str(Path(sys.executable).with_name("aa"))

RULES = """\
[users.alice]
publish = ["reading", "sensor.*"]
subscribe = ["reading"]
patterns = "predicates"
"""
#: The same rules, written otherwise: comments, order, spacing.
SAME_RULES = """\
# the lab's rules
[users.alice]
patterns   = "predicates"
subscribe = ["reading"]   # her patterns see readings only
publish = ["sensor.*", "reading"]
"""
#: Alice may also subscribe to alarms here.
OTHER_RULES = RULES.replace('subscribe = ["reading"]', 'subscribe = ["reading", "alarm"]')


async def aa_mesh(endpoint: str) -> subprocess.CompletedProcess[str]:
    """`aa mesh` asked of the router at *endpoint*, as an operator runs it."""
    return await asyncio.to_thread(
        subprocess.run,
        [AA, "mesh", "--router", endpoint, "--timeout", "10"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_digest_is_of_the_rules_not_the_file(tmp_path: Path) -> None:
    files = {}
    for name, text in (("a", RULES), ("b", SAME_RULES), ("c", OTHER_RULES)):
        files[name] = tmp_path / f"{name}.toml"
        files[name].write_text(text)
    a, b, c = (Permissions.load(files[n]).digest() for n in "abc")
    assert a == b and a != c and a is not None and len(a) == 16
    assert Permissions.open().digest() is None
    everyone = RULES + '\n[users."*"]\npublish = ["reading"]\n'
    assert Permissions.parse(everyone, tmp_path / "x.toml").digest() != a


async def test_aa_mesh_names_routers_whose_permissions_differ(tmp_path: Path) -> None:
    routers = []
    # The operator runs `aa mesh` without a certificate: anonymous callers need a section
    # (an empty one: no rights, but known), as for `GET /mesh`.
    for name, text in (("r1", RULES), ("r2", SAME_RULES), ("r3", OTHER_RULES)):
        path = tmp_path / f"{name}.toml"
        path.write_text(text + "\n[anonymous]\n")
        security = SecurityConfig(permissions=path)
        routers.append(Router(RouterConfig(port=0, name=name, mesh=FAST, security=security)))
    plain = Router(RouterConfig(port=0, name="r4", mesh=FAST))
    try:
        for r in routers:
            await r.start()
        r1, r2, r3 = routers
        r2.mesh.add_peer(r1.endpoint)
        r3.mesh.add_peer(r1.endpoint)
        await wait_shape(routers, [(1, 0), (2, 0)])

        def all_summaries() -> bool:
            return len(r3.mesh_info()["routers"]) == 3

        await wait_for(all_summaries, timeout=20)
        info = r3.mesh_info()
        mine = {r["name"]: r for r in info["routers"]}
        assert mine["r1"]["permissions"] == mine["r2"]["permissions"] != mine["r3"]["permissions"]
        assert {r["crl"] for r in info["routers"]} == {None}
        out = io.StringIO()
        format_mesh(info, out)
        assert "permissions differ: r1, r2 vs r3\n" in out.getvalue(), out.getvalue()
        assert "revocation lists differ" not in out.getvalue()

        # As the operator sees it: `aa mesh` asked of any router of the mesh.
        done = await aa_mesh(r1.endpoint)
        assert done.returncode == 0, done.stderr
        assert "permissions differ: r1, r2 vs r3" in done.stdout, done.stdout

        # Without an [anonymous] section the operator's `aa mesh` is refused in one line
        # that says what to do.
        (tmp_path / "r1.toml").write_text(RULES)
        assert "reloaded" in r1.security.reload()
        done = await aa_mesh(r1.endpoint)
        assert done.returncode == 1 and not done.stdout, done
        assert done.stderr.count("\n") == 1, done.stderr
        assert "may do nothing" in done.stderr and "[anonymous] section" in done.stderr
        (tmp_path / "r1.toml").write_text(RULES + "\n[anonymous]\n")
        assert "reloaded" in r1.security.reload()

        # A router with no permissions file joins: it is a side of its own, and says why.
        await plain.start()
        plain.mesh.add_peer(r1.endpoint)
        await wait_for(lambda: len(r1.mesh_info()["routers"]) == 4, timeout=20)
        out = io.StringIO()
        format_mesh(r1.mesh_info(), out)
        assert "permissions differ: r1, r2 vs r3 vs r4 (no permissions file)\n" in out.getvalue(), (
            out.getvalue()
        )

        # Same rules everywhere: nothing to say.
        await asyncio.to_thread((tmp_path / "r3.toml").write_text, SAME_RULES + "\n[anonymous]\n")
        assert "reloaded" in r3.security.reload()
        await wait_for(
            lambda: len({r["permissions"] for r in r1.mesh_info()["routers"]}) == 2, timeout=20
        )
    finally:
        await plain.aclose()
        for r in reversed(routers):
            await r.aclose()


def test_revocation_lists_that_differ_are_named_with_their_numbers() -> None:
    routers = [
        {"id": "a", "name": "r1", "permissions": "x", "crl": 3},
        {"id": "b", "name": "r2", "permissions": "x", "crl": 3},
        {"id": "c", "name": "r3", "permissions": "x", "crl": 2},
        {"id": "d", "name": "old"},  # a router that does not say: left out
    ]
    assert mismatches(routers) == ["revocation lists differ: r1, r2 (CRL 3) vs r3 (CRL 2)"]
    assert mismatches(routers[:2]) == []
