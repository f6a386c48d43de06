"""The HTTP endpoint goes through the router's one gate (`aa.router.security.Gate`): every
route of the API, read from its own OpenAPI document, asked as anonymous under
``--no-anonymous`` (401), as users without rights (403) and as a user with them (2xx); what
a user may receive filters every answer; bad credentials are 401 and touch nothing else."""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from http_helpers import bearer, open_api
from support import Clock, wait_for
from support.pki import make_pki

from aa.client import AsyncClient, ClientConfig
from aa.http_api.callers import MAX_AUTHORIZATION, OPEN_PATHS
from aa.http_api.live import api as live_api
from aa.http_api.metrics import api as metrics_api
from aa.http_api.routes_clients import api as clients_api
from aa.http_api.stream import api as stream_api
from aa.http_api.stream import close_streams
from aa.http_api.tickets import (
    MAX_TICKETS,
    MAX_TICKETS_PER_USER,
    TICKET_LIFETIME,
    StreamTickets,
    TicketsFull,
)
from aa.router import Router
from aa.router.security import SecurityConfig
from aa.router.security.tokens import issue_token
from aa.tools.certs_cmd import init_ca

RULES = """\
[users.alice]                   # known, with no rights at all

[users.bob]
publish = ["alarm"]
subscribe = ["alarm"]
patterns = "predicates"
persist = true
client_caches = true

[users.carol]
publish = ["*"]
subscribe = ["*"]
patterns = "scripts"
persist = true
client_caches = true
quench = true
"""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("mesh"), ("r1",), ("bob", "carol"))


def token(pki: Path, user: str, now: float) -> str:
    key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), password=None)
    return issue_token(key, user, now=now, days=1)  # type: ignore[arg-type]


def security(pki: Path, perms: Path, **kw: Any) -> SecurityConfig:
    return SecurityConfig(
        cert=pki / "r1.pem",
        key=pki / "r1.key",
        ca=pki / "ca.pem",
        permissions=perms,
        anonymous=False,
        **kw,
    )


@pytest.fixture
def perms(tmp_path: Path) -> Path:
    p = tmp_path / "perms.toml"
    p.write_text(RULES)
    return p


Api = tuple[Router, httpx.AsyncClient, Clock, dict[str, dict[str, str]]]


@pytest.fixture
async def api(pki: Path, perms: Path) -> AsyncIterator[Api]:
    """A router refusing anonymous callers, with the permissions above, its app in-process;
    and the Authorization header of each user."""
    clock = Clock()
    async with open_api(security=security(pki, perms), clock=clock) as (router, http):
        users = {
            u: bearer(token(pki, u, clock.wall())) for u in ("nobody", "alice", "bob", "carol")
        }
        yield router, http, clock, users


# -- the walk over every door ------------------------------------------------------------


def _body(method: str, path: str) -> Any:
    """A plausible body for each operation that takes one."""
    return {
        ("POST", "/events"): {"values": {"x": 1}, "type": "alarm"},
        ("POST", "/clients"): {"patterns": [{"source": "True"}]},
        ("PUT", "/clients/{client_id}/policy"): {"max_count": 5},
        ("POST", "/clients/{client_id}/patterns"): {"source": "True"},
        ("POST", "/clients/{client_id}/ack"): {"cursor": 0},
    }.get((method, path))


async def _call(api: Api, method: str, path: str, headers: dict[str, str]) -> httpx.Response:
    """Call one operation; the path's client is a fresh one of carol's, its event one of
    its feed. A stream is ended once it is open (its answer is then complete)."""
    router, http, _, users = api
    url = path
    if "{client_id}" in path:
        body = {"patterns": [{"source": "True"}]}
        r = await http.post("/clients", json=body, headers=users["carol"])
        assert r.status_code == 201, r.text
        event = router.publish({"x": 1}, type="alarm")
        assert event is not None and event.id is not None
        url = url.replace("{client_id}", r.json()["id"]).replace("{event_id}", quote(event.id))
    url = url.replace("{pattern_id}", "p1")
    request = http.request(method, url, json=_body(method, path), headers=headers)
    if path != "/stream":
        return await request
    state = http._transport.app.app.state  # type: ignore[attr-defined]
    task = asyncio.ensure_future(request)
    await wait_for(lambda: task.done() or bool(state.streams))
    close_streams(state)
    async with asyncio.timeout(5):
        return await task


