"""A client connection's life, its read pump and its write side move as the tables of
`aa.router.session` say: each move a real connection makes against a real router, and the
moves the tables refuse (a bug of ours is an error, never a silent state)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
from support import FAST, mesh, wait_for

from aa.client import AsyncClient
from aa.mesh import Connection, Event, PatternSpec, UsageError
from aa.mesh.protocol import (
    Ack,
    Bye,
    Deliver,
    Error,
    Hello,
    Message,
    Missed,
    Publish,
    Subscribe,
    Subscribed,
    Welcome,
)
from aa.router import Router, RouterConfig
from aa.router import session as session_module
from aa.router.session import (
    PHASE_MOVES,
    READING_MOVES,
    WRITING_MOVES,
    ClientSession,
    Phase,
    Reading,
    Writing,
)


@pytest.fixture
async def router() -> AsyncIterator[Router]:
    async with Router(RouterConfig(port=0, name="test")) as r:
        yield r


class Raw:
    """A client on a plain stream that sends frames as told and keeps what it reads."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.codec = Connection()
        self.got: list[Message] = []

    @classmethod
    async def open(cls, router: Router) -> Raw:
        reader, writer = await asyncio.open_connection(*router.address)
        return cls(reader, writer)

    def send(self, *messages: Message) -> None:
        self.writer.write(b"".join(self.codec.send(m) for m in messages))

    async def read_until(self, done, timeout: float = 10.0) -> None:
        """Read until ``done()`` or the end of the connection."""
        async with asyncio.timeout(timeout):
            while not done():
                data = await self.reader.read(1 << 20)
                if not data:
                    return
                self.codec.receive_data(data)
                self.got += self.codec.next_messages()

    def errors(self) -> list[Error]:
        return [m for m in self.got if isinstance(m, Error)]


async def newest_session(router: Router, before: set[ClientSession]) -> ClientSession:
    await wait_for(lambda: bool(router.sessions - before))
    return next(iter(router.sessions - before))


async def test_a_connection_is_open_after_its_hello_and_closed_after_its_bye(router) -> None:
    before = set(router.sessions)
    raw = await Raw.open(router)
    session = await newest_session(router, before)
    assert session.phase is Phase.HELLO and session.is_open
    raw.send(Hello(client_id="states"))
    await raw.read_until(lambda: any(isinstance(m, Welcome) for m in raw.got))
    assert session.phase is Phase.OPEN and session.is_open
    raw.send(Bye())
    await raw.read_until(lambda: False)  # the router closes its end
    assert not session.is_open
    raw.writer.close()
    async with asyncio.timeout(10):
        await session.closed
    assert session.phase is Phase.CLOSED
    assert session not in router.sessions


async def test_a_frame_before_the_hello_closes_the_connection_with_the_reason(router) -> None:
    before = set(router.sessions)
    raw = await Raw.open(router)
    session = await newest_session(router, before)
    raw.send(Subscribe(sub_id=1, pattern=PatternSpec(source="x > 1")))
    await raw.read_until(lambda: bool(raw.errors()))
    assert [e.message for e in raw.errors()] == ["expected 'hello' first, got 'subscribe'"]
    assert session.phase in (Phase.CLOSING, Phase.CLOSED)
    raw.writer.close()
    async with asyncio.timeout(10):
        await session.closed
    assert session.phase is Phase.CLOSED


async def test_a_second_hello_is_refused_and_only_its_sender_closed(router) -> None:
    async with AsyncClient(router.endpoint) as other:
        got: list[int] = []
        await other.subscribe("n > 0", lambda ev: got.append(ev.values["n"]))
        before = set(router.sessions)
        raw = await Raw.open(router)
        session = await newest_session(router, before)
        raw.send(Hello(client_id="twice"), Hello(client_id="twice"))
        await raw.read_until(lambda: bool(raw.errors()))
        assert [(e.code, e.message) for e in raw.errors()] == [
            ("protocol", "a client may not send 'hello'")
        ]
        assert sum(isinstance(m, Welcome) for m in raw.got) == 1  # welcomed once only
        assert not session.is_open
        await other.publish({"n": 1})
        await wait_for(lambda: got == [1])
        raw.writer.close()


async def test_a_peer_router_calling_is_handed_over_to_the_links_room() -> None:
    opened: list[ClientSession] = []
    async with mesh(2, config=FAST) as (r0, r1):
        take = r0.session_opened

        def noting(session: ClientSession) -> None:
            opened.append(session)
            take(session)

        r0.session_opened = noting  # type: ignore[method-assign]
        r1.mesh.add_peer(r0.endpoint)
        await wait_for(lambda: any(s.phase is Phase.HANDED_OVER for s in opened), timeout=10)
        handed = next(s for s in opened if s.phase is Phase.HANDED_OVER)
        assert handed not in r0.sessions and handed.transport is None
        assert not handed.is_open


