"""One client's connection to the router: an asyncio protocol over the sans-I/O codec.

Reading: every chunk is fed to the codec and every whole frame handled at once, so a burst
of `Publish` frames is dispatched in one go. Writing: deliveries for this client are queued
while the router dispatches a batch and written as one `Deliver` frame when the batch is
done (`flush`), so N events cost one syscall, not N. A bad frame gets an error frame and
closes this connection only.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from aa.mesh import Connection, Event, PatternError, ProtocolError, UsageError
from aa.mesh.protocol import GetMesh, MeshInfo
from aa.mesh.protocol import STORAGE_REQUESTS
from aa.mesh.protocol import QUENCH_REQUESTS
from aa.mesh.protocol import (
    Ack,
    Bye,
    Deliver,
    Error,
    GetRouters,
    Hello,
    Message,
    PatternFailed,
    Ping,
    Pong,
    Publish,
    Routers,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Update,
    Updated,
    Welcome,
)

if TYPE_CHECKING:
    from .router import Router

__all__ = ["ClientSession", "SessionSubscriber"]

log = logging.getLogger("aa.router.session")

#: Bytes waiting in a client's transport above which a bulk sender (history replay) waits for
#: the client to catch up: a few frames of events, so the client always has one to decode.
DRAIN_ABOVE = 1024 * 1024


class SessionSubscriber:
    """The pattern engine's key for one subscription of one TCP client."""

    __slots__ = ("session", "sub_id", "held", "__weakref__")

    def __init__(self, session: "ClientSession", sub_id: int) -> None:
        self.session = session
        self.sub_id = sub_id
        #: Live events held while this subscription's history is replayed (`aa.router.store.history`).
        self.held: Any = None

    def deliver(self, event: Event) -> None:
        if self.held is not None:
            self.held.append(event)
            return
        self.session.queue_delivery(self.sub_id, event)

    def deliver_now(self, event: Event) -> None:
        """Deliver past any hold (history replay)."""
        self.session.queue_delivery(self.sub_id, event)

    @property
    def active(self) -> bool:
        """Still subscribed, on an open connection."""
        s = self.session
        return s.subscriptions.get(self.sub_id) is self and s.is_open

    async def drained(self) -> None:
        """Wait while the connection's write buffer is over its high-water mark."""
        await self.session.drained()

    def pattern_failed(self, code: str, message: str) -> None:
        self.session.pattern_failed(self.sub_id, code, message)

    @property
    def client_id(self) -> str | None:
        return self.session.client_id

    def __repr__(self) -> str:
        return f"<subscription {self.sub_id} of {self.session.client_id}>"


