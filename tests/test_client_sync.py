"""The blocking `Client`: three lines to publish, iteration or callbacks to subscribe."""

from __future__ import annotations

import threading

import pytest

from aa.client import Client
from aa.mesh import AaTimeout, PatternError


@pytest.fixture
def endpoint(router):
    return router.endpoint


async def in_thread(fn):
    """Run blocking client code off the event loop the test router runs in."""
    import asyncio

    return await asyncio.get_running_loop().run_in_executor(None, fn)


async def test_three_lines_to_publish_and_iterate(endpoint):
    def scenario():
        with Client(endpoint) as sub_client:
            sub = sub_client.subscribe("Temperature > 100")
            c = Client(endpoint)
            c.publish({"Temperature": 101}, type="reading")
            c.publish({"Temperature": 7}, type="reading")
            c.publish({"Temperature": 102}, type="reading")
            c.close()
            got = [sub.get(timeout=5).values["Temperature"], sub.get(timeout=5).values["Temperature"]]
            with pytest.raises(AaTimeout):
                sub.get(timeout=0.2)
            return got

    assert await in_thread(scenario) == [101, 102]


async def test_callback_and_update_and_unsubscribe(endpoint):
    def scenario():
        got = []
        arrived = threading.Event()

        def cb(ev):
            got.append(ev.values["t"])
            if len(got) == 2:
                arrived.set()

        with Client(endpoint) as c:
            sub = c.subscribe("t > limit", cb, params={"limit": 10})
            c.publish({"t": 5})
            c.publish({"t": 11})
            sub.update(limit=0)
            c.publish({"t": 5})
            assert arrived.wait(5)
            c.unsubscribe(sub)
            return got

    assert await in_thread(scenario) == [11, 5]


async def test_refused_pattern_raises_in_the_caller(endpoint):
    def scenario():
        with Client(endpoint) as c:
            with pytest.raises(PatternError):
                c.subscribe("import os", format="script")

    await in_thread(scenario)


async def test_no_router_is_a_clear_timeout():
    def scenario():
        with pytest.raises(AaTimeout, match="no router answered"):
            Client("127.0.0.1:9", timeout=0.5)

    await in_thread(scenario)
