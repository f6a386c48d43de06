"""One TCP connection with a peer router: an asyncio protocol over the sans-I/O codec.

The `MeshService` owns every link and decides what they carry; a link only reads frames,
hands them to its owner (`LinkOwner`: the service's link-facing methods), and writes. Its
life::

    state      event                                   next       done by
    --------   -------------------------------------   --------   ---------------------------
    hello      their PeerHello arrives                  up         LinkOwner.link_up
    hello      anything else, or the connection ends    closed     (the dial fails: poison)
    up         we retire it (a duplicate, shutdown)     retiring   Bye sent; we still read
    up         their Bye arrives                        closing    we answer Bye, then close
    retiring   their Bye arrives / link_timeout passes  closing    close
    any        a bad frame                              closing    Error frame, then close
    closing    the transport is closed                  closed     LinkOwner.link_lost
    any        the connection breaks                    closed     LinkOwner.link_lost

Why a goodbye in both directions: a link is only closed once each side has sent `Bye` and
read the other's. Everything sent before a `Bye` is therefore read, so retiring a duplicate
link (both routers dialled each other at once) or shutting down loses no flooded event.

Writing: flood groups for the peer (`aa.mesh.protocol.peering.FloodGroup`: events already packed,
shared by every link that carries them) are queued (`queue_group`) while a batch is being
handled and written as one `Flood` frame by `flush`, as `ClientSession` does for
deliveries. A link never encodes an event itself: it writes blobs made once per mesh
(`MeshService`), so a relayed group costs a copy of its bytes per link, not an encoding.
Control frames (`send`) first flush the events this router originated and the queue, so a
peer sees events and controls in the order we sent them.

What a link writes is bounded twice: a frame is at most the codec's caps, in bytes and in
items of one list (`MAX_PEER_FRAME_ITEMS`, which both ends decode with; a batch over them
is cut between groups, a group over the byte cap is re-encoded in halves, and an event too
large alone is dropped and counted, `dropped_large`); and while more than `MeshConfig.max_backlog`
bytes wait in the transport (the peer does not keep up), what would be queued on top is
dropped and counted (`dropped_slow`): a slow peer must not make us buffer without bound.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol, cast

from aa.mesh import (
    Connection,
    ConnectionLost,
    Control,
    Flood,
    PeerHello,
    PeerRouters,
    ProtocolError,
    UsageError,
)
from aa.mesh.protocol import (
    IN_PROGRESS,
    Bye,
    Error,
    FloodGroup,
    GetMesh,
    MeshInfo,
    Message,
    Ping,
    Pong,
)

from .config import MeshConfig

__all__ = ["PeerLink", "LinkOwner"]

log = logging.getLogger("aa.router.links")

#: Most items in one list or map of a frame from a peer router. A link accepted here takes over
#: the codec of the client session that read the peer's hello, and with it a client's much
#: smaller cap (`aa.router.session.MAX_FRAME_ITEMS`, 10,000), which would refuse a long
#: store-sync digest or id list as malformed at every retry, so stores with a bucket of many
#: differing events would never converge (tests/test_faults_sync_big.py). Routers send lists of
#: up to 50,000 items (`aa.router.store.sync`'s MAX_BUCKETS); a cap above that still bounds what
#: one frame costs to decode, on both ends of a link alike.
MAX_PEER_FRAME_ITEMS = 65_536
#: Most items in all lists and maps of one large peer frame together (`aa.mesh.protocol`'s
#: `MAX_FRAME_VALUES` is the clients'): a frame at the byte cap of the flood groups and id
#: lists routers send holds well under one per 16 bytes.
MAX_PEER_FRAME_VALUES = 1 << 20
#: Seconds one link's frames may take of one turn of the loop (a large frame is decoded in
#: steps across turns, with reading paused), as a client connection's (`TURN_BUDGET`).
PEER_TURN_BUDGET = 0.005
#: States in which frames still buffered are not handled any more.
_NOT_READING = frozenset({"closing", "closed"})


class LinkOwner(Protocol):
    """What a link tells the service that owns it (`MeshService`), and reads from it."""

    counters: Counter[str]
    config: MeshConfig

    def link_up(self, link: PeerLink, hello: PeerHello) -> None: ...

    def link_lost(self, link: PeerLink, previous: str, exc: Exception | None) -> None: ...

    def receive_flood(self, link: PeerLink, groups: Sequence[FloodGroup]) -> None: ...

    def receive_control(self, link: PeerLink, msg: Control) -> None: ...

    def learn(self, link: PeerLink, routers: Sequence[Any]) -> None: ...

    def batch_done(self) -> None: ...

    def info(self) -> dict[str, Any]: ...

    @property
    def relay(self) -> Any:
        """The flood (`Relay`): `link_dirty`, `dropped`, `flush_originated`."""


class PeerLink(asyncio.Protocol):
    """Our end of one connection with a peer router (see the module docstring)."""

    def __init__(
        self,
        mesh: LinkOwner,
        *,
        address: str | None,
        outgoing: bool,
        codec: Connection | None = None,
    ) -> None:
        self.mesh = mesh
        self.codec = codec if codec is not None else Connection()
        self.codec.max_items = MAX_PEER_FRAME_ITEMS  # a client session's codec had the client cap
        self.codec.max_values = MAX_PEER_FRAME_VALUES
        self._stepping = False  # a large frame is being decoded across turns
        self.transport: asyncio.Transport | None = None
        #: The peer's mesh endpoint: the one we dialled, or the one its hello gave.
        self.address = address
        #: Whether we dialled it.
        self.outgoing = outgoing
        #: The peer's hello, once it came; its `router_id` names the link.
        self.remote: PeerHello | None = None
        self.remote_id: str | None = None
        #: The peer's host as the connection shows it (fills unspecified endpoints).
        self.remote_host: str | None = None
        #: The peer's client endpoint, if it accepts clients (for client fail-over).
        self.client_endpoint: str | None = None
        self.state = "hello"
        #: Resolved by the service once the hello exchange is over: True when this link is
        #: the one in use for its peer, False when it was a duplicate or led to ourselves.
        self.ready: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.ready.add_done_callback(_retrieve)  # a dial that timed out no longer awaits it
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        #: Monotonic time the link came up.
        self.since: float | None = None
        now = time.monotonic()
        self.last_heard = now
        self.last_sent = now
        #: Bytes handed to the transport so far (an ack waits until the kernel has them).
        self.written = 0
        #: Events flooded to the peer and received from it on this link (`GET /metrics`).
        self.events_out = 0
        self.events_in = 0
        #: Whether the link ended on purpose (goodbyes, a duplicate), not broke.
        self.clean = False
        self.bye_sent = False
        #: Groups to write with the next `Flood` frame, and the events they hold.
        self._queue: list[FloodGroup] = []
        self._queued_events = 0
        self._dirty = False
        self._congested = False

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream's: a Transport
        peer = transport.get_extra_info("peername")
        if peer:
            self.remote_host = peer[0]

    def data_received(self, data: bytes) -> None:
        self.codec.receive_data(data)
        if not self._stepping:
            self.process()

    def process(self) -> None:
        """Handle every whole frame buffered (also called for frames a `ClientSession`
        buffered before it handed the connection over)."""
        if self.state in _NOT_READING:
            return
        self.last_heard = time.monotonic()
        codec = self.codec
        deadline = time.perf_counter() + PEER_TURN_BUDGET
        try:
            while True:
                msg = codec.next_message(stepwise=True)
                if msg is IN_PROGRESS:  # a step of a large frame
                    if time.perf_counter() > deadline:  # the rest on the next turn
                        self._next_turn()
                        break
                    continue
                if not isinstance(msg, Message):
                    break
                self.handle(msg)
                if self.state in _NOT_READING:
                    break
                if time.perf_counter() > deadline:
                    self._next_turn()
                    break
        except ProtocolError as exc:
            self.mesh.counters["peer_errors"] += 1
            log.warning(
                "peer %s sent a bad frame (%s): %s; closing the link",
                self.label,
                exc.code,
                exc,
                extra={"peer": self.label},
            )
            self.fail(exc.code, str(exc), exc)
        finally:
            self.mesh.batch_done()

    def _next_turn(self) -> None:
        """The rest of what is buffered waits for the next turn of the loop, reading paused."""
        self._stepping = True
        if self.transport is not None:
            self.transport.pause_reading()
        asyncio.get_running_loop().call_soon(self._go_on)

    def _go_on(self) -> None:
        self._stepping = False
        if self.state in _NOT_READING:
            return
        if self.transport is not None:
            self.transport.resume_reading()
        self.process()

    def connection_lost(self, exc: Exception | None) -> None:
        previous, self.state = self.state, "closed"
        self._queue = []
        self._queued_events = 0
        if not self.ready.done():
            self.ready.set_exception(
                ConnectionLost(f"peer {self.label} closed the connection during the hello")
            )
        if not self.closed.done():
            self.closed.set_result(None)
        self.mesh.link_lost(self, previous, exc)

    # -- set by the owner -------------------------------------------------------------------

    def mark_up(
        self, hello: PeerHello, now: float, *, address: str | None, client_endpoint: str | None
    ) -> None:
        """The peer's hello came: the link is up. *address* (for a link the peer dialled)
        is the peer's mesh endpoint as its hello gives it; *client_endpoint* its client one."""
        self.remote = hello
        self.remote_id = hello.router_id
        self.state = "up"
        self.since = now
        if self.client_endpoint is None:
            self.client_endpoint = client_endpoint
        if not self.outgoing:
            self.address = address

    def settle(self, in_use: bool) -> None:
        """The hello exchange is over: this link is the one in use for its peer (True), or
        a duplicate or one that led to ourselves (False)."""
        if not self.ready.done():
            self.ready.set_result(in_use)

    # -- frames from the peer ---------------------------------------------------------------

    def handle(self, msg: Message) -> None:
        if self.state == "hello":
            if not isinstance(msg, PeerHello):
                raise ProtocolError(f"expected 'peer-hello' first, got {msg.kind!r}")
            self.mesh.link_up(self, msg)
            return
        # Class patterns are isinstance checks in order (no message kind has subclasses):
        # the event path's kind first.
        match msg:
            case Flood():
                self.mesh.receive_flood(self, msg.groups)
            case Control():
                self.mesh.receive_control(self, msg)
            case PeerRouters():
                self.mesh.learn(self, msg.routers)
            case Ping():
                self.send(Pong(token=msg.token))
            case Pong():
                pass  # any frame counts as a sign of life (last_heard)
            case Bye():
                self._on_bye()
            case Error():
                log.warning(
                    "peer %s reports %s: %s",
                    self.label,
                    msg.code,
                    msg.message,
                    extra={"peer": self.label},
                )
                if msg.fatal:
                    self.abort()
            case GetMesh():
                self.send(MeshInfo(info=self.mesh.info()))
            case _:
                raise ProtocolError(f"a peer router may not send {msg.kind!r}")

    def _on_bye(self) -> None:
        self.clean = True
        if not self.bye_sent:
            self.retire()  # answer with our own goodbye, after what we still had queued
        self.state = "closing"
        if self.transport is not None:
            self.transport.close()

    # -- writing ----------------------------------------------------------------------------

    def queue_group(self, group: FloodGroup) -> None:
        """Send *group* with the next `Flood` frame (`flush`). The group is shared with other
        links: it is only ever read."""
        self._queue.append(group)
        self._queued_events += len(group.ids)
        if not self._dirty:
            self._dirty = True
            self.mesh.relay.link_dirty(self)

    def flush(self) -> None:
        """Write the queued groups as one frame (or several if one would be too large)."""
        self._dirty = False
        queue, self._queue = self._queue, []
        n, self._queued_events = self._queued_events, 0
        transport = self.transport
        if not queue or transport is None or transport.is_closing():
            return
        if transport.get_write_buffer_size() > self.mesh.config.max_backlog:
            self.mesh.relay.dropped(self, n)
            return
        self._write_flood(transport, queue, n)

    def _write_flood(self, transport: asyncio.Transport, groups: list[FloodGroup], n: int) -> None:
        # The common case is one `codec.send` for everything queued. Over the frame cap (a
        # backlog of many groups, or bulky events), cut between groups; a single group over
        # it is re-encoded in halves (`FloodGroup.split`); an event too large alone goes.
        try:
            if len(groups) > MAX_PEER_FRAME_ITEMS:  # more than the peer decodes in one frame
                raise UsageError("too many groups for one frame")
            data = self.codec.send(Flood(groups=tuple(groups)))
        except UsageError:
            if len(groups) > 1:
                half = len(groups) // 2
                first, second = groups[:half], groups[half:]
                n_first = sum(len(g.ids) for g in first)
                self._write_flood(transport, first, n_first)
                self._write_flood(transport, second, n - n_first)
                return
            group = groups[0]
            if len(group.ids) == 1:
                log.warning(
                    "dropping an event too large to flood to %s",
                    self.label,
                    extra={"peer": self.label, "event_id": next(iter(group.ids), None)},
                )
                self.mesh.counters["dropped_large"] += 1
                return
            a, b = group.split()
            self._write_flood(transport, [a], len(a.ids))
            self._write_flood(transport, [b], len(b.ids))
            return
        transport.write(data)
        self.written += len(data)
        self.last_sent = time.monotonic()
        self.events_out += n
        counters = self.mesh.counters
        counters["events_out"] += n
        counters["frames_out"] += 1

    def send(self, msg: Message) -> None:
        """Write one frame now, after any queued events."""
        transport = self.transport
        if transport is None or transport.is_closing() or self.bye_sent:
            return
        self.mesh.relay.flush_originated()  # events we originated go before this frame
        if self._queue:
            self.flush()
        data = self.codec.send(msg)
        transport.write(data)
        self.written += len(data)
        self.last_sent = time.monotonic()

    @property
    def congested(self) -> bool:
        """Whether the send buffer is past `MeshConfig.congested_above` (and has not yet
        drained below `congested_below`: hysteresis)."""
        transport = self.transport
        above = self.mesh.config.congested_above
        if transport is None or not above:
            return False
        size = transport.get_write_buffer_size()
        if self._congested:
            if size <= self.mesh.config.congested_below:
                self._congested = False
        elif size > above:
            self._congested = True
        return self._congested

    @property
    def reads_detours(self) -> bool:
        """Whether the peer said it reads directed flood groups (`FloodGroup.to`)."""
        return self.remote is not None and self.remote.detours

    def unsent(self, target: int) -> bool:
        """Whether some of the first *target* bytes written are still in our buffer (not yet
        handed to the operating system)."""
        transport = self.transport
        if transport is None or self.state == "closed":
            return False
        return self.written - transport.get_write_buffer_size() < target

    # -- ending -----------------------------------------------------------------------------

    def retire(self) -> None:
        """Stop sending on this link and say goodbye; it closes once the peer's goodbye has
        been read (or after the link timeout)."""
        if self.bye_sent:
            return
        if self.transport is not None and not self.transport.is_closing():
            self.flush()
            self.send(Bye())
        self.bye_sent = True
        self.clean = True
        if self.state in ("hello", "up"):
            self.state = "retiring"

    def close(self) -> None:
        """Close on purpose, without waiting for a goodbye."""
        self.clean = True
        if self.state != "closed":
            self.state = "closing"
        if self.transport is not None:
            self.flush()
            self.transport.close()

    def fail(self, code: str, message: str, cause: Exception | None = None) -> None:
        """Tell the peer why, then close: the link broke (the peer is poisoned)."""
        if self.transport is not None and not self.transport.is_closing():
            try:
                self.transport.write(
                    self.codec.send(Error(code=code, message=message[:500], fatal=True))
                )
            except UsageError:
                pass
            self.transport.close()
        if not self.ready.done():
            self.ready.set_exception(cause or ConnectionLost(message))
        if self.state != "closed":
            self.state = "closing"

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    @property
    def label(self) -> str:
        """How logs name the peer."""
        if self.remote is not None and self.remote.name:
            return f"{self.remote.name} ({self.remote_id})"
        return self.remote_id or self.address or self.remote_host or "?"

    def __repr__(self) -> str:
        direction = "to" if self.outgoing else "from"
        return f"<PeerLink {direction} {self.label} {self.state}>"


def _retrieve(fut: asyncio.Future[bool]) -> None:
    if not fut.cancelled():
        fut.exception()