class ClientSession(asyncio.Protocol):
    """Router side of one client connection."""

    def __init__(self, router: "Router") -> None:
        self.router = router
        self.codec = Connection()
        self.transport: asyncio.Transport | None = None
        self.client_id: str | None = None
        self.name: str | None = None
        self.address = "?"
        self.subscriptions: dict[int, SessionSubscriber] = {}
        self._pending: list[list[Any]] = []  # [[sub_ids], event] awaiting flush
        self._dirty = False
        self._closing = False
        self.closed = asyncio.get_running_loop().create_future()
        self.dropped = 0  # deliveries dropped because this client did not keep up
        self._writable: asyncio.Future[None] | None = None  # set while the transport is paused

    @property
    def is_open(self) -> bool:
        """Whether the connection still takes frames (not closing, not handed over)."""
        return not self._closing

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        if peer:
            self.address = f"{peer[0]}:{peer[1]}"
        self.router.session_opened(self)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        self.codec.receive_data(data)
        try:
            while True:
                msg = self.codec.next_message()
                if not isinstance(msg, Message):
                    break
                self.handle(msg)
                if self._closing:
                    break
        except ProtocolError as exc:
            log.info("closing %s (%s): %s", self.client_id or self.address, exc.code, exc)
            self.fail(exc.code, str(exc))
        finally:
            self.router.dispatcher.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self.router.session_closed(self)
        if not self.closed.done():
            self.closed.set_result(None)
        self.resume_writing()

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        fut, self._writable = self._writable, None
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def drained(self) -> None:
        """Return once the transport takes more data: at once unless more than
        `DRAIN_ABOVE` bytes wait in it. Bulk senders (history replay) pace themselves
        with it, keeping the client busy and the router's memory bounded."""
        transport = self.transport
        if self._writable is not None and transport is not None and transport.get_write_buffer_size() > DRAIN_ABOVE:
            await asyncio.shield(self._writable)

    # -- handling ---------------------------------------------------------------------------

    def handle(self, msg: Message) -> None:
        if self.client_id is None:
            if type(msg) is Hello:
                self._hello(msg)
                return
            if self.router.handoff(self, msg):
                return
            raise ProtocolError(f"expected 'hello' first, got {msg.kind!r}")
        kind = type(msg)
        if kind is Publish:
            self.router.accept_publish(self, msg)  # type: ignore[arg-type]
        elif kind is Subscribe:
            self._subscribe(msg)  # type: ignore[arg-type]
        elif kind is Unsubscribe:
            sub = self.subscriptions.pop(msg.sub_id, None)  # type: ignore[attr-defined]
            if sub is not None:
                self.router.remove_subscription(sub)
        elif kind is Update:
            self._update(msg)  # type: ignore[arg-type]
        elif kind is Ping:
            self.send(Pong(token=msg.token))  # type: ignore[attr-defined]
        elif kind is GetRouters:
            self.send(Routers(addresses=self.router.alternatives()))
        elif kind is GetMesh:
            self.send(MeshInfo(info=self.router.mesh_info()))
        elif kind in STORAGE_REQUESTS:
            self.router.caches.handle_request(self, msg)
        elif kind in QUENCH_REQUESTS:
            self.router.quench.handle_request(self, msg)
        elif kind is Bye:
            self.close()
        else:
            raise ProtocolError(f"a client may not send {msg.kind!r}")

    def _hello(self, msg: Hello) -> None:
        self.client_id = msg.client_id
        self.name = msg.name
        self.send(
            Welcome(
                router_id=self.router.id,
                router_name=self.router.name,
                client_id=msg.client_id,
                alternatives=self.router.alternatives(),
            )
        )

    def _subscribe(self, msg: Subscribe) -> None:
        if msg.sub_id in self.subscriptions:
            self.send(Error(code="duplicate", message=f"sub_id {msg.sub_id} is in use", ref=msg.sub_id))
            return
        limit = self.router.config.max_subscriptions_per_client
        if len(self.subscriptions) >= limit:
            self.send(Error(code="limit", message=f"at most {limit} subscriptions per client", ref=msg.sub_id))
            return
        sub = SessionSubscriber(self, msg.sub_id)
        try:
            self.router.add_subscription(sub, msg.pattern, msg.params, msg.history)
        except (PatternError, UsageError) as exc:
            code = getattr(exc, "code", "pattern-refused")
            self.send(Error(code=code, message=str(exc), ref=msg.sub_id))
            return
        self.subscriptions[msg.sub_id] = sub
        self.send(Subscribed(sub_id=msg.sub_id))
        self.router.subscription_added(sub, msg.history)

    def _update(self, msg: Update) -> None:
        sub = self.subscriptions.get(msg.sub_id)
        if sub is None:
            self.send(Error(code="unknown-subscription", message=f"no subscription {msg.sub_id}", ref=msg.sub_id))
            return
        try:
            self.router.update_subscription(sub, msg.params)
        except (PatternError, UsageError) as exc:
            self.send(Error(code=getattr(exc, "code", "bad-params"), message=str(exc), ref=msg.sub_id))
            return
        self.send(Updated(sub_id=msg.sub_id))

    # -- writing ----------------------------------------------------------------------------

    def send(self, msg: Message) -> None:
        """Write one control frame now (after any queued deliveries, to keep order)."""
        if self.transport is None or self._closing:
            return
        if self._pending:
            self.flush()
        self.transport.write(self.codec.send(msg))

    def queue_delivery(self, sub_id: int, event: Event) -> None:
        pending = self._pending
        if pending and pending[-1][1] is event:  # same event, another of our subscriptions
            pending[-1][0].append(sub_id)
            return
        pending.append([[sub_id], event])
        if not self._dirty:
            self._dirty = True
            self.router.dispatcher.queued(self)

    def flush(self) -> None:
        """Write queued deliveries as one frame (or several, if one would be too large)."""
        self._dirty = False
        pending, self._pending = self._pending, []
        if not pending or self.transport is None or self._closing:
            return
        if self.transport.get_write_buffer_size() > self.router.config.max_session_backlog:
            self.dropped += len(pending)
            self.router.counters["dropped_slow"] += len(pending)
            return
        try:
            self.transport.write(self.codec.send(Deliver(items=pending)))  # type: ignore[arg-type]
        except UsageError:  # over the frame cap: split and retry
            if len(pending) == 1:
                log.warning("dropping an event too large to deliver to %s", self.client_id)
                return
            half = len(pending) // 2
            for part in (pending[:half], pending[half:]):
                self._pending = part
                self.flush()

    def ack(self, seq: int) -> None:
        self.send(Ack(seq=seq))

    def pattern_failed(self, sub_id: int, code: str, message: str) -> None:
        if self.subscriptions.pop(sub_id, None) is not None:
            self.send(PatternFailed(sub_id=sub_id, code=code, message=message))

    def fail(self, code: str, message: str) -> None:
        """Tell the client why, then close this connection (and only this one)."""
        self.send(Error(code=code, message=message, fatal=True))
        self.close()

    def detach(self) -> tuple[asyncio.Transport, Connection]:
        """Give the connection up to another protocol (a peer router called, not a client):
        stop handling frames, leave the router's sessions, and return the transport and the
        codec, which may hold frames that came in the same read."""
        transport = self.transport
        if transport is None or self._closing:
            raise UsageError("only an open session can be detached")
        self._closing = True
        self.transport = None
        self.router.session_closed(self)
        if not self.closed.done():
            self.closed.set_result(None)
        return transport, self.codec

    def close(self) -> None:
        if self.transport is not None and not self._closing:
            self.flush()
            self._closing = True
            self.transport.close()
