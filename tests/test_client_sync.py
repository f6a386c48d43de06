"""The blocking `Client`: three lines to publish, iteration or callbacks to subscribe."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path

import pytest
from support import next_event, wait_for

from aa.client import Client
from aa.mesh import AaTimeout, PatternError, StoreUnavailable
from aa.router import Router, RouterConfig, StoreConfig


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
            got = [
                sub.get(timeout=5).values["Temperature"],
                sub.get(timeout=5).values["Temperature"],
            ]
            with pytest.raises(AaTimeout):
                sub.get(timeout=0.2)
            return got

    assert await in_thread(scenario) == [101, 102]


async def test_an_event_no_router_takes_is_refused_at_publish_and_the_rest_go_on(endpoint):
    # Checked and packed in the caller's thread: the caller gets the error, and the events
    # published after it are not held up behind it.
    from aa.mesh import InvalidValue

    def scenario():
        with Client(endpoint) as sub_client:
            sub = sub_client.subscribe("Temperature > 100")
            with Client(endpoint) as c:
                with pytest.raises(InvalidValue, match="send large arrays as bytes"):
                    c.publish({"samples": [list(range(1000)) for _ in range(200)]})
                with pytest.raises(InvalidValue, match="outside|not"):
                    c.publish({"Temperature": {1, 2}})
                c.publish({"Temperature": 101, "Sensor": "lab-1"}, meta={"note": "x"})
                c.flush(timeout=5)
            event = sub.get(timeout=5)
            return event.values, event.meta["note"]

    assert await in_thread(scenario) == ({"Temperature": 101, "Sensor": "lab-1"}, "x")


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
        with Client(endpoint) as c, pytest.raises(PatternError):
            c.subscribe("import os", format="script")

    await in_thread(scenario)


async def test_iterating_a_pattern_the_router_stops_later_raises_instead_of_waiting_forever(
    router, endpoint
):
    """A pattern accepted at subscribe and stopped by the router afterwards (a script that
    loops past its time budget on the first event) ends the blocking iteration with the
    router's `PatternError`; it used to wait forever (the queue in the caller's thread never
    heard of the end). The subscription's `failure` says the same."""

    def scenario():
        with Client(endpoint) as c:
            sub = c.subscribe("while True:\n    pass", format="script")
            router.publish({"x": 1})
            started = time.monotonic()
            with pytest.raises(PatternError, match="time"):
                while True:
                    sub.get(timeout=10)  # (the code before waited forever, here: AaTimeout)
            assert sub.failure is not None and time.monotonic() - started < 10
            with pytest.raises(PatternError):  # and iterating it, as the README does: ended at once
                for _ in sub:
                    pass

    await in_thread(scenario)


async def test_no_router_is_a_clear_timeout():
    def scenario():
        with pytest.raises(AaTimeout, match="no router answered"):
            Client("127.0.0.1:9", timeout=0.5)

    await in_thread(scenario)


# -- the README's three lines: a client never closed still sends what it was given ----------

README = Path(__file__).resolve().parents[1] / "README.md"
THREE_LINES = (
    "from aa.client import Client\n\n"
    'c = Client("127.0.0.1:7447")\n'
    'c.publish({"Temperature": 101}, type="reading")\n'
)


async def _python(code: str, **kwargs):
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        **kwargs,
    )


def test_the_three_lines_are_the_readmes():
    assert THREE_LINES in README.read_text()


async def test_three_lines_without_close_deliver_before_exit(router, client):
    sub = await client.subscribe("Temperature > 100")
    for _ in range(3):  # the report: lost 6 times out of 6
        proc = await _python(THREE_LINES.replace("127.0.0.1:7447", router.endpoint))
        async with asyncio.timeout(20):
            out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        assert err == b"", err.decode()
        event = await next_event(sub)
        assert (event.type, event.values) == ("reading", {"Temperature": 101})


async def test_exit_says_what_it_could_not_send():
    """The router goes away after the client connected: the exit waits `exit_timeout`, then
    says on stderr that the event is lost, and the program still ends."""
    code = (
        "import sys\n"
        "from aa.client import Client\n"
        "c = Client(sys.argv[1], exit_timeout=1.0)\n"
        "print('connected', flush=True)\n"
        "sys.stdin.readline()\n"
        'c.publish({"Temperature": 101}, type="reading")\n'
    )
    async with Router(RouterConfig(port=0)) as router:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            code,
            router.endpoint,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(20):
            assert await proc.stdout.readline() == b"connected\n"
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    started = time.monotonic()
    async with asyncio.timeout(20):
        _, err = await proc.communicate()
    took = time.monotonic() - started
    assert proc.returncode == 0
    text = err.decode()
    assert "1 event(s) not acknowledged by a router within 1 s" in text, text
    assert "Traceback" not in text and len(text.strip().splitlines()) == 1, text
    assert took < 8, f"exit took {took:.1f} s"


async def test_exit_says_once_what_a_connected_router_did_not_acknowledge(tmp_path):
    """Connected, but the router never acknowledges (its store cannot write a persisted
    event): the exit waits `exit_timeout`, then one line on stderr, nothing more."""
    async with Router(RouterConfig(port=0, data_dir=tmp_path)):
        pass  # makes the database and its tables
    url = f"sqlite:///file:{tmp_path / 'events.db'}?mode=ro&uri=true"
    router = Router(RouterConfig(port=0, store=StoreConfig(url=url, retry_max=0.1)))
    await router.start()
    code = (
        "import sys\n"
        "from aa.client import Client\n"
        "c = Client(sys.argv[1], exit_timeout=1.0)\n"
        'c.publish({"Temperature": 101}, type="reading", meta={"persist": True})\n'
    )
    try:
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            code,
            router.endpoint,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(30):
            _, err = await proc.communicate()
        took = time.monotonic() - started
    finally:
        if router.storage.store is not None:  # it would wait 30 s for the write that cannot be
            with pytest.raises(StoreUnavailable):
                await router.storage.store.aclose(timeout=0.1)
        await router.aclose()
    assert proc.returncode == 0
    text = err.decode()
    assert text.startswith("aa.client: 1 event(s) not acknowledged by a router within 1 s"), text
    assert len(text.splitlines()) == 1, text
    assert took < 10, f"exit took {took:.1f} s"


async def test_close_returns_even_while_a_callback_holds_the_clients_thread(endpoint):
    """A callback that blocks holds the client's thread; `close()` used to wait for that
    thread for ever (flush, then aclose, each without a bound). It now gives up after its
    timeout and a grace, and the program goes on."""
    from aa.client.blocking import CLOSE_GRACE

    def scenario():
        entered, release = threading.Event(), threading.Event()

        def stuck(event):
            entered.set()
            release.wait(60)

        client = Client(endpoint)
        try:
            client.subscribe("Stuck == 1", stuck)
            client.publish({"Stuck": 1})
            assert entered.wait(10)
            started = time.monotonic()
            client.close(timeout=0.5)
            took = time.monotonic() - started
        finally:
            release.set()
        client._thread.join(10)  # the callback returned: the loop stopped

        async def settled() -> None:  # what close() gave up on is cancelled and done
            me = asyncio.current_task()
            await wait_for(lambda: asyncio.all_tasks() == {me}, timeout=5)

        client._loop.run_until_complete(settled())
        client._loop.close()
        # flush and aclose each wait their timeout and the grace, the thread's join the grace
        assert took < 2 * (0.5 + CLOSE_GRACE) + CLOSE_GRACE + 2, took

    async with asyncio.timeout(60):  # (it never returned before)
        await in_thread(scenario)
