"""TLS on the router's port, with real certificates (made by `aa certs`) and real sockets:
users stamped and filterable, impostor routers kept out, plaintext and expired certificates
refused with a clear message, strangers' garbage costing others nothing."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from support import next_event, wait_for

from aa.client import AsyncClient, ClientConfig
from aa.mesh import RemoteError, UsageError
from aa.mesh.protocol import NEED_DATA, Connection, Error, Hello, PeerHello
from aa.router import MeshConfig, Router, RouterConfig
from aa.router.security import SecurityConfig
from aa.tools.certs_cmd import init_ca, issue


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A mesh CA with routers r1, r2 and users alice, bob; an expired user; and an
    impostor CA with its own router."""
    mesh = tmp_path_factory.mktemp("mesh")
    evil = tmp_path_factory.mktemp("evil")
    init_ca(mesh)
    init_ca(evil)
    for name in ("r1", "r2"):
        issue(mesh, name, "router", days=30)
    for name in ("alice", "bob"):
        issue(mesh, name, "client", days=30)
    issue(mesh, "old", "client", days=1, now=datetime.now(UTC) - timedelta(days=3))
    issue(evil, "impostor", "router", days=30)
    return {"mesh": mesh, "evil": evil}


def sec(folder: Path, name: str, **kw: Any) -> SecurityConfig:
    return SecurityConfig(
        cert=folder / f"{name}.pem", key=folder / f"{name}.key", ca=folder / "ca.pem", **kw
    )


def user(pki: dict[str, Path], name: str | None, **kw: Any) -> ClientConfig:
    mesh = pki["mesh"]
    files = (
        {"cert": mesh / f"{name}.pem", "key": mesh / f"{name}.key"}
        if name
        else {"cert": None, "key": None}
    )
    return ClientConfig(ca=mesh / "ca.pem", **files, **kw)  # type: ignore[arg-type]


FAST = MeshConfig(
    retry_base=0.05, retry_max=0.2, retry_jitter=0.0, keepalive=1.0, info_interval=1.0
)


@pytest.fixture
async def r1(pki: dict[str, Path]) -> AsyncIterator[Router]:
    async with Router(
        RouterConfig(port=0, name="r1", security=sec(pki["mesh"], "r1"), mesh=FAST)
    ) as r:
        yield r


async def connect(router: Router, config: ClientConfig) -> AsyncClient:
    c = AsyncClient(config=ClientConfig(**{**_fields(config), "routers": (router.endpoint,)}))
    await c.connect()
    return c


def _fields(config: ClientConfig) -> dict[str, Any]:
    return {name: getattr(config, name) for name in config.__dataclass_fields__}


async def test_user_is_stamped_and_patterns_filter_on_it(pki: dict[str, Path], r1: Router) -> None:
    alice = await connect(r1, user(pki, "alice"))
    anon = await connect(r1, user(pki, None))
    watcher = await connect(r1, user(pki, "bob"))
    try:
        only_alice = await watcher.subscribe('meta["user"] == "alice"')
        everyone = await watcher.subscribe("True")
        await anon.publish({"n": 1}, meta={"user": "alice"})  # a forged user is replaced
        await anon.flush()
        await alice.publish({"n": 2})
        await alice.flush()
        got = await next_event(only_alice)  # n=1 was dispatched first: the filter dropped it
        assert (got.values["n"], got.meta["user"]) == (2, "alice")
        seen = sorted(
            ((await next_event(everyone)), (await next_event(everyone))),
            key=lambda e: e.values["n"],
        )
        assert [e.meta["user"] for e in seen] == ["anonymous", "alice"]
    finally:
        for c in (alice, anon, watcher):
            await c.aclose()


async def test_plaintext_client_on_a_tls_port_is_told_why(r1: Router) -> None:
    client = AsyncClient(
        config=ClientConfig(
            routers=(r1.endpoint,), ca=None, cert=None, key=None, connect_timeout=1.0
        )
    )
    started = time.monotonic()
    with pytest.raises(RemoteError, match="accepts TLS only"):
        await client.connect(timeout=20.0)  # at once: a refusal that trying again will not change
    await client.aclose()
    assert time.monotonic() - started < 3.0
    assert r1.counters["refused_plaintext"] >= 1


