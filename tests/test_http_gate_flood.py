"""A flood of refused requests costs its sender, not the router's other users. Over a real
uvicorn HTTPS endpoint of a TLS router with ``--no-anonymous`` and a permissions file, a
caller refused again and again (bad or forged tokens, no token, a user without rights) is
answered 429 at the door while other addresses and known users' tokens still get in; on its
TCP port an address whose connections keep being refused (plaintext, no certificate, failed
handshakes) is closed at accept while open connections and other addresses go on, and the
refusals are logged once each with a count; the memory for all this is bounded, and a
remembered token is still checked for expiry and revocation. A user asking past a cap again
and again, told to come back later (503), is held back the same way, and strangers from many
addresses, each within its own budget, are held back as a whole."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import ssl
import time
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from support import next_event
from support.pki import make_pki
from test_http_gate import RULES, security, token

from aa.client import AsyncClient, ClientConfig
from aa.http_api import HttpEndpoint
from aa.http_api.limits import MAX_HTTP_CLIENTS_PER_ADDRESS, STRANGER_REFUSAL_BURST
from aa.mesh import Connection, NotAuthenticated
from aa.mesh.protocol import Hello
from aa.router import Router, RouterConfig
from aa.router.security import RefusalBudget, TokenVerifier
from aa.router.security.refusals import REFUSAL_BURST
from aa.router.security.tokens import MAX_KNOWN_TOKENS


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("mesh"), ("r1",), ("carol",))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def forged(user: str, key: ec.EllipticCurvePrivateKey) -> str:
    """A well-formed token for *user*, signed by *key* (not the mesh CA's), unique."""
    now = int(time.time())
    claims = {"sub": user, "iat": now, "exp": now + 3600, "jti": os.urandom(8).hex()}
    signed = "aa1." + _b64(json.dumps(claims).encode())
    return f"{signed}.{_b64(key.sign(signed.encode(), ec.ECDSA(hashes.SHA256())))}"


def bad_tokens() -> list[str]:
    """Distinct bad tokens, malformed and forged in turn: no cache can answer them."""
    other = ec.generate_private_key(ec.SECP256R1())
    return [
        forged("carol", other) if i % 2 else f"aa1.{os.urandom(12).hex()}.{i}"
        for i in range(3 * REFUSAL_BURST)
    ]


def client(url: str, pki: Path, address: str = "127.0.0.1") -> httpx.AsyncClient:
    trust = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    transport = httpx.AsyncHTTPTransport(local_address=address, verify=trust)
    return httpx.AsyncClient(base_url=url, transport=transport)


async def flood_until_held_back(http: httpx.AsyncClient, headers: list[dict[str, str]]) -> None:
    """Send one request per header set until one is answered 429; the first `REFUSAL_BURST`
    are refusals with their reason, never 429."""
    for i, h in enumerate(headers):
        r = await http.get("/events", headers=h)
        if r.status_code == 429:
            assert i >= REFUSAL_BURST
            assert "too many requests from this caller were refused" in r.json()["message"]
            assert int(r.headers["retry-after"]) >= 1
            return
        assert r.status_code in (401, 403), r.text
    raise AssertionError(f"{len(headers)} refused requests and no 429")


async def test_bad_tokens_from_one_address_are_held_back_and_nobody_else(
    pki: Path, tmp_path: Path
) -> None:
    perms = tmp_path / "perms.toml"
    perms.write_text(RULES)
    endpoint = HttpEndpoint(host="127.0.0.1", port=0, cert=pki / "r1.pem", key=pki / "r1.key")
    config = RouterConfig(port=0, name="r1", security=security(pki, perms))
    bob = {"Authorization": f"Bearer {token(pki, 'bob', time.time())}"}
    async with Router(config, endpoints=[endpoint]):
        async with client(endpoint.url, pki) as http:
            assert (await http.get("/events", headers=bob)).status_code == 200  # bob is known
            bad = [{"Authorization": f"Bearer {t}"} for t in bad_tokens()]
            await flood_until_held_back(http, bad)
            r = await http.get("/events")  # no token either: the address's budget is spent
            assert r.status_code == 429
            r = await http.get("/events", headers=bob)  # a known user's token still gets in
            assert r.status_code == 200, r.text
        async with client(endpoint.url, pki, "127.0.0.2") as other:
            r = await other.get("/events")  # another address: refused with the reason
            assert r.status_code == 401 and "refuses anonymous" in r.json()["message"]
            r = await other.get("/events", headers={"Authorization": f"Bearer {bad_tokens()[1]}"})
            assert r.status_code == 401 and "not signed by this mesh's CA" in r.json()["message"]
            assert (await other.get("/events", headers=bob)).status_code == 200


async def test_a_user_without_rights_spends_their_own_budget(pki: Path, tmp_path: Path) -> None:
    perms = tmp_path / "perms.toml"
    perms.write_text(RULES)  # alice: known, with no rights at all
    endpoint = HttpEndpoint(host="127.0.0.1", port=0, cert=pki / "r1.pem", key=pki / "r1.key")
    config = RouterConfig(port=0, name="r1", security=security(pki, perms))
    now = time.time()
    alice = {"Authorization": f"Bearer {token(pki, 'alice', now)}"}
    bob = {"Authorization": f"Bearer {token(pki, 'bob', now)}"}
    async with Router(config, endpoints=[endpoint]), client(endpoint.url, pki) as http:
        assert (await http.get("/events", headers=bob)).status_code == 200
        r = await http.post("/events", json={"values": {"x": 1}, "type": "alarm"}, headers=alice)
        assert r.status_code == 403 and "[users.alice]" in r.json()["message"]
        await flood_until_held_back(http, [alice] * (3 * REFUSAL_BURST))
        assert (await http.get("/events", headers=bob)).status_code == 200  # bob: untouched
        r = await http.get("/events")  # the address's own budget is untouched too
        assert r.status_code == 401 and "refuses anonymous" in r.json()["message"]


def test_a_refusal_budget_refills_and_forgets_the_oldest_callers() -> None:
    budget = RefusalBudget(burst=3, rate=1.0, max_callers=100)
    for _ in range(3):
        assert budget.wait("address 10.0.0.1", now=0.0) == 0.0
        budget.refused("address 10.0.0.1", now=0.0)
    assert budget.wait("address 10.0.0.1", now=0.0) == pytest.approx(1.0)
    assert budget.wait("address 10.0.0.2", now=0.0) == 0.0  # another caller: its own budget
    assert budget.wait("address 10.0.0.1", now=0.5) == pytest.approx(0.5)
    assert budget.wait("address 10.0.0.1", now=1.0) == 0.0  # one refusal earned back
    assert budget.hold("address 10.0.0.1", now=1.0) == budget.max_pause  # knocked: held back
    assert budget.wait("address 10.0.0.1", now=1.0 + budget.max_pause) > 0  # earned nothing
    assert budget.hold("address 10.0.0.1", now=1.5) == budget.max_pause  # knocked again
    assert budget.wait("address 10.0.0.1", now=1.5 + budget.max_pause + 1.0) == 0.0  # waited
    for i in range(1000):  # a flood from many addresses: memory stays bounded
        budget.refused(f"address 10.1.{i // 256}.{i % 256}", now=2.0)
    assert len(budget) == 100
    assert budget.wait("address 10.0.0.1", now=2.0) == 0.0  # forgotten: a fresh burst


def test_a_remembered_token_is_still_checked_for_expiry_and_revocation(pki: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from aa.router.security import issue_token

    ca = x509.load_pem_x509_certificate((pki / "ca.pem").read_bytes())
    key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    verifier = TokenVerifier(ca)
    now = time.time()
    good = issue_token(key, "bob", now=now, days=1)
    assert verifier.known(good) is None
    assert verifier.verify(good, now=now).user == "bob"
    claims = verifier.known(good)
    assert claims is not None and claims.user == "bob"
    with pytest.raises(NotAuthenticated, match="revoked"):
        verifier.verify(good, now=now, revoked=lambda user, issued: user == "bob")
    with pytest.raises(NotAuthenticated, match="expired"):
        verifier.verify(good, now=now + 2 * 86400)
    payload = good.rsplit(".", 1)[0]  # bob's claims under another key's signature
    other = ec.generate_private_key(ec.SECP256R1())
    stolen = f"{payload}.{_b64(other.sign(payload.encode(), ec.ECDSA(hashes.SHA256())))}"
    with pytest.raises(NotAuthenticated, match="not signed by this mesh's CA"):
        verifier.verify(stolen, now=now)
    assert verifier.known(stolen) is None  # only verified tokens are remembered
    for i in range(MAX_KNOWN_TOKENS + 10):  # memory bounded: the oldest goes
        verifier.verify(issue_token(key, f"u{i}", now=now, days=1), now=now)
    assert verifier.known(good) is None


async def _knock(port: int, kind: str, pki: Path, local: str = "127.0.0.1") -> bytes | None:
    """One connection to the TCP port from *local*: a plaintext hello, a TLS hello without
    (or with carol's) certificate, or garbage that starts like a TLS record. What the router
    answered before it closed; None when it closed without a word or the handshake failed."""
    tls = None
    if kind in ("tls", "carol"):
        tls = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        if kind == "carol":
            tls.load_cert_chain(pki / "carol.pem", pki / "carol.key")
    try:
        async with asyncio.timeout(10):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1",
                port,
                ssl=tls,
                server_hostname="127.0.0.1" if tls else None,
                local_addr=(local, 0),
            )
            if kind == "garbage":
                writer.write(b"\x16\x03\x01\x00\x05hello")
            else:
                writer.write(Connection().send(Hello(client_id=f"k-{os.urandom(4).hex()}")))
            data = await reader.read(65536) if kind == "carol" else await reader.read()
            writer.close()
    except (OSError, ssl.SSLError, asyncio.IncompleteReadError):
        return None
    return data or None


async def test_an_address_refused_again_and_again_is_held_back_at_the_tcp_port(
    pki: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aa.router.security")
    perms = tmp_path / "perms.toml"
    perms.write_text(RULES)
    config = RouterConfig(port=0, name="r1", security=security(pki, perms))
    async with Router(config) as router:
        port = int(router.endpoint.rsplit(":", 1)[1])
        carol = AsyncClient(
            config=ClientConfig(
                routers=(router.endpoint,),
                ca=pki / "ca.pem",
                cert=pki / "carol.pem",
                key=pki / "carol.key",
            )
        )
        await carol.connect()
        try:
            everything = await carol.subscribe("True")
            kinds = ("plain", "tls", "garbage")
            for i in range(3 * REFUSAL_BURST):  # answered, each told why, until held back
                kind = kinds[i % 3]
                answer = await _knock(port, kind, pki)
                if kind == "garbage":
                    continue
                if answer is None:
                    assert i >= REFUSAL_BURST
                    break
                why = b"accepts TLS only" if kind == "plain" else b"refuses anonymous"
                assert why in answer
            else:
                raise AssertionError("no connection held back")
            assert router.counters["held_back"] >= 1
            assert await _knock(port, "tls", pki) is None  # still held back
            router.publish({"n": 1})  # carol's connection, open before, is untouched
            assert (await next_event(everything)).values == {"n": 1}
            welcome = await _knock(port, "carol", pki, local="127.0.0.2")  # another address
            assert welcome is not None and b"welcome" in welcome
        finally:
            await carol.aclose()
    lines = [r.getMessage() for r in caplog.records]
    # One line each, however many: the count of those held back comes with the next line.
    assert sum("handshake from 127.0.0.1 failed" in m for m in lines) == 1, lines
    assert sum("holding back 127.0.0.1" in m for m in lines) == 1, lines
    assert sum("refuses anonymous" in m and "127.0.0.1" in m for m in lines) == 1, lines


async def test_a_user_asking_past_their_cap_again_and_again_is_held_back(
    pki: Path, tmp_path: Path
) -> None:
    perms = tmp_path / "perms.toml"
    perms.write_text(RULES)  # bob and carol may keep client caches
    endpoint = HttpEndpoint(host="127.0.0.1", port=0, cert=pki / "r1.pem", key=pki / "r1.key")
    config = RouterConfig(port=0, name="r1", security=security(pki, perms))
    now = time.time()
    bob = {"Authorization": f"Bearer {token(pki, 'bob', now)}"}
    carol = {"Authorization": f"Bearer {token(pki, 'carol', now)}"}
    phone = {"name": "phone", "patterns": [{"source": "level > 1"}]}
    async with Router(config, endpoints=[endpoint]), client(endpoint.url, pki) as http:
        statuses: list[int] = []
        while 429 not in statuses:
            assert len(statuses) < MAX_HTTP_CLIENTS_PER_ADDRESS + 3 * REFUSAL_BURST
            statuses.append((await http.post("/clients", json=phone, headers=bob)).status_code)
        full = statuses.index(503)
        assert set(statuses[:full]) == {201} and set(statuses[full:-1]) == {503}
        assert len(statuses) - 1 - full >= REFUSAL_BURST  # told "full" that often first
        assert (await http.get("/events", headers=carol)).status_code == 200


async def test_strangers_from_many_addresses_are_held_back_as_a_whole(
    pki: Path, tmp_path: Path
) -> None:
    perms = tmp_path / "perms.toml"
    perms.write_text(RULES)
    endpoint = HttpEndpoint(host="127.0.0.1", port=0, cert=pki / "r1.pem", key=pki / "r1.key")
    config = RouterConfig(port=0, name="r1", security=security(pki, perms))
    bob = {"Authorization": f"Bearer {token(pki, 'bob', time.time())}"}
    async with Router(config, endpoints=[endpoint]), AsyncExitStack() as stack:
        http = await stack.enter_async_context(client(endpoint.url, pki))
        assert (await http.get("/events", headers=bob)).status_code == 200  # bob is known
        botnet = [
            await stack.enter_async_context(client(endpoint.url, pki, f"127.0.1.{i}"))
            for i in range(1, 21)
        ]
        refused = [0] * len(botnet)
        for n in range(len(botnet) * (REFUSAL_BURST - 1)):  # each under its own budget
            i = n % len(botnet)
            r = await botnet[i].get("/events")
            if r.status_code == 429:
                break
            assert r.status_code == 401
            refused[i] += 1
        else:
            raise AssertionError("a flood from many addresses was never held back")
        assert max(refused) < REFUSAL_BURST and sum(refused) >= STRANGER_REFUSAL_BURST
        assert (await http.get("/events", headers=bob)).status_code == 200  # known: still in
