"""The phone app's shell (``/app/``) and the CORS answers that let it roam, in-process: the
shell opens without credentials (and only the shell), a shared link keeps its pattern
through the redirect, the manifest makes it installable, and only the mesh's own hosts may
read answers cross-origin (never with the user's ambient credentials)."""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives import serialization
from http_helpers import bearer, open_api

from aa.http_api import cors
from aa.router.security import SecurityConfig
from aa.router.security.tokens import issue_token
from aa.tools.certs_cmd import init_ca, issue

PREFLIGHT = {
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization",
}


async def test_the_shell_opens_without_a_token_and_its_data_calls_do_not(tmp_path: Path) -> None:
    init_ca(tmp_path)
    issue(tmp_path, "r1", "router", days=30)
    perms = tmp_path / "perms.toml"
    perms.write_text("[users.carol]\nclient_caches = true\nsubscribe = ['*']\n")
    config = SecurityConfig(
        cert=tmp_path / "r1.pem",
        key=tmp_path / "r1.key",
        ca=tmp_path / "ca.pem",
        permissions=perms,
        anonymous=False,
    )
    async with open_api(security=config) as (_, http):
        for path in (
            "/app/",
            "/app/app.js",
            "/app/sw.js",
            "/app/manifest.webmanifest",
            "/app/icon-512.png",
        ):
            r = await http.get(path)
            assert r.status_code == 200, path
            assert "script-src 'self'" in r.headers["content-security-policy"]
        assert (await http.post("/clients", json={})).status_code == 401  # the data is not open
        key = serialization.load_pem_private_key((tmp_path / "ca.key").read_bytes(), None)
        carol = bearer(
            issue_token(key, "carol", now=http._transport.app.app.app.state.wall(), days=1)
        )  # type: ignore[arg-type,attr-defined]
        assert (await http.post("/clients", json={}, headers=carol)).status_code == 201


async def test_a_shared_link_keeps_its_pattern_and_the_manifest_installs() -> None:
    async with open_api() as (_, http):
        r = await http.get("/app?pattern=Temperature%20%3E%20100")
        assert r.status_code == 307
        assert r.headers["location"].endswith("/app/?pattern=Temperature%20%3E%20100")
        manifest = (await http.get("/app/manifest.webmanifest")).json()
        assert manifest["display"] == "standalone" and manifest["start_url"] == "/app/"
        sizes = {i["sizes"] for i in manifest["icons"]}
        assert {"192x192", "512x512"} <= sizes
        for icon in manifest["icons"]:
            body = (await http.get("/app/" + icon["src"])).content
            side = int(icon["sizes"].split("x")[0])
            assert body[:8] == b"\x89PNG\r\n\x1a\n"
            assert int.from_bytes(body[16:20], "big") == side  # the PNG's width is its size
        sw = await http.get("/app/sw.js")
        assert sw.headers["service-worker-allowed"] == "/app/"
        assert (await http.get("/app/..%2f..%2fapp.py")).status_code == 404


async def test_cors_answers_the_mesh_hosts_only_and_never_with_credentials() -> None:
    async with open_api() as (router, http):
        mine = await http.options(
            "/clients", headers={"Origin": "http://127.0.0.1:9999", **PREFLIGHT}
        )
        assert mine.status_code == 204
        assert mine.headers["access-control-allow-origin"] == "http://127.0.0.1:9999"
        assert "Authorization" in mine.headers["access-control-allow-headers"]
        assert "access-control-allow-credentials" not in mine.headers
        named = await http.get("/health", headers={"Origin": "https://aa.test:8443"})
        assert named.headers["access-control-allow-origin"] == "https://aa.test:8443"
        for stranger in (
            "http://evil.example",
            "null",
            "http://127.0.0.1.evil.example",
            "file://",
            "http://user@127.0.0.1",
            "http://127.0.0.1:1/path",
        ):
            r = await http.options("/clients", headers={"Origin": stranger, **PREFLIGHT})
            assert r.status_code == 405, stranger  # no preflight answer: the browser stops
            r = await http.get("/health", headers={"Origin": stranger})
            assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
        # The feed's fast path answers cross-origin too, with the cursor readable.
        c = (await http.post("/clients", json={"patterns": [{"source": "True"}]})).json()
        feed = await http.get(
            f"/clients/{c['id']}/feed?format=json",
            headers={"Origin": "http://localhost:1234", **bearer(c["token"])},
        )
        assert feed.status_code == 200
        assert feed.headers["access-control-allow-origin"] == "http://localhost:1234"
        assert "Aa-Cursor" in feed.headers["access-control-expose-headers"]


def test_mesh_hosts_are_read_from_the_mesh_picture() -> None:
    info = {
        "routers": [
            {
                "client": "10.0.0.5:7447",
                "peer": "10.0.0.5:7447",
                "peers": [{"address": "[fd00::7]:51000"}],
            },
            {"client": 7, "peers": "garbage"},
            "garbage",
        ]
    }
    assert cors.mesh_hosts(info) == {"10.0.0.5", "fd00::7"}
    assert cors.allowed("http://10.0.0.5:7448", frozenset(), lambda: cors.mesh_hosts(info))
    assert not cors.allowed("http://10.0.0.6:7448", frozenset(), lambda: cors.mesh_hosts(info))
    assert cors.origin_host("http://" + "a" * 400) is None