async def test_a_client_session_is_never_handed_over(router) -> None:
    async with AsyncClient(router.endpoint, name="kept") as client:
        await wait_for(lambda: any(s.name == "kept" for s in router.sessions))
        session = next(s for s in router.sessions if s.name == "kept")
        with pytest.raises(UsageError, match="detached"):
            session.detach()
        assert session.phase is Phase.OPEN
        got = []
        await client.subscribe("n > 0", lambda ev: got.append(ev.values["n"]))
        await client.publish({"n": 1})
        await wait_for(lambda: got == [1])


async def test_a_large_publish_pauses_reading_until_dispatched_then_reads_again(router) -> None:
    """More events in one frame than a dispatch step: reading pauses (the frame behind it
    waits in the buffer) while the frame is dispatched across turns, then resumes; every
    event comes through in order and both frames are acknowledged."""
    moves: list[Reading] = []
    async with AsyncClient(router.endpoint) as sub:
        got: list[int] = []
        await sub.subscribe("n >= 0", lambda ev: got.append(ev.values["n"]))
        before = set(router.sessions)
        raw = await Raw.open(router)
        session = await newest_session(router, before)
        read = session._read

        def noting(reading: Reading) -> None:
            moves.append(reading)
            read(reading)

        session._read = noting  # type: ignore[method-assign]
        n = 30 * session_module.DISPATCH_STEP
        big = tuple(Event(values={"n": i, "pad": "x" * 200}) for i in range(n))
        raw.send(
            Hello(client_id="big"),
            Publish(seq=1, events=big),
            Publish(seq=2, events=(Event(values={"n": n}),)),
        )
        await raw.read_until(lambda: any(isinstance(m, Ack) and m.seq == 2 for m in raw.got))
        await wait_for(lambda: len(got) == n + 1, timeout=20)
        assert got == list(range(n + 1))
        assert not raw.errors()
        raw.writer.close()
    assert Reading.YIELDING in moves and Reading.PAUSED in moves
    assert session.reading is Reading.IDLE
    state = Reading.IDLE  # every pause ended in a resume, each move one its table allows
    for move in moves:
        assert move in READING_MOVES[state], (state, move)
        state = move


async def test_a_slow_reader_moves_from_flowing_to_shedding_and_back_when_it_drains() -> None:
    """The write side: paused by the transport, shedding once over its bound (drops counted
    as untold), flowing again when the client reads, which brings the `Missed` count."""
    bound = 128 * 1024
    async with Router(RouterConfig(port=0, name="test", max_session_backlog=bound)) as router:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, router.address)
        reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
        slow = Raw(reader, writer)
        slow.send(
            Hello(client_id="slow"),
            Subscribe(sub_id=1, pattern=PatternSpec(source="pad != ''")),
        )
        await slow.read_until(lambda: any(isinstance(m, Subscribed) for m in slow.got))
        session = next(s for s in router.sessions if s.client_id == "slow")
        assert session.writing is Writing.FLOWING
        async with AsyncClient(router.endpoint) as pub:
            i = 0
            while not session.shedding:
                assert i < 100 * bound // 1000, "the router never shed"
                await pub.publish({"i": i, "pad": "x" * 1000})
                i += 1
                if i % 20 == 0:
                    await pub.flush()
            await pub.flush()
        assert session.writing is Writing.SHEDDING
        assert session.untold > 0 and session.untold == router.counters["dropped_slow"]
        await slow.read_until(lambda: any(isinstance(m, Missed) for m in slow.got))
        told = sum(m.count for m in slow.got if isinstance(m, Missed))
        assert told == router.counters["dropped_slow"]
        assert session.writing is Writing.FLOWING and session.untold == 0
        assert not slow.errors()
        assert any(isinstance(m, Deliver) for m in slow.got)
        writer.close()


def test_each_table_covers_its_states_and_a_closed_connection_goes_nowhere() -> None:
    assert set(PHASE_MOVES) == set(Phase)
    assert set(READING_MOVES) == set(Reading)
    assert set(WRITING_MOVES) == set(Writing)
    assert PHASE_MOVES[Phase.CLOSED] == frozenset()
    assert Phase.OPEN not in PHASE_MOVES[Phase.CLOSING]  # closing is never undone
    assert Phase.HANDED_OVER not in PHASE_MOVES[Phase.OPEN]  # a client's connection stays


async def test_a_move_the_table_refuses_raises_and_changes_nothing(router) -> None:
    async with AsyncClient(router.endpoint, name="moves"):
        await wait_for(lambda: any(s.name == "moves" for s in router.sessions))
        session = next(s for s in router.sessions if s.name == "moves")
    async with asyncio.timeout(10):
        await session.closed
    assert session.phase is Phase.CLOSED
    with pytest.raises(UsageError, match="from closed to open"):
        session._enter(Phase.OPEN)
    assert session.phase is Phase.CLOSED
    with pytest.raises(UsageError, match="from idle to paused|from idle to idle"):
        session._read(Reading.IDLE)
    with pytest.raises(UsageError, match="from flowing to shedding"):
        session._write(Writing.SHEDDING)
    assert session.reading is Reading.IDLE and session.writing is Writing.FLOWING