async def test_tls_client_on_a_plaintext_router_is_told_why(
    pki: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aa.router")
    async with Router(RouterConfig(port=0)) as plain:
        client = AsyncClient(
            config=ClientConfig(
                **{
                    **_fields(user(pki, "alice")),
                    "routers": (plain.endpoint,),
                    "connect_timeout": 1.0,
                }
            )
        )
        with pytest.raises(RemoteError, match="does not speak TLS"):
            await client.connect(timeout=20.0)
        await client.aclose()
    # and the router's log says what came, not "a frame of 369,295,618 bytes"
    assert "a TLS handshake, not a frame" in caplog.text and "is over the cap" not in caplog.text


async def test_anonymous_clients_refused_when_the_router_says_so(pki: dict[str, Path]) -> None:
    config = RouterConfig(port=0, security=sec(pki["mesh"], "r1", anonymous=False))
    async with Router(config) as router:
        anon = AsyncClient(
            config=ClientConfig(**{**_fields(user(pki, None)), "routers": (router.endpoint,)})
        )
        with pytest.raises(RemoteError, match="refuses anonymous clients"):
            await anon.connect(timeout=20.0)
        await anon.aclose()
        alice = await connect(router, user(pki, "alice"))  # a user is welcome
        await alice.aclose()


async def test_client_ranges_refuse_others_with_the_reason(pki: dict[str, Path]) -> None:
    config = RouterConfig(port=0, security=sec(pki["mesh"], "r1", allow_clients=("10.0.0.0/8",)))
    async with Router(config) as router:
        c = AsyncClient(
            config=ClientConfig(**{**_fields(user(pki, "alice")), "routers": (router.endpoint,)})
        )
        with pytest.raises(RemoteError, match="not allowed here"):
            await c.connect(timeout=20.0)  # told at once: waiting would not change it
        await c.aclose()


async def test_expired_certificates_are_refused(pki: dict[str, Path], r1: Router) -> None:
    mesh = pki["mesh"]
    with pytest.raises(
        UsageError, match="expired"
    ):  # the client's own check, before any connection
        ClientConfig(ca=mesh / "ca.pem", cert=mesh / "old.pem", key=mesh / "old.key")
    with pytest.raises(UsageError, match="expired"):  # a router refuses to start with one
        Router(RouterConfig(port=0, security=sec(mesh, "old")))
    # And the router refuses it in the handshake, whatever the client checked.
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(mesh / "ca.pem")
    ctx.load_cert_chain(mesh / "old.pem", mesh / "old.key")
    host, port = r1.address
    with pytest.raises((ssl.SSLError, ConnectionResetError, asyncio.IncompleteReadError)):
        reader, writer = await asyncio.open_connection(host, port, ssl=ctx)
        writer.write(Connection().send(Hello(client_id="old")))
        await reader.readexactly(1)  # TLS 1.3 reports the refusal at the first read
    assert r1.sessions == set()


async def test_impostor_router_cannot_join_and_its_events_reach_no_one(
    pki: dict[str, Path], r1: Router
) -> None:
    r2_config = RouterConfig(
        port=0, name="r2", security=sec(pki["mesh"], "r2"), peers=(r1.endpoint,), mesh=FAST
    )
    bad_config = RouterConfig(
        port=0,
        name="impostor",
        security=sec(pki["evil"], "impostor"),
        peers=(r1.endpoint,),
        mesh=FAST,
    )
    async with Router(r2_config) as r2, Router(bad_config) as impostor:
        await wait_for(lambda: r1.peer_count() == 1 and r2.peer_count() == 1)
        assert r2.id.startswith("r2~")
        got: list[Any] = []
        r1.subscribe("True", got.append)
        r2.subscribe("True", got.append)
        impostor.publish({"forged": True})
        r2.publish({"real": True})
        await wait_for(lambda: len(got) == 2)
        assert all("forged" not in e.values for e in got)
        assert impostor.peer_count() == 0 and r1.peer_count() == 1
        # Its dials cost one refused handshake each back-off interval, not one per beacon.
        assert not impostor.security.guard.admit(r1.endpoint, time.monotonic())


async def _raw_peer_hello(router: Router, ctx: ssl.SSLContext, router_id: str) -> Error:
    host, port = router.address
    reader, writer = await asyncio.open_connection(host, port, ssl=ctx)
    codec = Connection()
    writer.write(codec.send(PeerHello(router_id=router_id, name="x")))
    try:
        async with asyncio.timeout(5):
            while True:
                msg = codec.next_message()
                if msg is not NEED_DATA:
                    assert isinstance(msg, Error), msg
                    return msg
                data = await reader.read(65536)
                assert data, "closed without a reason"
                codec.receive_data(data)
    finally:
        writer.close()


async def test_peer_links_need_a_router_certificate_bound_to_the_claimed_id(
    pki: dict[str, Path], r1: Router
) -> None:
    mesh = pki["mesh"]

    def ctx(name: str) -> ssl.SSLContext:
        c = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        c.check_hostname = False
        c.load_verify_locations(mesh / "ca.pem")
        c.load_cert_chain(mesh / f"{name}.pem", mesh / f"{name}.key")
        return c

    err = await _raw_peer_hello(r1, ctx("alice"), "alice~0011223344556677")  # a user is no router
    assert err.code == "forbidden" and "router certificate" in err.message
    err = await _raw_peer_hello(r1, ctx("r2"), r1.id)  # r2's certificate claiming r1's id
    assert err.code == "forbidden" and "does not belong to certificate 'r2'" in err.message
    assert r1.peer_count() == 0 and r1.mesh.counters["refused_peers"] == 2


async def test_garbage_and_half_handshakes_cost_others_nothing(
    pki: dict[str, Path], r1: Router
) -> None:
    host, port = r1.address
    strangers = []
    for i in range(60):
        reader, writer = await asyncio.open_connection(host, port)
        if i % 3 == 0:
            writer.write(b"GET / HTTP/1.1\r\n\r\n" * 50)  # garbage: answered, closed
        elif i % 3 == 1:
            writer.write(
                b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"
            )  # half a ClientHello, then silence
        strangers.append((reader, writer))
    # Meanwhile a user connects, publishes and receives as if nobody else were there.
    started = time.monotonic()
    alice = await connect(r1, user(pki, "alice"))
    sub = await alice.subscribe("n == 1")
    await alice.publish({"n": 1})
    assert (await next_event(sub, timeout=2.0)).meta["user"] == "alice"
    assert time.monotonic() - started < 2.0
    garbage_reader = strangers[0][0]
    async with asyncio.timeout(5):
        answer = await garbage_reader.read(4096)
    assert b"tls-required" in answer and b"accepts TLS only" in answer
    await alice.aclose()
    for _, writer in strangers:
        writer.close()


async def test_without_tls_permissions_apply_to_anonymous_and_ranges_to_everyone(
    tmp_path: Path,
) -> None:
    perms = tmp_path / "perms.toml"
    perms.write_text(
        '[anonymous]\npublish = ["news"]\nsubscribe = ["*"]\npatterns = "predicates"\n'
    )
    config = RouterConfig(
        port=0, security=SecurityConfig(permissions=perms, allow_clients=("127.0.0.0/8",))
    )
    async with Router(config) as router:
        c = AsyncClient(
            config=ClientConfig(routers=(router.endpoint,), ca=None, cert=None, key=None)
        )
        await c.connect()
        try:
            sub = await c.subscribe("True")
            await c.publish({"n": 1}, type="alarm")
            await c.publish({"n": 2}, type="news")
            ev = await next_event(sub)
            assert (ev.values["n"], ev.meta["user"]) == (2, "anonymous")
            await wait_for(lambda: router.counters["refused_permission"] == 1)
        finally:
            await c.aclose()
    closed = RouterConfig(
        port=0, security=SecurityConfig(allow_clients=("10.0.0.0/8",), allow_peers=("10.0.0.0/8",))
    )
    async with Router(closed) as router:
        reader, writer = await asyncio.open_connection(*router.address)
        async with asyncio.timeout(5):
            assert await reader.read() == b""  # closed at accept, before a byte is read
        writer.close()
        assert router.counters["refused_address"] == 1


async def test_a_full_handshake_queue_evicts_the_oldest_stranger_not_the_newcomer(
    pki: dict[str, Path],
) -> None:
    from aa.router.security import Listener, server_context

    mesh = pki["mesh"]
    made: list[asyncio.Protocol] = []

    def factory() -> asyncio.Protocol:
        made.append(asyncio.Protocol())
        return made[-1]

    import socket as _socket

    sock = _socket.create_server(("127.0.0.1", 0))
    listener = Listener(
        sock,
        factory,
        tls=server_context(mesh / "r1.pem", mesh / "r1.key", mesh / "ca.pem"),
        max_pending=8,
        counters={},
    )
    listener.start()
    port = sock.getsockname()[1]
    idle = [
        await asyncio.open_connection("127.0.0.1", port) for _ in range(8)
    ]  # strangers who say nothing
    await wait_for(lambda: listener.pending == 8)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(mesh / "ca.pem")
    started = time.monotonic()
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)  # completes at once
    assert time.monotonic() - started < 1.0 and len(made) == 1
    assert listener.counters["evicted_pending"] == 1
    async with asyncio.timeout(5):
        assert await idle[0][0].read() == b""  # the oldest stranger was closed
    writer.close()
    for _, w in idle:
        w.close()
    listener.close()
    await listener.wait_closed()


async def test_a_refusal_counts_only_while_it_lasts() -> None:
    # a router that refused, then took us (its ranges or certificates changed), is no longer
    # reason to give up at once on a later reconnection
    from aa.client.dial import Refusals
    from aa.mesh import ConnectionLost

    r = Refusals()
    r.note("a:1", RemoteError("this router accepts TLS only", code="tls-required"), ["a:1", "b:2"])
    assert not r.everywhere.is_set()  # b:2 may still take us
    r.note(
        "b:2", RemoteError("clients from here are not allowed", code="forbidden"), ["a:1", "b:2"]
    )
    assert r.everywhere.is_set() and "not allowed" in str(r) and "TLS only" in str(r)
    r.note("b:2", None, ())
    assert not r.everywhere.is_set() and "b:2" not in str(r)
    r.note("a:1", ConnectionLost("refused"), ["a:1"])  # nothing listening: that may pass
    r.note("a:1", RemoteError("too busy", code="busy"), ["a:1"])
    assert not r.everywhere.is_set()