async def _operations(http: httpx.AsyncClient) -> list[tuple[str, str]]:
    doc = (await http.get("/openapi.json")).json()
    return [(m.upper(), p) for p, ops in doc["paths"].items() for m in ops]


async def test_every_route_asks_the_gate(api: Api) -> None:
    router, http, _, users = api
    operations = await _operations(http)
    assert len(operations) >= 14, operations
    # every route of the application is in the document, or open on purpose
    app = http._transport.app.app.app  # type: ignore[attr-defined]
    included = (*clients_api.routes, *stream_api.routes, *live_api.routes, *metrics_api.routes)
    routes = {
        (m, r.path)
        for r in (*app.routes, *included)
        if hasattr(r, "methods") and r.path not in OPEN_PATHS
        for m in r.methods
        if m != "HEAD"
    }
    assert routes == set(operations)
    for method, path in operations:
        anon = await _call(api, method, path, {})
        assert anon.status_code == 401, (method, path, anon.text)
        assert anon.headers["www-authenticate"].startswith("Bearer")
        nobody = await _call(api, method, path, users["nobody"])
        assert nobody.status_code == 403, (method, path, nobody.text)
        assert nobody.json()["message"] == (
            "user 'nobody' may do nothing: no rule in the permissions file covers this user"
        )
        alice = await _call(api, method, path, users["alice"])
        # no rule to name:
        if path in ("/health", "/mesh", "/metrics", "/clients/live", "/patterns/live"):
            assert alice.status_code == 200, (method, path)
        else:
            assert alice.status_code == 403, (method, path, alice.text)
            assert re.match(
                r"user 'alice' is not allowed to .* \(rule \w+ = ", alice.json()["message"]
            )
        carol = await _call(api, method, path, users["carol"])
        assert 200 <= carol.status_code < 300, (method, path, carol.text)
    # the caller is asked before the body is looked at: a stranger learns nothing from a 422
    r = await http.post("/clients", json={"bogus": 1})
    assert r.status_code == 401, r.text
    r = await http.put("/clients/x/policy", json={"max_count": "many"}, headers=users["alice"])
    assert r.status_code == 403, r.text
    for path in OPEN_PATHS:  # the shells a browser loads before it can ask for a token
        assert (await http.get(path)).status_code == 200, path
    assert (await http.get("/static/aa.js")).status_code == 200


# -- what a user may receive -------------------------------------------------------------


async def test_answers_hold_only_the_types_the_caller_may_receive(api: Api) -> None:
    router, http, _, users = api
    c = await http.post("/clients", json={"patterns": [{"source": "True"}]}, headers=users["bob"])
    assert c.status_code == 201, c.text
    feed = f"/clients/{c.json()['id']}/feed?format=json"
    for n, kind in enumerate(("alarm", "reading", "alarm", None)):
        router.publish({"n": n}, type=kind)
    got = await http.get("/events", headers=users["bob"])
    assert [e["type"] for e in got.json()["events"]] == ["alarm", "alarm"]
    atom = await http.get("/events", headers={**users["bob"], "Accept": "application/atom+xml"})
    assert atom.text.count("<entry") == 2 and "reading" not in atom.text
    everything = await http.get("/events", headers=users["carol"])
    assert len(everything.json()["events"]) == 4
    page = (await http.get(feed, headers=users["bob"])).json()
    assert [e["event"]["type"] for e in page["entries"]] == ["alarm", "alarm"]
    # the client's own token (as a feed reader sends it) is its owner bob, no more
    basic = httpx.BasicAuth(c.json()["id"], c.json()["token"])
    page = (await http.get(feed, auth=basic)).json()
    assert [e["event"]["type"] for e in page["entries"]] == ["alarm", "alarm"]
    # another user's client is not there for carol, and bob's client token opens nothing else
    assert (await http.get(feed, headers=users["carol"])).status_code == 404
    r = await http.post(
        "/events", json={"values": {"x": 1}, "type": "alarm"}, headers=bearer(c.json()["token"])
    )
    assert r.status_code == 201  # publishing as bob: his rules


