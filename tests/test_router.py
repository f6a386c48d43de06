"""A router with real TCP clients on 127.0.0.1: publish, subscribe, metadata, shutdown."""

from __future__ import annotations

import asyncio
import socket
import time
from datetime import UTC, datetime

import pytest
from support import next_event, wait_for

from aa.client import AsyncClient
from aa.mesh import AaTimeout, Event
from aa.router import Router, RouterConfig


async def test_publish_reaches_a_matching_subscriber_with_types_kept(client, make_client):
    sub = await client.subscribe('Temperature > 100 and Sensor.startswith("lab")')
    pub = await make_client()
    await pub.publish({"Temperature": 99, "Sensor": "lab-1"}, type="reading")
    await pub.publish({"Temperature": 101, "Sensor": "yard"}, type="reading")
    await pub.publish(
        {"Temperature": 101, "Sensor": "lab-2", "Raw": b"\x01", "Ratio": 1.0}, type="reading"
    )
    ev = await next_event(sub)
    assert ev.values == {"Temperature": 101, "Sensor": "lab-2", "Raw": b"\x01", "Ratio": 1.0}
    assert type(ev.values["Temperature"]) is int and type(ev.values["Ratio"]) is float
    assert ev.type == "reading"


async def test_router_stamps_metadata(router, client, make_client):
    sub = await client.subscribe("True")
    pub = await make_client(client_id="publisher-7")
    before = datetime.now(UTC)
    event_id = await pub.publish({"x": 1}, meta={"note": "hi", "client": "forged", "ttl": 999})
    ev = await next_event(sub)
    assert ev.id == event_id
    assert ev.meta["note"] == "hi"
    assert ev.meta["client"] == "publisher-7"  # a publisher cannot forge router metadata
    assert ev.meta["router"] == router.id
    assert ev.meta["path"] == [router.id]
    assert ev.meta["address"].startswith("127.0.0.1:")
    assert before <= ev.meta["time"] <= datetime.now(UTC)
    assert ev.meta["ttl"] != 999


async def test_a_retried_publish_is_recognised_by_its_id(client, make_client):
    sub = await client.subscribe("True")
    pub = await make_client()
    await pub.publish({"n": 1}, id="retry-me")
    await pub.publish({"n": 1}, id="retry-me")
    await pub.publish({"n": 2})
    assert (await next_event(sub)).values == {"n": 1}
    assert (await next_event(sub)).values == {"n": 2}


async def test_events_arrive_in_publish_order_in_bulk(client, make_client):
    got: list[int] = []
    done = asyncio.get_running_loop().create_future()

    def on_event(ev: Event) -> None:
        got.append(ev.values["i"])
        if len(got) == 5000 and not done.done():
            done.set_result(None)

    await client.subscribe("i >= 0", on_event)
    pub = await make_client()
    for i in range(5000):
        pub.publish_nowait({"i": i})
    await pub.flush(timeout=10)
    async with asyncio.timeout(10):
        await done
    assert got == list(range(5000))


async def test_name_missing_from_an_event_is_no_match_not_an_error(client, make_client):
    sub = await client.subscribe("Humidity > 50")
    pub = await make_client()
    await pub.publish({"Temperature": 101})
    await pub.publish({"Humidity": 60})
    assert (await next_event(sub)).values == {"Humidity": 60}
    assert sub.failure is None


async def test_same_pattern_is_one_shared_instance(router, client, make_client):
    other = await make_client()
    a = await client.subscribe("x > 1")
    b = await other.subscribe("x > 1")
    c = await other.subscribe("x > 2")
    assert router.engine.instance_count == 2 and len(router.engine) == 3
    pub = await make_client()
    await pub.publish({"x": 2})
    assert (await next_event(a)).values == {"x": 2}
    assert (await next_event(b)).values == {"x": 2}
    await pub.publish({"x": 3})
    assert (await next_event(c)).values == {"x": 3}


async def test_one_event_matching_two_subscriptions_of_a_client_reaches_both(client, make_client):
    a = await client.subscribe("x > 0")
    b = await client.subscribe("x < 10")
    pub = await make_client()
    await pub.publish({"x": 5})
    assert (await next_event(a)).values == (await next_event(b)).values == {"x": 5}


async def test_unsubscribe_stops_deliveries(router, client, make_client):
    gone = await client.subscribe("x == 1")
    kept = await client.subscribe("x == 2")
    await gone.aclose()
    pub = await make_client()
    await pub.publish({"x": 1})
    await pub.publish({"x": 2})
    assert (await next_event(kept)).values == {"x": 2}
    assert gone._queue.qsize() <= 1  # only the end-of-stream marker
    await wait_for(lambda: len(router.engine) == 1)


async def test_a_client_that_leaves_takes_its_subscriptions_with_it(router, make_client):
    c = await make_client()
    await c.subscribe("x == 1")
    assert len(router.engine) == 1
    await c.aclose()
    await wait_for(lambda: len(router.engine) == 0)


