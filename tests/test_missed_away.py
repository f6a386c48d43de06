"""A subscriber told how many stored events it missed while away: a real router with a
store in a SQLite file stops, another router on the same data folder (where the subscriber
cannot reach it) takes persisted events through a publishing client, then the first port
comes back; the subscriber, reconnecting, is told the count (library callback, `aa
subscribe` line), only of what its user may receive, and at most a bounded scan however
long it claims to have been away."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from support import free_tcp_port, wait_for
from support.pki import make_pki
from support.routerproc import RouterProcess
from support.wire import Wire

from aa.client import AsyncClient, ClientConfig
from aa.mesh.errors import InvalidValue
from aa.mesh.protocol import MAX_AWAY, Hello, MissedAway, PatternSpec, Subscribe
from aa.router import Router, RouterConfig
from aa.router.security import SecurityConfig
from aa.router.store import away as away_module

AA = str(Path(sys.executable).with_name("aa"))

Publish = Callable[[AsyncClient], Awaitable[None]]


async def _meanwhile(config: RouterConfig, publish: Publish, **client: Path) -> None:
    """A router on *config*'s data folder, on another port, takes what *publish* sends."""
    async with (
        Router(config) as elsewhere,
        AsyncClient(config=ClientConfig(routers=(elsewhere.endpoint,), **client)) as publisher,
    ):
        await publish(publisher)
        await publisher.flush()  # persisted: acknowledged once committed


async def _snow(publisher: AsyncClient) -> None:
    for n in range(3):
        await publisher.publish({"n": n}, type="snow", meta={"persist": True})
    await publisher.publish({"n": 9}, type="rain", meta={"persist": True})
    await publisher.publish({"n": 10}, type="snow")  # live only: gone, not counted


async def test_a_returning_subscriber_is_told_the_stored_events_it_missed(tmp_path: Path):
    port, data = free_tcp_port(), tmp_path / "data"
    told: list[MissedAway] = []
    on_missed_away = told.append

    router = Router(RouterConfig(port=port, name="home", data_dir=data))
    await router.start()
    try:
        async with AsyncClient(f"127.0.0.1:{port}") as client:
            sub = await client.subscribe('type == "snow"', on_missed_away=on_missed_away)
            other = await client.subscribe("n > 100", on_missed_away=on_missed_away)
            await router.aclose()
            await wait_for(lambda: not client.connected, timeout=20)
            await _meanwhile(RouterConfig(port=0, name="elsewhere", data_dir=data), _snow)
            router = Router(RouterConfig(port=port, name="home", data_dir=data))
            await router.start()
            await wait_for(lambda: len(told) == 2, timeout=20)
            assert sorted((n.sub_id, n.count, n.more) for n in told) == [
                (sub.id, 3, False),  # the live-only snow is gone, the rain is not its
                (other.id, 0, False),
            ]
            assert (sub.missed_away, other.missed_away) == (3, 0)
            # Delivered live from here on, and never counted as missed.
            router.publish({"n": 11}, type="snow", meta={"persist": True})
            async with asyncio.timeout(20):
                assert (await sub.get()).values == {"n": 11}
    finally:
        await router.aclose()


async def test_a_subscriber_is_told_nothing_of_a_router_without_store():
    port = free_tcp_port()
    told: list[MissedAway] = []
    router = Router(RouterConfig(port=port, name="bare"))
    await router.start()
    try:
        async with AsyncClient(f"127.0.0.1:{port}") as client:
            await client.subscribe("True", on_missed_away=told.append)
            await router.aclose()
            await wait_for(lambda: not client.connected, timeout=20)
            router = Router(RouterConfig(port=port, name="bare"))
            await router.start()
            await client.wait_connected(20)
            await wait_for(lambda: len(router.engine) == 1, timeout=20)
            # An answer would come right after the subscription: a round trip settles it.
            await client.mesh_info()
        assert told == []
    finally:
        await router.aclose()


RULES = """\
[users.alice]
subscribe = ["reading"]
patterns = "predicates"
client_caches = true

[users.carol]
publish = ["*"]
subscribe = ["*"]
persist = true
"""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"), ("r1",), ("alice", "carol"))


async def test_a_user_is_told_only_of_events_it_may_receive(tmp_path: Path, pki: Path):
    port, data, perms = free_tcp_port(), tmp_path / "data", tmp_path / "perms.toml"
    perms.write_text(RULES)
    security = SecurityConfig(
        cert=pki / "r1.pem", key=pki / "r1.key", ca=pki / "ca.pem", permissions=perms
    )

    def config(p: int) -> RouterConfig:
        return RouterConfig(port=p, name="r1", data_dir=data, security=security)

    def user(name: str) -> dict[str, Path]:
        return {"ca": pki / "ca.pem", "cert": pki / f"{name}.pem", "key": pki / f"{name}.key"}

    async def mixed(carol: AsyncClient) -> None:
        for n in range(2):
            await carol.publish({"n": n}, type="reading", meta={"persist": True})
        for n in range(5):
            await carol.publish({"n": n}, type="alarm", meta={"persist": True})

    told: dict[str, list[int]] = {"all": [], "alarms": []}
    router = Router(config(port))
    await router.start()
    try:
        alice = AsyncClient(config=ClientConfig(routers=(f"127.0.0.1:{port}",), **user("alice")))
        async with alice:
            await alice.subscribe("True", on_missed_away=lambda m: told["all"].append(m.count))
            await alice.subscribe(
                'type == "alarm"', on_missed_away=lambda m: told["alarms"].append(m.count)
            )
            await router.aclose()
            await wait_for(lambda: not alice.connected, timeout=20)
            await _meanwhile(config(0), mixed, **user("carol"))
            router = Router(config(port))
            await router.start()
            await wait_for(lambda: bool(told["all"] and told["alarms"]), timeout=20)
        # Two readings, yes; the five alarms she may not receive are not even a number.
        assert told == {"all": [2], "alarms": [0]}
    finally:
        await router.aclose()