async def test_patterns_and_publishing_are_refused_by_rule(api: Api) -> None:
    router, http, _, users = api
    bob = users["bob"]
    script = {"pattern": "forward(event)", "format": "script"}
    r = await http.get("/events", params=script, headers=bob)
    assert r.status_code == 403 and "rule patterns" in r.json()["message"], r.text
    r = await http.get("/stream", params=script, headers=bob)
    assert r.status_code == 403 and "rule patterns" in r.json()["message"]
    r = await http.post(
        "/clients",
        json={"patterns": [{"source": "forward(event)", "format": "script"}]},
        headers=bob,
    )
    assert r.status_code == 403 and "rule patterns" in r.json()["message"]
    got: list[Any] = []
    router.subscribe("True", got.append)
    r = await http.post("/events", json={"values": {"x": 1}, "type": "reading"}, headers=bob)
    assert r.status_code == 403
    assert r.json()["message"] == (
        "user 'bob' is not allowed to publish events of type 'reading' "
        f'(rule publish = ["alarm"] in [users.bob] in {router.security.permissions.path})'
    )
    ok = await http.post(
        "/events",
        json={"values": {"x": 2}, "type": "alarm", "meta": {"persist": True, "user": "carol"}},
        headers=bob,
    )
    assert ok.status_code == 201
    assert [(e.values["x"], e.meta["user"]) for e in got] == [(2, "bob")]  # stamped, not forged


async def test_a_reload_takes_effect_at_the_next_request(api: Api, perms: Path) -> None:
    router, http, _, users = api
    c = (
        await http.post("/clients", json={"patterns": [{"source": "True"}]}, headers=users["bob"])
    ).json()
    feed = f"/clients/{c['id']}/feed?format=json"
    router.publish({"n": 1}, type="alarm")
    assert len((await http.get(feed, headers=bearer(c["token"]))).json()["entries"]) == 1
    await asyncio.to_thread(
        perms.write_text, RULES.replace('subscribe = ["alarm"]', "subscribe = []")
    )
    assert "reloaded" in router.security.reload()
    assert (await http.get(feed, headers=bearer(c["token"]))).json()["entries"] == []
    no_caches = RULES.replace("client_caches = true\n\n[users.carol]", "\n[users.carol]")
    await asyncio.to_thread(perms.write_text, no_caches)
    router.security.reload()
    r = await http.get(feed, headers=bearer(c["token"]))
    assert r.status_code == 403 and "rule client_caches" in r.json()["message"]


async def test_a_stream_carries_only_what_its_user_may_receive(api: Api) -> None:
    router, http, _, users = api
    state = http._transport.app.app.state  # type: ignore[attr-defined]
    task = asyncio.ensure_future(http.get("/stream", headers=users["bob"]))
    await wait_for(lambda: bool(state.streams))
    for n, kind in enumerate(("reading", "alarm", "reading")):
        router.publish({"n": n}, type=kind)
    (stream,) = state.streams
    assert [e.type for e in stream.backlog] == ["alarm"]  # what its writer sends next
    close_streams(state)
    async with asyncio.timeout(5):
        assert (await task).status_code == 200


# -- bad credentials ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    other = tmp_path_factory.mktemp("other")
    init_ca(other)
    return other


