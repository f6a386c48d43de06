"""A client session needs of its router only what `aa.router.seams.SessionHost` lists: here
it runs against a small host that has those members and nothing else, over an in-memory
transport, and speaks the protocol as it does with a `Router`."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from aa.mesh import Connection, Event, PatternSpec
from aa.mesh.protocol import (
    Ack,
    Deliver,
    Error,
    Hello,
    Message,
    Ping,
    Pong,
    Publish,
    Subscribe,
    Subscribed,
    Welcome,
)
from aa.router import RouterConfig
from aa.router.seams import Flushable, SessionHost
from aa.router.security import Gate, PartialFrames
from aa.router.session import ClientSession, Phase, SessionSubscriber


class Batch:
    """The dispatcher's batch, reduced to its two calls."""

    def __init__(self) -> None:
        self.waiting: list[Flushable] = []

    def queued(self, client: Flushable) -> None:
        self.waiting.append(client)

    def flush(self) -> None:
        waiting, self.waiting = self.waiting, []
        for client in waiting:
            client.flush()


class Host:
    """Exactly the members of `SessionHost` (a class with `__slots__`: no others can be set)."""

    __slots__ = (
        "security",
        "limits",
        "counters",
        "partial_frames",
        "deliveries",
        "sessions",
        "published",
        "subscribed",
    )

    def __init__(self) -> None:
        self.security = Gate()
        self.limits = RouterConfig()
        self.counters: Counter[str] = Counter()
        self.partial_frames = PartialFrames()
        self.deliveries = Batch()
        self.sessions: list[ClientSession] = []
        self.published: list[Event] = []
        self.subscribed: list[Hashable] = []

    def session_opened(self, session: ClientSession) -> None:
        self.sessions.append(session)

    def session_closed(self, session: ClientSession) -> None:
        self.sessions.remove(session)

    def serve(self, session: ClientSession, msg: Message) -> bool:
        if isinstance(msg, Hello):
            assert session.client_id is not None
            session.send(Welcome(router_id="fake", router_name="fake", client_id=session.client_id))
            return True
        return False

    def accept_publish(
        self,
        session: ClientSession,
        seq: int,
        events: Sequence[Event],
        *,
        until: float | None = None,
        done: Callable[[], None] | None = None,
    ) -> None:
        self.published += events
        session.ack(seq)
        if done is not None:
            done()

    def tier(self, spec: PatternSpec) -> str:
        return "predicate"

    def subscription_notes(
        self,
        spec: PatternSpec,
        params: Mapping[str, Any],
        history: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        return {"tier": "predicate", "warnings": ()}

    def add_subscription(
        self, key: Hashable, spec: Any, params: Mapping[str, Any], history: Mapping[str, Any] | None
    ) -> None:
        self.subscribed.append(key)

    def subscription_added(
        self,
        key: Hashable,
        history: Mapping[str, Any] | None,
        away: tuple[float, Callable[[int, bool], None]] | None = None,
    ) -> None:
        pass

    def remove_subscription(self, key: Hashable) -> None:
        self.subscribed.remove(key)

    def update_subscription(self, key: Hashable, params: Mapping[str, Any]) -> None:
        pass


class MemoryTransport(asyncio.Transport):
    """What is written, kept; reading paused or not; closing ends the session's connection."""

    def __init__(self, protocol: asyncio.Protocol) -> None:
        super().__init__()
        self.protocol = protocol
        self.written = bytearray()
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def can_write_eof(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)


async def test_a_session_speaks_the_protocol_with_a_host_that_has_only_the_seam() -> None:
    host = Host()
    seam: SessionHost = host  # mypy holds the fake to the seam, as it holds the Router
    session = ClientSession(seam)
    transport = MemoryTransport(session)
    session.connection_made(transport)
    client = Connection()
    got: list[Message] = []

    def said() -> list[Message]:
        client.receive_data(bytes(transport.written))
        transport.written.clear()
        got.extend(client.next_messages())
        return got

    session.data_received(
        client.send(Hello(client_id="c1"))
        + client.send(Subscribe(sub_id=1, pattern=PatternSpec(source="n > 0")))
        + client.send(Publish(seq=1, events=(Event(values={"n": 1}),)))
        + client.send(Ping(token=7))
    )
    assert session.phase is Phase.OPEN and host.sessions == [session]
    assert [type(m) for m in said()] == [Welcome, Subscribed, Ack, Pong]
    assert [e.values for e in host.published] == [{"n": 1}]

    # a delivery waits in the batch and is written once when the batch is handled
    (sub,) = host.subscribed
    sub.deliver(Event(values={"n": 2}))  # type: ignore[attr-defined]
    sub.deliver(Event(values={"n": 3}))  # type: ignore[attr-defined]
    assert host.deliveries.waiting == [session]
    host.deliveries.flush()
    (deliver,) = said()[4:]
    assert isinstance(deliver, Deliver)
    assert [e.values["n"] for _, e in deliver.items] == [2, 3]
    assert host.counters["delivered"] == 2

    # a frame a client may not send: told why, closed, let go by the host
    session.data_received(client.send(Welcome(router_id="x", router_name="x", client_id="x")))
    assert [(m.code, m.message) for m in said() if isinstance(m, Error)] == [
        ("protocol", "a client may not send 'welcome'")
    ]
    assert session.phase is Phase.CLOSING
    async with asyncio.timeout(5):
        await session.closed
    assert session.phase is Phase.CLOSED and host.sessions == []


def _queue_cpu(session: ClientSession, subs: list[SessionSubscriber], same: bool) -> float:
    """CPU seconds of delivering one event to each of *subs* (*same*), or a new event each."""
    shared = Event(values={"n": 1})
    events = [shared] * len(subs) if same else [Event(values={"n": 1}) for _ in subs]
    start = time.thread_time()
    for sub, event in zip(subs, events, strict=True):
        sub.deliver(event)
    cpu = time.thread_time() - start
    session._pending.clear()
    return cpu


async def test_one_event_for_many_subscriptions_of_a_client_costs_each_the_same() -> None:
    """A client (its limit raised) whose 5,000 subscriptions all match one event: the event is
    queued once, naming all of them in order, at about what 5,000 deliveries of separate
    events cost, not a copy of all the ids before each."""
    host = Host()
    session = ClientSession(host)
    transport = MemoryTransport(session)
    session.connection_made(transport)
    subs = [SessionSubscriber(session, sid) for sid in range(5_000)]
    shared = Event(values={"n": 1}, id="e-1")
    for sub in subs:
        sub.deliver(shared)
    host.deliveries.flush()
    client = Connection()
    client.receive_data(bytes(transport.written))
    (deliver,) = client.next_messages()
    assert isinstance(deliver, Deliver)
    assert [(list(ids), e.id) for ids, e in deliver.items] == [(list(range(5_000)), "e-1")]
    same = min(_queue_cpu(session, subs, True) for _ in range(3))
    apart = min(_queue_cpu(session, subs, False) for _ in range(3))
    assert same < 4 * apart + 0.002, (same, apart)
