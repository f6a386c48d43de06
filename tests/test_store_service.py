"""The store, the mesh cache and the event log wired into a router: persistence on request,
acks after commit, history on subscribe, the mesh cache on request, bad policies refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from http_helpers import PEER
from support import next_event, next_turn, wait_for

from aa.client import AsyncClient
from aa.http_api import create_app
from aa.mesh import META_HISTORICAL, NEED_DATA, Connection, Event, PatternError, RemoteError
from aa.mesh.protocol import Ack, Error, Hello, Publish, Welcome
from aa.router import EventLogConfig, Router, RouterConfig, StoreConfig

PERSIST = {"persist": True}
MakeRouter = Callable[..., Awaitable[Router]]


@pytest.fixture
async def make_router(tmp_path: Path) -> AsyncIterator[MakeRouter]:
    """Routers with a SQLite store in a data folder of their own (or the one given)."""
    routers: list[Router] = []

    async def make(data_dir: Path | None = None, **kwargs: object) -> Router:
        r = Router(
            RouterConfig(port=0, data_dir=data_dir or tmp_path / f"r{len(routers)}", **kwargs)
        )  # type: ignore[arg-type]
        await r.start()
        routers.append(r)
        return r

    yield make
    for r in reversed(routers):
        await r.aclose()


@pytest.fixture
async def srouter(make_router: MakeRouter) -> Router:
    return await make_router()


@pytest.fixture
def connect(
    srouter: Router, open_client: Callable[..., Awaitable[AsyncClient]]
) -> Callable[..., Awaitable[AsyncClient]]:
    """A client on *router*, or on the test's storage router (see conftest's `open_client`)."""
    return lambda router=None, **kwargs: open_client(router or srouter, **kwargs)


async def take(sub: object, n: int) -> list[Event]:
    return [await next_event(sub) for _ in range(n)]


# -- persistence and history ---------------------------------------------------------------------


async def test_history_replays_persisted_events_oldest_first_marked(
    srouter: Router, connect
) -> None:
    pub = await connect()
    for i in range(5):
        await pub.publish({"i": i}, meta=PERSIST)
    await pub.publish({"i": 99})  # not persisted: never in a history
    await pub.flush()
    sub = await pub.subscribe("i >= 1", history={"since": None})
    hist = await take(sub, 4)
    assert [e.values["i"] for e in hist] == [1, 2, 3, 4]
    assert all(e.meta[META_HISTORICAL] is True for e in hist)
    await pub.publish({"i": 5})
    live = await next_event(sub)
    assert live.values == {"i": 5} and META_HISTORICAL not in live.meta
    # No history unless asked.
    plain = await pub.subscribe("i >= 1")
    await pub.publish({"i": 6})
    assert (await next_event(plain)).values == {"i": 6}


async def test_history_since_limits_the_replay(srouter: Router, connect) -> None:
    pub = await connect()
    await pub.publish({"i": 0}, meta=PERSIST)
    await pub.flush()
    cut = datetime.now(UTC)
    await wait_for(lambda: datetime.now(UTC) > cut)  # the next stamp is later than cut
    await pub.publish({"i": 1}, meta=PERSIST)
    await pub.flush()
    sub = await pub.subscribe("True", history={"since": cut})
    assert [e.values["i"] for e in await take(sub, 1)] == [1]
    with pytest.raises(PatternError) as err:
        await pub.subscribe("True", history={"since": "yesterday"})
    assert err.value.code == "bad-history" and "datetime" in str(err.value)


async def test_history_has_no_gap_and_no_duplicate_under_concurrent_publishing(
    srouter: Router, connect
) -> None:
    """Two of three events are persisted (they come through the history or live), the third
    is not (it comes live, through the hold, if published after the subscription)."""
    pub = await connect()
    reader = await connect()
    n = 6000
    sent: list[tuple[str, bool]] = []

    async def publish() -> None:
        for i in range(n):
            kept = i % 3 != 0
            sent.append((pub.publish_nowait({"i": i}, meta=PERSIST if kept else None), kept))
            if i % 100 == 99:
                await next_turn()  # let the subscription come in mid-stream
        await pub.flush()

    task = asyncio.create_task(publish())
    await wait_for(lambda: len(sent) >= n // 3)
    sub = await reader.subscribe("True", history={"since": None})
    await task
    kept_ids = [i for i, kept in sent if kept]
    live_only = [i for i, kept in sent if not kept]
    got: list[Event] = []
    async with asyncio.timeout(10):
        while not got or got[-1].id != sent[-1][0]:
            got.append(await sub.get())
    ids = [e.id for e in got]
    assert len(set(ids)) == len(ids)  # no duplicate
    assert set(kept_ids) <= set(ids)  # no persisted event missing
    arrived = [i for i in ids if i in set(live_only)]
    assert (
        arrived and arrived == live_only[len(live_only) - len(arrived) :]
    )  # no gap in the live stream
    flags = [bool(e.meta.get(META_HISTORICAL)) for e in got]
    k = flags.count(True)
    assert k > 0 and flags == [True] * k + [False] * (len(got) - k)  # history first, then live
    hist_keys = [(e.meta["time"], e.id) for e in got[:k]]
    assert hist_keys == sorted(hist_keys)  # oldest first
    live = [e.values["i"] for e in got[k:]]
    assert live == sorted(live)  # live in publish order
    with pytest.raises(TimeoutError):
        await next_event(sub, timeout=0.2)  # and nothing more


async def test_count_and_age_policies_are_enforced(srouter: Router, connect) -> None:
    pub = await connect()
    for i in range(5):
        await pub.publish({"i": i}, type="snow", meta={**PERSIST, "max_age": "3h", "max_count": 2})
    for i in range(3):
        await pub.publish({"i": i}, type="rain", meta={**PERSIST, "max_count": 10})
    await pub.publish({"i": 9}, type="fog", meta={**PERSIST, "max_age": 0.001})
    await pub.flush()
    stamped = datetime.now(UTC)
    await wait_for(lambda: datetime.now(UTC) > stamped + timedelta(milliseconds=5))
    got = await srouter.history("True", include_cache=False)
    assert sorted((e.type, e.values["i"]) for e in got) == [
        ("rain", 0),
        ("rain", 1),
        ("rain", 2),
        ("snow", 3),
        ("snow", 4),
    ]


async def test_ack_of_a_persisted_publish_follows_the_commit(srouter: Router, connect) -> None:
    pub = await connect()
    for i in range(2000):
        pub.publish_nowait({"i": i}, meta=PERSIST)
    await pub.flush()
    store = srouter.storage.store
    assert store is not None and store.stats().written >= 2000 and store.stats().pending == 0


class FakeSession:
    client_id = "fake"

    def __init__(self) -> None:
        self.acks: list[int] = []
        self.sent: list[object] = []

    def ack(self, seq: int) -> None:
        self.acks.append(seq)

    def send(self, msg: object) -> None:
        self.sent.append(msg)


async def test_acks_stay_in_order_behind_a_waiting_store_flush(srouter: Router) -> None:
    acks, s = srouter.acks, FakeSession()
    acks.publish_handled(s, 1, persisted=False)  # type: ignore[arg-type]
    assert s.acks == [1]  # the direct path
    assert srouter.publish({"x": 1}, meta=PERSIST) is not None
    acks.publish_handled(s, 2, persisted=True)  # type: ignore[arg-type]
    acks.publish_handled(s, 3, persisted=False)  # type: ignore[arg-type]
    assert s.acks == [1]  # 3 waits behind 2, which waits for the store
    await wait_for(lambda: s.acks[-1] == 3)
    assert s.acks in ([1, 3], [1, 2, 3]) and not acks.waiting_for_store()


async def test_bad_policies_are_refused_over_the_wire(srouter: Router) -> None:
    host, port = srouter.address
    reader, writer = await asyncio.open_connection(host, port)
    codec = Connection()
    writer.write(codec.send(Hello(client_id="raw")))
    bad = [
        Event(values={"i": 1}, meta={"persist": True, "max_age": -5}, id="neg"),
        Event(values={"i": 2}, type="t", meta={"persist": True, "max_count": 0}, id="zero"),
        Event(values={"i": 3}, meta={"persist": True, "max_age": "3 fortnights"}, id="unit"),
        Event(values={"i": 4}, meta={"max_age": "3h"}, id="nopersist"),
        Event(values={"i": 5}, meta={"persist": True, "max_count": 3}, id="notype"),
        Event(
            values={"i": 6},
            type="t",
            meta={"persist": True, "max_age": "3h", "max_count": 5},
            id="good",
        ),
    ]
    writer.write(codec.send(Publish(seq=1, events=tuple(bad))))
    got: list[object] = []
    async with asyncio.timeout(5):
        while not any(type(m) is Ack for m in got):
            data = await reader.read(65536)
            assert data, "the router closed the connection"
            codec.receive_data(data)
            while (m := codec.next_message()) is not NEED_DATA:
                got.append(m)
    writer.close()
    errors = {m.message.split(" ")[1]: m.message for m in got if type(m) is Error}  # type: ignore[attr-defined]
    assert all(m.code == "invalid-policy" for m in got if type(m) is Error)  # type: ignore[attr-defined]
    assert "positive" in errors["neg"]
    assert "at least 1" in errors["zero"]
    assert "unknown unit 'fortnights'" in errors["unit"]
    assert "add 'persist': True" in errors["nopersist"]
    assert "needs an event type" in errors["notype"]
    assert "good" not in errors
    assert type(got[-1]) is Ack and got[-1].seq == 1 and type(got[0]) is Welcome  # type: ignore[attr-defined]
    # Stored under the raw client's id scope (it proposed "good"; `aa.mesh.id_scope`).
    assert [e.id.split("-", 1)[1] for e in await srouter.history("True")] == ["good"]  # type: ignore[union-attr]


async def test_bad_cache_policies_are_refused_with_the_routers_reason(
    srouter: Router, connect
) -> None:
    c = await connect()
    for kwargs, reason in [
        ({"max_age": -3.0}, "positive"),
        ({"max_age": "-3h"}, "negative"),
        ({"max_count": 0}, "at least 1"),
        ({"max_age": "3x"}, "unknown unit 'x'"),
    ]:
        with pytest.raises(RemoteError) as err:
            await c.cache_register("True", **kwargs)
        assert err.value.code == "invalid-policy" and reason in err.value.message, err.value
    with pytest.raises(PatternError) as perr:
        await c.cache_register("True and (")
    assert perr.value.code == "pattern-compile"


# -- the mesh cache ------------------------------------------------------------------------------


async def test_mesh_cache_on_request_with_opt_out(srouter: Router, connect) -> None:
    pub = await connect()
    await pub.publish({"i": 1})
    await pub.publish({"i": 2}, meta={"mesh_cache": False})
    await pub.publish({"i": 3})
    await pub.flush()
    sub = await pub.subscribe("True", history={"since": None})
    cached = await pub.cached("i > 0")
    assert [e.values["i"] for e in cached] == [1, 3]  # opted out: not cached
    assert all(e.meta[META_HISTORICAL] for e in cached)
    assert [e.values["i"] for e in await pub.cached("i > 0", limit=1)] == [1]
    assert await pub.cached("True", since=datetime.now(UTC) + timedelta(hours=1)) == []
    with pytest.raises(TimeoutError):
        await next_event(sub, timeout=0.1)  # the mesh cache is never replayed on subscribe
    with pytest.raises(PatternError):
        await pub.cached("(")


async def test_router_history_merges_store_and_mesh_cache(srouter: Router) -> None:
    srouter.publish({"i": 1}, meta=PERSIST)
    srouter.publish({"i": 2})  # only in the mesh cache
    srouter.publish({"i": 3}, meta={**PERSIST, "mesh_cache": False})  # only in the store
    got = await srouter.history("True")
    assert [e.values["i"] for e in got] == [1, 2, 3] and len({e.id for e in got}) == 3
    assert [e.values["i"] for e in await srouter.history("True", include_cache=False)] == [1, 3]
    assert [e.values["i"] for e in await srouter.history("i > 1", limit=1)] == [2]


async def test_local_subscription_history(srouter: Router) -> None:
    srouter.publish({"i": 1}, meta=PERSIST)
    sub = srouter.subscribe("True", history={"since": None})
    srouter.publish({"i": 2}, meta=PERSIST)  # during the replay: history or live, once
    first, second = await next_event(sub), await next_event(sub)
    assert (first.values, first.meta[META_HISTORICAL]) == ({"i": 1}, True)
    assert second.values == {"i": 2}
    srouter.publish({"i": 3}, meta=PERSIST)
    third = await next_event(sub)
    assert third.values == {"i": 3} and META_HISTORICAL not in third.meta
    sub.close()


async def test_the_store_survives_a_restart(make_router: MakeRouter, tmp_path: Path) -> None:
    r = await make_router(tmp_path / "kept")
    async with AsyncClient(r.endpoint) as c:
        await c.publish({"i": 1}, type="t", meta=PERSIST)
        await c.flush()
    await r.aclose()
    r2 = await make_router(tmp_path / "kept")
    assert [e.values for e in await r2.history("True")] == [{"i": 1}]


async def test_no_store_without_a_data_folder_and_store_url_elsewhere(tmp_path: Path) -> None:
    async with Router(RouterConfig(port=0)) as r:
        assert r.storage.store is None and r.mesh_cache is not None
        r.publish({"i": 1}, meta=PERSIST)  # not kept: there is nowhere to keep it
        assert [e.values for e in await r.history("True", include_cache=False)] == []
    url = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    async with Router(RouterConfig(port=0, store=StoreConfig(url=url))) as r:
        r.publish({"i": 1}, meta=PERSIST)
        assert [e.values for e in await r.history("True", include_cache=False)] == [{"i": 1}]
    assert (tmp_path / "elsewhere.db").exists()


async def test_event_log_on_request(tmp_path: Path) -> None:
    import pyarrow.dataset as ds

    async with Router(RouterConfig(port=0, data_dir=tmp_path, event_log=EventLogConfig())) as r:
        for i in range(10):
            r.publish({"i": i})
    table = ds.dataset(tmp_path / "eventlog", format="parquet", partitioning="hive").to_table()
    assert table.num_rows == 10


async def test_event_log_is_on_by_default_with_a_data_folder(tmp_path: Path) -> None:
    import pyarrow.dataset as ds

    async with Router(RouterConfig(port=0, data_dir=tmp_path)) as r:
        assert r.event_log is not None
        async with AsyncClient(r.endpoint) as c:  # a client's publish, stamped by the router
            for i in range(5):
                c.publish_nowait({"i": i, "t": i / 2}, type="reading")
            await c.flush()
        r.publish({"i": 5})
        r.publish({"i": 6}, meta={"mesh_cache": False})  # not cached, logged all the same
        r.publish({"i": 7})
        assert set(r.stats()["storage"]["event_log"]) == {
            "rows",
            "files",
            "dropped",
            "errors",
            "deleted",
            "waiting",
        }
        assert [e.values["i"] for e in await r.history("True", include_cache=True)][-2:] == [5, 7]
    rows = (
        ds.dataset(tmp_path / "eventlog", format="parquet", partitioning="hive")
        .to_table()
        .to_pylist()
    )
    assert sorted(dict(row["values"])["i"] for row in rows) == [
        "0",
        "1",
        "2",
        "3",
        "4",
        "5",
        "6",
        "7",
    ]
    assert {row["logged_by"] for row in rows} == {r.id}
    assert {row["router"] for row in rows if row["type"] == "reading"} == {r.id}


async def test_no_event_log_without_a_data_folder_or_when_turned_off(tmp_path: Path) -> None:
    async with Router(RouterConfig(port=0)) as r:
        assert r.event_log is None and "event_log" not in r.stats()["storage"]
        r.publish({"i": 1})
    async with Router(RouterConfig(port=0, data_dir=tmp_path, event_log=None)) as r:
        assert r.event_log is None
        r.publish({"i": 1})
    assert not (tmp_path / "eventlog").exists()


def test_storage_names_are_public_and_in_the_error_tree() -> None:
    import aa.mesh
    import aa.mesh.errors
    import aa.router

    errors = {"StoreError", "StoreFull", "StoreUnavailable", "UnknownCache"}
    assert errors <= set(aa.mesh.__all__)
    assert all(name in (aa.mesh.errors.__doc__ or "") for name in errors)
    assert issubclass(aa.mesh.StoreFull, aa.mesh.StoreError) and issubclass(
        aa.mesh.UnknownCache, aa.mesh.UsageError
    )
    assert {
        "ClientCacheService",
        "StoreConfig",
        "EventLogConfig",
        "CacheConfig",
        "ExpiryPolicy",
        "Fetched",
        "CacheInfo",
        "StoreService",
    } <= set(aa.router.__all__)


async def test_a_bad_store_url_fails_the_start_with_the_reason(tmp_path: Path) -> None:
    from aa.mesh import StoreUnavailable, UsageError

    with pytest.raises(UsageError, match="cannot use the store URL 'nonsense'"):
        await Router(RouterConfig(port=0, store=StoreConfig(url="nonsense"))).start()
    bad_dir = tmp_path / "not-a-folder"
    bad_dir.write_text("")
    with pytest.raises((StoreUnavailable, UsageError)) as err:
        await Router(RouterConfig(port=0, data_dir=bad_dir)).start()
    assert "not-a-folder" in str(err.value)


# -- expiry: one rule for every way to history ---------------------------------------------------

SNOW = {**PERSIST, "max_age": "20s", "max_count": 5}


async def _seven_snow(router: Router) -> None:
    for i in range(7):
        router.publish({"i": i}, type="snow", meta=SNOW)
    await router.storage.flush()


async def _replayed(router: Router, pattern: str) -> list[int]:
    """What a subscriber asking for history gets: the replay, up to its end."""
    sub = router.subscribe(pattern, history={"since": None})
    router.publish({"end": True}, type="mark")  # live, after the replay (the hold)
    got: list[int] = []
    while "end" not in (ev := await next_event(sub)).values:
        got.append(ev.values["i"])
    sub.close()
    return got


async def test_http_history_and_the_replay_honour_the_same_expiry(srouter: Router) -> None:
    await _seven_snow(srouter)
    app = create_app(srouter, names=("aa.test",))
    transport = httpx.ASGITransport(app=app, client=PEER)  # type: ignore[arg-type]
    pattern = 'type == "snow" or type == "mark"'
    async with httpx.AsyncClient(transport=transport, base_url="http://aa.test") as http:

        async def over_http() -> list[int]:
            r = await http.get("/events", params={"pattern": 'type == "snow"', "since": "1h"})
            assert r.status_code == 200, r.text
            return [e["values"]["i"] for e in r.json()["events"]]

        # now: the count limit keeps the newest five, though the mesh cache has all seven
        assert await over_http() == [2, 3, 4, 5, 6] == await _replayed(srouter, pattern)
        later = datetime.now(UTC) + timedelta(seconds=40)
        srouter.storage.clock = lambda: later  # 40 s on: past every event's age limit
        assert await over_http() == [] == await _replayed(srouter, pattern)
        assert [e.values for e in await srouter.history("True")] == [{"end": True}] * 2


async def test_history_without_a_store_holds_cached_copies_to_their_policy() -> None:
    async with Router(RouterConfig(port=0)) as router:
        assert router.storage.store is None
        await _seven_snow(router)
        got = await router.history('type == "snow"')
        assert [e.values["i"] for e in got] == [2, 3, 4, 5, 6]
        later = datetime.now(UTC) + timedelta(seconds=40)
        assert await router.storage.history('type == "snow"', now=later) == []
        router.publish({"i": 9}, type="rain")  # not persisted: the cache's own rules only
        assert [e.values["i"] for e in await router.storage.history("True", now=later)] == [9]