async def test_bad_credentials_are_401_with_a_reason_and_affect_nothing_else(
    api: Api, pki: Path, other_ca: Path
) -> None:
    router, http, clock, users = api
    other = other_ca
    cases = {
        "Bearer aa1.x.y": "malformed token",
        "Bearer not-a-token": "unknown token",
        "Bearer " + "a" * (MAX_AUTHORIZATION + 1): "longer than",
        "Basic !!!not base64!!!": "not base64",
        "Basic " + base64.b64encode(b"no-colon").decode(): "name:token",
        "Digest x": "must be 'Bearer",
        "Bearer ": "without a token",
        "Bearer " + token(other, "carol", clock.wall()): "not signed by this mesh's CA",
        "Bearer " + token(pki, "carol", clock.wall() - 2 * 86400): "expired",
    }
    for header, reason in cases.items():
        r = await http.get("/health", headers={"Authorization": header})
        assert r.status_code == 401, (header[:40], r.text)
        assert reason in r.json()["message"], (header[:40], r.json())
        assert r.headers["www-authenticate"].startswith("Bearer")
    basic = (
        "Basic " + base64.b64encode(f"bob:{users['carol']['Authorization'][7:]}".encode()).decode()
    )
    r = await http.get("/health", headers={"Authorization": basic})
    assert r.status_code == 401 and "not the token's user" in r.json()["message"]
    assert (await http.get("/health", headers=users["carol"])).status_code == 200


async def test_http_clients_are_capped_per_user_and_per_address(api: Api) -> None:
    router, http, _, users = api
    clients = http._transport.app.app.state.clients  # type: ignore[attr-defined]
    clients.per_user, clients.per_address = 2, 3
    body = {"patterns": [{"source": "True"}]}
    for _ in range(2):
        assert (await http.post("/clients", json=body, headers=users["bob"])).status_code == 201
    r = await http.post("/clients", json=body, headers=users["bob"])
    assert r.status_code == 503 and "user 'bob' already has 2" in r.json()["message"]
    assert (await http.post("/clients", json=body, headers=users["carol"])).status_code == 201
    r = await http.post("/clients", json=body, headers=users["carol"])
    assert r.status_code == 503 and "from 127.0.0.1" in r.json()["message"]
    assert len(clients) == 3


async def test_clients_live_shows_others_only_to_who_may_receive_everything(
    api: Api, pki: Path
) -> None:
    router, http, _, users = api

    def as_user(name: str) -> AsyncClient:
        return AsyncClient(
            config=ClientConfig(
                routers=(router.endpoint,),
                ca=pki / "ca.pem",
                cert=pki / f"{name}.pem",
                key=pki / f"{name}.key",
            )
        )

    async with as_user("bob"), as_user("carol"):
        await wait_for(lambda: len(router.sessions) == 2)
        mine = (await http.get("/clients/live", headers=users["bob"])).json()
        assert [c["user"] for c in mine["items"]] == ["bob"] and mine["clients"] == 1
        every = (await http.get("/clients/live", headers=users["carol"])).json()
        assert sorted(c["user"] for c in every["items"]) == ["bob", "carol"]


# -- stream tickets: how a browser's EventSource opens a stream as a user ----------------


async def _open_stream(http: httpx.AsyncClient, url: str) -> httpx.Response:
    """GET *url* (a stream); once it is open, end it. Its answer, or the refusal."""
    state = http._transport.app.app.state  # type: ignore[attr-defined]
    before = set(state.streams)
    task = asyncio.ensure_future(http.get(url))
    await wait_for(lambda: task.done() or bool(state.streams - before))
    opened = state.streams - before
    if opened:
        (stream,) = opened
        stream.closing = True
        stream.wake.set()
        stream.sub.close()
    async with asyncio.timeout(5):
        return await task