async def test_a_cache_under_permissions_tells_no_drop_count(tmp_path: Path, pki: Path):
    """A client cache takes what its pattern matches, and its owner's permissions filter
    what is fetched: its drop count could include events hidden to the owner, so it is not
    told ("dropped": None), and the library calls no `on_dropped`."""
    perms = tmp_path / "perms.toml"
    perms.write_text(RULES)
    security = SecurityConfig(
        cert=pki / "r1.pem", key=pki / "r1.key", ca=pki / "ca.pem", permissions=perms
    )

    def user(name: str) -> ClientConfig:
        return ClientConfig(
            routers=(router.endpoint,),
            ca=pki / "ca.pem",
            cert=pki / f"{name}.pem",
            key=pki / f"{name}.key",
            client_id=name,
        )

    told: list[int] = []
    async with (
        Router(RouterConfig(port=0, name="r1", security=security)) as router,
        AsyncClient(config=user("alice")) as alice,
    ):
        await alice.cache_register("True", max_count=2, timeout=600, on_dropped=told.append)
        async with AsyncClient(config=user("carol")) as carol:
            for n in range(5):
                await carol.publish({"n": n}, type="alarm")
            await carol.flush()
        assert (await alice.cache_info())["dropped"] is None
        assert await alice.cache_fetch() == [] and told == []


async def test_a_claim_of_away_since_ever_reads_a_bounded_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(away_module, "MAX_SCANNED", 5)
    monkeypatch.setattr(away_module, "SCAN_CHUNK", 2)
    monkeypatch.setattr(away_module, "MAX_MATCHED", 9)
    reads: list[int] = []
    async with Router(RouterConfig(port=0, name="home", data_dir=tmp_path)) as router:
        for n in range(12):
            router.publish({"n": n}, type="snow", meta={"persist": True})
        await router.storage.flush()
        store = router.storage.store
        assert store is not None
        iterate = store.iterate

        async def counting(*args: Any, **kwargs: Any) -> AsyncIterator[list[Any]]:
            async for chunk in iterate(*args, **kwargs):
                reads.append(len(chunk))
                yield chunk

        monkeypatch.setattr(store, "iterate", counting)
        # What a reconnecting client sends, claiming to have been away for ten years, for
        # three subscriptions at once: its connection's scans share one bounded budget.
        wire = Wire(*router.address)
        try:
            wire.send(
                Hello(client_id="claims"),
                *(
                    Subscribe(sub_id=i, pattern=PatternSpec(source="n >= 0"), away=MAX_AWAY)
                    for i in (1, 2, 3)
                ),
            )
            told = await asyncio.to_thread(
                wire.read_until,
                lambda got: sum(isinstance(m, MissedAway) for m in got) == 3,
                20,
            )
            assert told
        finally:
            wire.close()
        notices = [m for m in wire.got if isinstance(m, MissedAway)]
        # Each told "at least": 5 events at most, 9 evaluations at most for the connection
        # (3 each when the three share one scan), never the whole table.
        assert sorted(m.sub_id for m in notices) == [1, 2, 3]
        assert all(m.more and m.count <= 5 for m in notices)
        assert sum(m.count for m in notices) <= 9
        assert sum(reads) <= 3 * 6


def test_a_claim_that_is_no_duration_is_refused():
    spec = PatternSpec(source="True")
    for bad in (-1.0, float("nan"), float("inf"), MAX_AWAY * 2, "1h", True):
        with pytest.raises(InvalidValue):
            Subscribe(sub_id=1, pattern=spec, away=bad)  # type: ignore[arg-type]
    assert Subscribe(sub_id=1, pattern=spec).to_wire().get("away") is None  # older routers


async def test_aa_subscribe_prints_what_it_missed_while_away(tmp_path: Path):
    port, data = free_tcp_port(), str(tmp_path / "data")
    home = RouterProcess("--port", str(port), "--data-dir", data, "--no-http", name="home")
    proc = await asyncio.create_subprocess_exec(
        AA,
        "subscribe",
        "--router",
        f"127.0.0.1:{port}",
        "--tier",
        'type == "snow"',
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None

    async def line() -> str:
        assert proc.stderr is not None
        async with asyncio.timeout(30):
            return (await proc.stderr.readline()).decode()

    try:
        assert "tier" in await line()  # subscribed
        home.__exit__()
        assert (await line()).startswith("aa subscribe: disconnected from")
        await _meanwhile(RouterConfig(port=0, name="elsewhere", data_dir=tmp_path / "data"), _snow)
        home = RouterProcess("--port", str(port), "--data-dir", data, "--no-http", name="home")
        assert (await line()) == f"aa subscribe: reconnected to 127.0.0.1:{port}\n"
        assert (await line()) == (
            "aa subscribe: missed 3 events while away (stored: use --history to get them)\n"
        )
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        home.__exit__()


def test_aa_subscribe_says_when_the_router_stopped_counting_before_it_found_one(
    capsys: pytest.CaptureFixture[str],
):
    from aa.tools.pubsub_cmd import _missed_away

    _missed_away(MissedAway(sub_id=1, count=0, more=False))  # nothing missed: nothing said
    _missed_away(MissedAway(sub_id=1, count=0, more=True))
    _missed_away(MissedAway(sub_id=1, count=7, more=True))
    assert capsys.readouterr().err.splitlines() == [
        "aa subscribe: missed an unknown number of events while away (too many stored to "
        "count) (stored: use --history to get them)",
        "aa subscribe: missed at least 7 events while away (stored: use --history to get them)",
    ]