async def test_subscriptions_per_client_are_capped(make_client):
    async with (
        Router(RouterConfig(port=0, max_subscriptions_per_client=2)) as r,
        AsyncClient(r.endpoint) as c,
    ):
        await c.subscribe("x == 1")
        await c.subscribe("x == 2")
        with pytest.raises(Exception, match="at most 2 subscriptions"):
            await c.subscribe("x == 3")


async def test_embedded_router_publish_and_subscribe_without_sockets(router):
    got: list[Event] = []
    router.subscribe("Temperature > 100", got.append)
    stamped = router.publish({"Temperature": 101}, type="reading")
    router.publish({"Temperature": 50})
    assert [e.values for e in got] == [{"Temperature": 101}]
    assert got[0] is stamped and stamped.meta["router"] == router.id


async def test_embedded_subscription_can_be_iterated(router):
    sub = router.subscribe("x > 0")
    router.publish({"x": 1})
    async with asyncio.timeout(5):
        assert (await sub.get()).values == {"x": 1}
    sub.close()


async def test_clean_shutdown_delivers_what_is_in_flight():
    r = Router(RouterConfig(port=0))
    await r.start()
    sub_client = await AsyncClient(r.endpoint).connect()
    got: list[int] = []
    await sub_client.subscribe("True", lambda ev: got.append(ev.values["i"]))
    pub = await AsyncClient(r.endpoint).connect()
    for i in range(2000):
        pub.publish_nowait({"i": i})
    await pub.flush(timeout=10)  # acknowledged: dispatched, deliveries written or queued
    await r.aclose()
    async with asyncio.timeout(5):
        while len(got) < 2000 and sub_client._link is not None:
            await asyncio.wait([sub_client._link.lost], timeout=5)
    assert got == list(range(2000))
    await pub.aclose()
    await sub_client.aclose()


async def test_connect_to_nothing_times_out_clearly():
    c = AsyncClient("127.0.0.1:9", config=None)
    with pytest.raises(AaTimeout, match="no router answered"):
        await c.connect(timeout=0.5)
    await c.aclose()


async def test_a_client_that_will_not_wait_is_told_at_once_that_nothing_listens(router):
    """`wait_for_routers=False` (the `aa` commands): a refused connection ends `connect()` at
    once, saying so; once connected, a router that goes away is waited for as ever."""
    from aa.client import ClientConfig
    from aa.mesh import RemoteError

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        nobody = f"127.0.0.1:{s.getsockname()[1]}"
        c = AsyncClient(config=ClientConfig(routers=(nobody,), wait_for_routers=False))
        started = time.monotonic()
        with pytest.raises(RemoteError, match="nothing listens there") as raised:
            await c.connect(timeout=30)
        assert raised.value.code == "refused" and time.monotonic() - started < 5
        await c.aclose()
        patient = AsyncClient(nobody)  # the default: a router may be starting
        with pytest.raises(AaTimeout, match="no router answered"):
            await patient.connect(timeout=0.5)
        await patient.aclose()
    r = Router(RouterConfig(port=0))
    await r.start()
    c = AsyncClient(config=ClientConfig(routers=(r.endpoint,), wait_for_routers=False))
    await c.connect(timeout=10)
    await r.aclose()
    with pytest.raises(AaTimeout, match="not reconnected"):
        await c.wait_connected(timeout=1)
    await c.aclose()


async def test_router_reports_its_real_address(router):
    host, port = router.address
    assert host == "127.0.0.1" and port > 0
    assert router.stats()["endpoint"] == f"127.0.0.1:{port}"


async def test_publish_frames_read_together_get_one_cumulative_ack(router, client):
    """A read that holds several publish frames is answered by one ack (acks are
    cumulative), not one wake-up of the publisher per frame; every event is delivered."""
    from aa.mesh import Connection
    from aa.mesh.protocol import Ack, Hello, Publish

    got: list[Event] = []
    await client.subscribe("n >= 0", got.append)
    codec = Connection()
    frames = codec.send(Hello(client_id="burst"))
    for seq in (1, 2, 3):
        frames += codec.send(Publish(seq=seq, events=(Event(values={"n": seq}, id=f"e{seq}"),)))
    reader, writer = await asyncio.open_connection(*router.address)
    writer.write(frames)  # one write: on loopback the router reads it in one go
    acks: list[int] = []
    async with asyncio.timeout(10):
        while not acks or acks[-1] < 3:
            codec.receive_data(await reader.read(65536))
            acks += [m.seq for m in codec.next_messages() if isinstance(m, Ack)]
    writer.close()
    assert acks == [3]
    await wait_for(lambda: len(got) == 3)
    assert [e.values["n"] for e in got] == [1, 2, 3]