async def test_a_ticket_opens_one_stream_as_its_user_within_seconds(api: Api) -> None:
    router, http, clock, users = api
    state = http._transport.app.app.state  # type: ignore[attr-defined]
    r = await http.post("/stream/tickets", headers=users["bob"])
    assert r.status_code == 201 and r.headers["cache-control"] == "no-store", r.text
    ticket, lifetime = r.json()["ticket"], r.json()["expires_in"]
    assert len(ticket) >= 40 and users["bob"]["Authorization"][7:] not in r.text
    # the stream it opens is bob's: his types only
    task = asyncio.ensure_future(http.get(f"/stream?ticket={ticket}"))
    await wait_for(lambda: task.done() or bool(state.streams))
    for n, kind in enumerate(("reading", "alarm")):
        router.publish({"n": n}, type=kind)
    (stream,) = state.streams
    assert [e.type for e in stream.backlog] == ["alarm"]
    close_streams(state)
    async with asyncio.timeout(5):
        assert (await task).status_code == 200
    # once only
    again = await http.get(f"/stream?ticket={ticket}")
    assert again.status_code == 401 and "used or expired" in again.json()["message"]
    # within its lifetime only (the clock the app was given)
    late = (await http.post("/stream/tickets", headers=users["bob"])).json()["ticket"]
    clock.advance(lifetime + 0.5)
    r = await http.get(f"/stream?ticket={late}")
    assert r.status_code == 401 and "expired" in r.json()["message"]
    # on /stream only: elsewhere a ticket is nobody (401 under --no-anonymous), and unspent
    fresh = (await http.post("/stream/tickets", headers=users["bob"])).json()["ticket"]
    assert (await http.get(f"/health?ticket={fresh}")).status_code == 401
    assert (await _open_stream(http, f"/stream?ticket={fresh}")).status_code == 200
    # made up, or asked for without credentials
    assert (await http.get("/stream?ticket=" + "A" * 43)).status_code == 401
    assert (await http.post("/stream/tickets")).status_code == 401


async def test_a_ticket_stands_for_its_credential_checked_again_when_used(api: Api) -> None:
    router, http, clock, users = api
    # a user without stream rights gets no ticket
    r = await http.post("/stream/tickets", headers=users["alice"])
    assert r.status_code == 403 and "rule subscribe" in r.json()["message"], r.text
    # an HTTP client's token: removed before its ticket is used, the ticket opens nothing
    c = (
        await http.post("/clients", json={"patterns": [{"source": "True"}]}, headers=users["bob"])
    ).json()
    ticket = (await http.post("/stream/tickets", headers=bearer(c["token"]))).json()["ticket"]
    assert (await http.delete(f"/clients/{c['id']}", headers=users["bob"])).status_code == 204
    r = await http.get(f"/stream?ticket={ticket}")
    assert r.status_code == 401 and "unknown token" in r.json()["message"], r.text


async def test_tickets_asked_for_in_a_loop_cost_bounded_memory(api: Api) -> None:
    router, http, clock, users = api
    state = http._transport.app.app.state  # type: ignore[attr-defined]
    first = (await http.post("/stream/tickets", headers=users["bob"])).json()["ticket"]
    for _ in range(3 * MAX_TICKETS_PER_USER):
        assert (await http.post("/stream/tickets", headers=users["bob"])).status_code == 201
    assert len(state.tickets) == MAX_TICKETS_PER_USER  # bob's oldest made room
    assert (await http.get(f"/stream?ticket={first}")).status_code == 401
    carol = (await http.post("/stream/tickets", headers=users["carol"])).json()["ticket"]
    assert (await _open_stream(http, f"/stream?ticket={carol}")).status_code == 200  # untouched
    clock.advance(TICKET_LIFETIME + 1)
    await http.post("/stream/tickets", headers=users["carol"])
    assert len(state.tickets) == 1  # the expired ones are gone


def test_tickets_in_all_are_capped() -> None:
    tickets = StreamTickets()
    for n in range(MAX_TICKETS):
        tickets.issue("Bearer x", f"user{n}", now=0.0)
    with pytest.raises(TicketsFull):
        tickets.issue("Bearer x", "one-more", now=1.0)
    assert len(tickets) == MAX_TICKETS
    assert tickets.issue("Bearer x", "one-more", now=TICKET_LIFETIME + 1)  # room again
    assert len(tickets) == 1
