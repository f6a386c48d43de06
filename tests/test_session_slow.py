"""A subscriber that stops reading costs the router a bounded buffer and nobody else anything;
it is told what it missed as soon as it reads again (overflow="notify"), or closed with the
reason (overflow="disconnect"). A real router, raw-socket clients that stop reading."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
from support import wait_for

from aa.client import AsyncClient
from aa.mesh import Connection, PatternSpec
from aa.mesh.protocol import Deliver, Error, Hello, Message, Missed, Subscribe, Subscribed
from aa.router import Router, RouterConfig
from aa.router import session as session_module

#: The backlog bound of the router under test, in bytes: small, so a test fills it quickly.
BOUND = 256 * 1024
#: Bytes of padding per event: some 250 events to fill the bound.
PAD = 1000


@pytest.fixture
async def router() -> AsyncIterator[Router]:
    async with Router(RouterConfig(port=0, name="test", max_session_backlog=BOUND)) as r:
        yield r


class RawSubscriber:
    """A client on a plain socket (the kernel holds little for it) that reads only when told."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.codec = Connection()
        self.got: list[Message] = []

    @classmethod
    async def open(cls, router: Router, overflow: str) -> RawSubscriber:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, router.address)
        reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
        sub = cls(reader, writer)
        writer.write(
            sub.codec.send(Hello(client_id=f"slow-{overflow}"))
            + sub.codec.send(
                Subscribe(sub_id=1, pattern=PatternSpec(source="pad != ''"), overflow=overflow)
            )
        )
        await sub.read_until(lambda: any(type(m) is Subscribed for m in sub.got))
        return sub

    async def read_until(self, done, timeout: float = 30.0) -> None:
        async with asyncio.timeout(timeout):
            while not done():
                data = await self.reader.read(1 << 20)
                if not data:
                    return
                self.codec.receive_data(data)
                self.got += self.codec.next_messages()

    def numbers(self) -> list[int]:
        return [e.values["i"] for m in self.got if type(m) is Deliver for _, e in m.items]  # type: ignore[attr-defined]

    def missed(self) -> int:
        return sum(m.count for m in self.got if type(m) is Missed)  # type: ignore[attr-defined]


def session_of(router: Router, client_id: str) -> session_module.ClientSession:
    return next(s for s in router.sessions if s.client_id == client_id)


async def publish_until(router: Router, pub: AsyncClient, done, start: int = 0) -> int:
    """Publish numbered events until ``done()``; returns the next number."""
    n = start
    pad = "x" * PAD
    while not done():
        assert n < start + 50 * BOUND // PAD, "the router never dropped anything"
        await pub.publish({"i": n, "pad": pad})
        n += 1
        if n % 20 == 0:
            await pub.flush()
    await pub.flush()
    return n


async def test_missed_is_told_when_the_client_drains_with_no_further_event(router) -> None:
    slow = await RawSubscriber.open(router, "notify")
    session = session_of(router, "slow-notify")
    bystander_got: list[int] = []
    async with (
        AsyncClient(router.endpoint) as pub,
        AsyncClient(router.endpoint) as bystander,
    ):
        await bystander.subscribe("pad != ''", lambda ev: bystander_got.append(ev.values["i"]))
        published = await publish_until(router, pub, lambda: router.counters["dropped_slow"] > 0)
        # past the bound: the rest are dropped as they come, the buffer does not grow
        backlog = session.backlog
        published = await publish_until(
            router, pub, lambda: router.counters["dropped_slow"] > 200, published
        )
        assert session.shedding
        assert session.backlog <= backlog
        assert backlog <= BOUND + 64 * 1024  # the bound and at most one batch's frame
        await wait_for(lambda: len(bystander_got) == published, 10)
        assert bystander_got == list(range(published))  # the reader next to it lost nothing
        dropped = router.counters["dropped_slow"]

        # No event is published from here on: reading alone brings the notice.
        await slow.read_until(lambda: slow.missed() > 0)
        got = slow.numbers()
        assert slow.missed() == dropped == published - len(got)
        assert got == list(range(len(got)))  # what came, came in order; the rest was told
        assert not session.shedding

        # and the next event is delivered as usual, with no second notice
        await pub.publish({"i": published, "pad": "x"})
        await slow.read_until(lambda: slow.numbers()[-1:] == [published])
        assert slow.missed() == dropped == router.counters["dropped_slow"]
        assert not [m for m in slow.got if type(m) is Error]
    slow.writer.close()


async def test_overflow_disconnect_closes_with_the_reason_the_client_reads(router) -> None:
    slow = await RawSubscriber.open(router, "disconnect")
    session = session_of(router, "slow-disconnect")
    async with AsyncClient(router.endpoint) as pub:
        published = await publish_until(router, pub, lambda: not session.is_open)
    await slow.read_until(lambda: False)  # to the end of the connection
    got = slow.numbers()
    assert got == list(range(len(got))) and len(got) < published
    assert not slow.missed()
    errors = [m for m in slow.got if type(m) is Error]
    assert [e.code for e in errors] == ["overflow"]  # type: ignore[attr-defined]
    assert "did not read fast enough" in errors[0].message  # type: ignore[attr-defined]
    async with asyncio.timeout(10):
        await session.closed
    slow.writer.close()


async def test_a_disconnected_client_that_never_reads_is_let_go(router, monkeypatch) -> None:
    """Closed for overflow, it never takes what is written to it: the router cuts the
    connection after the grace, and with it the buffers."""
    monkeypatch.setattr(session_module, "CLOSE_GRACE", 0.5)
    slow = await RawSubscriber.open(router, "disconnect")
    session = session_of(router, "slow-disconnect")
    async with AsyncClient(router.endpoint) as pub:
        await publish_until(router, pub, lambda: not session.is_open)
    async with asyncio.timeout(10):
        await session.closed
    assert session not in router.sessions
    assert session.backlog == 0
    slow.writer.close()
