"""One client's connection to the router: an asyncio protocol over the sans-I/O codec.

Reading: every chunk is fed to the codec and the frames it completes are handled for up to
`TURN_BUDGET` of the loop's turn (a large frame is decoded, checked and dispatched in steps,
`aa.mesh.protocol.codec`), the rest on the next turn with reading paused. Writing:
deliveries for this client are queued while the router dispatches a batch and written as
one `Deliver` frame when the batch is done (`flush`), so N events cost one syscall, not N.
A bad frame gets an error frame and closes this connection only.

The session asks its router only what `aa.router.seams.SessionHost` lists, and keeps its
own state in three small machines, each changed in one method that refuses a move its table
does not allow (`UsageError`: a bug of ours, never the client's):

- `Phase`, the connection's life: ``HELLO`` → ``OPEN`` (its hello accepted) → ``CLOSING`` (we
  closed or refused it: what it sends is dropped, what is written drains) → ``CLOSED`` (lost);
  from ``HELLO`` also ``HANDED_OVER`` (a peer router called: the links room has it). Frames are
  taken and written in ``HELLO`` and ``OPEN`` only.
- `Reading`, the read pump: ``IDLE`` → ``HANDLING`` (`_process` handles what is buffered; acks
  wait for the end of its batch) → ``IDLE``; or, when the turn's budget is spent or a large
  publish is dispatched across turns, → ``YIELDING`` (still handling, reading paused) →
  ``PAUSED`` (the rest waits for `_resume` on a later turn) → ``IDLE``. Data that comes while
  paused is only buffered.
- `Writing`, the write side: ``FLOWING`` → ``PAUSED`` (over the transport's high-water mark:
  bulk senders wait) → ``SHEDDING`` (and over the backlog bound: deliveries are dropped as they
  come, counted per subscription) → ``FLOWING`` when it drains, which tells the client what
  it missed (`Missed`).

What waits to be written is data, not a flag: the deliveries and the ack of the batch (the
session is queued with the batch exactly while there are any), and the count of drops not
yet told (`untold`).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, cast

from aa.mesh import (
    Connection,
    Event,
    PatternError,
    PatternSpec,
    ProtocolError,
    UsageError,
    id_scope,
)
from aa.mesh.protocol import (
    IN_PROGRESS,
    Ack,
    Bye,
    CacheAck,
    CacheClear,
    CacheFetch,
    CacheKeepalive,
    CachePolicy,
    CacheRegister,
    CacheRemove,
    Error,
    GetCached,
    GetCacheInfo,
    Hello,
    Message,
    Missed,
    MissedAway,
    PatternFailed,
    PatternRaised,
    Ping,
    Pong,
    Publish,
    Quench,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Update,
    Updated,
)

from .dispatch import DISPATCH_STEP
from .memory import give_back
from .patterns import PREDICATE_TIER
from .security import Identity, Rules
from .wire import PublishReader

if TYPE_CHECKING:
    from .seams import SessionHost

#: The identity of a connection without TLS or without a certificate.
_ANONYMOUS = Identity()

__all__ = ["ClientSession", "SessionSubscriber", "Phase", "Reading", "Writing"]

log = logging.getLogger("aa.router.session")

#: Bytes waiting in a client's transport above which a bulk sender (history replay) waits for
#: the client to catch up: a few frames of events, so the client always has one to decode.
DRAIN_ABOVE = 1024 * 1024

#: Most items in one list or map of a client's frame (events per publish frame — the client
#: library sends 1,000 — and per value list or map): a frame of hundreds of thousands of
#: events would hold everyone for seconds. Larger values: `bytes`.
MAX_FRAME_ITEMS = 10_000
#: Seconds one connection's frames may take in one turn of the loop before the rest wait for
#: the next: thousands of small frames sent at once (updates, ~1.5 ms each) would hold
#: everyone for seconds.
TURN_BUDGET = 0.005
#: Seconds a connection refused for a bad frame is still read (and dropped) after the error.
LINGER = 1.0
#: Seconds a connection we closed has to take what is still written to it (the error saying
#: why comes after up to the backlog bound of deliveries) before it is cut: one that never
#: reads would otherwise keep its buffers, and the router's memory, for good.
CLOSE_GRACE = 30.0
#: Requests of one connection the router may refuse in a row (a subscription past its cap, a
#: pattern or a type its user may not use) before it closes that connection: a program that
#: reads its answers stays far under it, one that keeps trying costs an error frame each and
#: is closed instead, and its address held back at the port for a while
#: (`aa.router.security.RefusalBudget.hold`).
MAX_REFUSALS = 100
#: Refusals a second a connection earns back: a client refused now and then is never closed.
REFUSALS_EARNED = 5.0
#: Bytes in a client's transport above which it pauses us (`pause_writing`), unless the
#: backlog bound is lower: the bound is only ever passed while paused, so the transport
#: always says when it drains (`resume_writing`, which tells the client what it missed).
HIGH_WATER = 64 * 1024


class Phase(enum.StrEnum):
    """Where one connection is in its life (see the module docstring)."""

    HELLO = "hello"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"
    HANDED_OVER = "handed-over"


class Reading(enum.StrEnum):
    """The read pump of one connection (see the module docstring)."""

    IDLE = "idle"
    HANDLING = "handling"
    YIELDING = "yielding"
    PAUSED = "paused"


class Writing(enum.StrEnum):
    """The write side of one connection (see the module docstring)."""

    FLOWING = "flowing"
    PAUSED = "paused"
    SHEDDING = "shedding"


#: The moves each machine allows; any other is refused (`UsageError`). The states are string
#: enums so that these look-ups hash in C: the read pump moves twice per read.
PHASE_MOVES: Final[dict[Phase, frozenset[Phase]]] = {
    Phase.HELLO: frozenset({Phase.OPEN, Phase.CLOSING, Phase.CLOSED, Phase.HANDED_OVER}),
    Phase.OPEN: frozenset({Phase.CLOSING, Phase.CLOSED}),
    Phase.CLOSING: frozenset({Phase.CLOSED}),
    Phase.HANDED_OVER: frozenset({Phase.CLOSED}),
    Phase.CLOSED: frozenset(),
}
READING_MOVES: Final[dict[Reading, frozenset[Reading]]] = {
    Reading.IDLE: frozenset({Reading.HANDLING}),
    Reading.HANDLING: frozenset({Reading.IDLE, Reading.YIELDING}),
    # a large publish done within its first turn asks for the next turn while still handling
    Reading.YIELDING: frozenset({Reading.YIELDING, Reading.PAUSED}),
    Reading.PAUSED: frozenset({Reading.PAUSED, Reading.IDLE}),
}
WRITING_MOVES: Final[dict[Writing, frozenset[Writing]]] = {
    Writing.FLOWING: frozenset({Writing.PAUSED}),
    Writing.PAUSED: frozenset({Writing.SHEDDING, Writing.FLOWING}),
    Writing.SHEDDING: frozenset({Writing.FLOWING}),
}

# The members as module names: looked up on its class, a member costs a descriptor call,
# several times a global's, and the read pump and the deliveries compare with them.
_HELLO = Phase.HELLO
_OPEN = Phase.OPEN
_CLOSING = Phase.CLOSING
_CLOSED = Phase.CLOSED
_HANDED_OVER = Phase.HANDED_OVER
_IDLE = Reading.IDLE
_HANDLING = Reading.HANDLING
_YIELDING = Reading.YIELDING
_PAUSED = Reading.PAUSED
_FLOWING = Writing.FLOWING
_FULL = Writing.PAUSED
_SHEDDING = Writing.SHEDDING
_LIVE = (_OPEN, _HELLO)  # frames are taken and written

#: A delivery queued in a session: its subscriptions' ids and the event.
_Pending = tuple[tuple[int, ...] | list[int], Any]
_IN_PROCESS = (_HANDLING, _YIELDING)  # inside `_process`: acks wait for its end


#: Sub ids of one queued event kept in a tuple; past these, a list (each one more: one append).
_TUPLE_IDS = 8


def _also(pending: list[_Pending], last: _Pending, sub_id: int) -> None:
    """Name *sub_id* too in the delivery queued *last* (the last of *pending*): a tuple of a few
    ids, then a list, so one event for many subscriptions of a client costs each one the
    same, not a copy of all the ids before it."""
    ids = last[0]
    if isinstance(ids, list):
        ids.append(sub_id)
    elif len(ids) < _TUPLE_IDS:
        pending[-1] = (ids + (sub_id,), last[1])
    else:
        pending[-1] = ([*ids, sub_id], last[1])


class SessionSubscriber:
    """The pattern engine's key for one subscription of one TCP client."""

    __slots__ = (
        "session",
        "sub_id",
        "held",
        "receives",
        "overflow",
        "missed",
        "scope",
        "pattern",
        "ids",
        "__weakref__",
    )

    def __init__(
        self,
        session: ClientSession,
        sub_id: int,
        receives: Callable[[str | None], bool] | None = None,
        overflow: str = "notify",
        pattern: PatternSpec | None = None,
    ) -> None:
        self.session = session
        self.sub_id = sub_id
        #: Its ids as a delivery item names them, one tuple shared by all its deliveries.
        self.ids: tuple[int, ...] = (sub_id,)
        #: The pattern it subscribed with (held to the rules again after a reload).
        self.pattern = pattern
        #: What to do when the client does not keep up: "notify" or "disconnect".
        self.overflow = overflow
        #: Deliveries dropped since the client was last told (`Missed`).
        self.missed = 0
        #: Live events held while this subscription's history is replayed
        # (`aa.router.store.history`).
        self.held: Any = None
        #: The event types its user may receive (permissions, `aa.router.security`); None: any.
        self.receives = receives
        #: The types its pattern code may see (`aa.router.patterns.scope`), as the rules
        #: said at subscribe; None: any.
        self.scope: tuple[str, ...] | None = None

    def deliver(self, event: Event) -> None:
        if self.receives is not None and not self.receives(event.type):
            return
        if self.held is not None:
            self.held.append(event)
            return
        session = self.session
        if session.writing is _SHEDDING and self.overflow != "disconnect":
            # Its connection is over its bound: count the drop, encode nothing, queue nothing.
            self.missed += 1
            session.untold += 1
            session.dropped += 1
            session.counters["dropped_slow"] += 1
            return
        # `session.queue_delivery(self.sub_id, event)`, inline: the call is most of its cost.
        pending = session._pending
        if pending:
            last = pending[-1]
            if last[1] is event:  # same event, another of our subscriptions (rare)
                _also(pending, last, self.sub_id)
                return
        elif session._ack is None:  # the first thing this batch writes to us
            session._batch.queued(session)
        pending.append((self.ids, event))

    def missed_events(self, count: int) -> None:
        """*count* events went unmatched for it (a pattern worker's backlog was full): the
        client is told before its next delivery, as for a slow reader."""
        self.missed += count
        self.session.untold += count

    def deliver_now(self, event: Event) -> None:
        """Deliver past any hold (history replay)."""
        if self.receives is None or self.receives(event.type):
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

    def pattern_erred(self, notice: Any) -> None:
        """The pattern raised (`aa.router.patterns.ErrorNotice`): tell the client."""
        if self.active:
            self.session.send(
                PatternRaised(
                    sub_id=self.sub_id,
                    error=notice.error,
                    count=notice.count,
                    line=notice.line,
                    text=notice.text,
                )
            )

    def missed_away(self, count: int, more: bool) -> None:
        """Stored events it matched while its client was away (`aa.router.store.away`)."""
        if self.active:
            self.session.send(MissedAway(sub_id=self.sub_id, count=count, more=more))

    @property
    def client_id(self) -> str | None:
        return self.session.client_id

    def __repr__(self) -> str:
        return f"<subscription {self.sub_id} of {self.session.client_id}>"


class _ScopeCheck:
    """The receive filter of a pattern-code subscription: the rules in force, and the
    scope its pattern runs with still theirs; otherwise the subscription ends."""

    __slots__ = ("session", "sub", "gate", "receives", "ended")

    def __init__(
        self,
        session: ClientSession,
        sub: SessionSubscriber,
        gate: Any,
        receives: Callable[[str | None], bool],
    ) -> None:
        self.session, self.sub, self.gate, self.receives = session, sub, gate, receives
        self.ended = False

    def __call__(self, type_: str | None) -> bool:
        if self.ended:
            return False
        rules = self.gate.rules_for(self.session.identity)
        scope = None if rules is None or rules.subscribe_any else rules.subscribe
        if rules is None or scope != self.sub.scope:
            self.ended = True
            asyncio.get_running_loop().call_soon(self.session.scope_changed, self.sub)
            return False
        return self.receives(type_)


class ClientSession(asyncio.Protocol):
    """Router side of one client connection."""

    def __init__(self, router: SessionHost) -> None:
        self.router = router  # what it asks of its router, and only that
        self.counters = router.counters
        self._batch = router.deliveries
        self.codec = Connection(max_items=MAX_FRAME_ITEMS)
        #: Reads the usual publish frame of `codec` with compiled code, where it is built.
        self._publishes = PublishReader(self.codec)
        self.transport: asyncio.Transport | None = None
        self.client_id: str | None = None
        #: The prefix of the event ids this client may propose as they are (`aa.mesh.id_scope`).
        self.id_scope: str | None = None
        self.name: str | None = None
        self.address = "?"
        self.host = "?"
        #: Who is calling: the user of a verified certificate, or anonymous (`aa.router.security`).
        self.identity = _ANONYMOUS
        self.subscriptions: dict[int, SessionSubscriber] = {}
        self.phase = _HELLO
        self.reading = _IDLE
        self.writing = _FLOWING
        #: Deliveries of this batch not yet written, ((sub_ids), event) each (the tuple of
        #: ids is its subscription's own, `SessionSubscriber.ids`, unless one event goes to
        #: several of them: `_also`), and the ack to write after them (`ack`): the session is
        #: queued with the batch while there are any.
        self._pending: list[_Pending] = []
        self._ack: int | None = None
        #: Deliveries dropped for a subscription and not yet told (`Missed`, on the drain or
        #: before the next delivery).
        self.untold = 0
        self.closed = asyncio.get_running_loop().create_future()
        self.dropped = 0  # deliveries dropped because this client did not keep up
        #: Monotonic time the connection was made; events it published (counted per frame)
        #: and deliveries written to it (per flush): for ``/clients/live``.
        self.connected_at = time.monotonic()
        self.events_in = 0
        self.events_out = 0
        #: Done when the transport drains while `writing` is not `FLOWING` (bulk senders wait).
        self._writable: asyncio.Future[None] | None = None
        self._cut: asyncio.TimerHandle | None = None  # aborts a closed connection that never drains
        #: Refusals it may still have (`MAX_REFUSALS`) as of `_refused_at` (monotonic seconds).
        self._refusals_left = float(MAX_REFUSALS)
        self._refused_at = 0.0

    # -- the state machines ----------------------------------------------------------------

    def _enter(self, phase: Phase) -> None:
        if phase not in PHASE_MOVES[self.phase]:
            raise UsageError(f"a session cannot go from {self.phase.value} to {phase.value}")
        self.phase = phase

    def _read(self, reading: Reading) -> None:
        if reading not in READING_MOVES[self.reading]:
            raise UsageError(
                f"a session's reading cannot go from {self.reading.value} to {reading.value}"
            )
        self.reading = reading

    def _write(self, writing: Writing) -> None:
        if writing not in WRITING_MOVES[self.writing]:
            raise UsageError(
                f"a session's writing cannot go from {self.writing.value} to {writing.value}"
            )
        self.writing = writing

    @property
    def backlog(self) -> int:
        """Bytes written to this client and not yet taken by it."""
        return self.transport.get_write_buffer_size() if self.transport is not None else 0

    @property
    def is_open(self) -> bool:
        """Whether the connection still takes frames (not closing, not handed over)."""
        return self.phase in _LIVE

    @property
    def shedding(self) -> bool:
        """Over its bound while its transport is paused: its deliveries are dropped (and
        counted) without being queued or encoded, until the transport drains."""
        return self.writing is _SHEDDING

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream server's protocol is always given a stream transport
        self.transport = cast(asyncio.Transport, transport)
        high = min(HIGH_WATER, self.router.limits.max_session_backlog)
        self.transport.set_write_buffer_limits(high=high, low=high // 4)
        peer = transport.get_extra_info("peername")
        if peer:
            self.address = f"{peer[0]}:{peer[1]}"
            self.host = peer[0]
        gate = self.router.security
        if gate.server_tls is not None:
            self.identity = gate.identity(transport)
        self.router.session_opened(self)

    def data_received(self, data: bytes) -> None:
        if self.phase not in _LIVE:
            return
        self.codec.receive_data(data)
        if self.reading is not _PAUSED:
            self._process()

    def _process(self) -> None:
        """Handle the whole frames buffered; after a big publish or a long turn, the rest waits."""
        self._read(_HANDLING)
        start = time.perf_counter()
        next_publish, next_message = self._publishes.next_publish, self.codec.next_message
        try:
            while True:
                msg = next_publish() or next_message(stepwise=True)
                if msg is IN_PROGRESS:  # a step of a large frame
                    if time.perf_counter() - start > TURN_BUDGET:  # the rest on the next turn
                        self._next_turn()
                        break
                    continue
                if not isinstance(msg, Message):
                    break
                if type(msg) is Publish and self.phase is _OPEN and len(msg.events) > DISPATCH_STEP:
                    # reading waits until it is dispatched, across turns if need be
                    self._pause_reading()
                    self._publish(msg, until=start + TURN_BUDGET, done=self._next_turn)
                    return
                self.handle(msg)
                if self.phase not in _LIVE:
                    break
                if time.perf_counter() - start > TURN_BUDGET:  # the rest on the next turn
                    self._next_turn()
                    break
        except ProtocolError as exc:
            log.info(
                "closing %s (%s): %s",
                self.client_id or self.address,
                exc.code,
                exc,
                extra=self.log_fields(),
            )
            self.fail(exc.code, str(exc))
        finally:
            self._read(_IDLE if self.reading is _HANDLING else _PAUSED)
            self._batch.flush()
        frames = self.router.partial_frames
        if self.phase in _LIVE and not frames.hold(self, self.codec.buffered):
            log.warning(
                "closing %s: %d bytes of an unfinished frame while the router holds %d for all",
                self.client_id or self.address,
                self.codec.buffered,
                frames.total,
                extra=self.log_fields(),
            )
            self.counters["busy_closed"] += 1
            self.fail(
                "busy",
                "the router holds too many partly received frames; send smaller frames or retry",
            )

    def _pause_reading(self) -> None:
        """Read no more until `_resume`: inside `_process`, YIELDING; after it, PAUSED."""
        self._read(_YIELDING if self.reading in _IN_PROCESS else _PAUSED)
        self.transport.pause_reading() if self.transport is not None else None

    def _next_turn(self) -> None:
        """Pause reading; handle the rest on the next turn of the loop."""
        self._pause_reading()
        asyncio.get_running_loop().call_soon(self._resume)

    def _resume(self) -> None:
        self._read(_IDLE)
        if self.phase not in _LIVE:
            return
        if self.transport is not None:
            self.transport.resume_reading()
        self._process()

    def connection_lost(self, exc: Exception | None) -> None:
        self._enter(_CLOSED)
        if self._cut is not None:
            self._cut.cancel()  # lets the transport go now, not after the grace
        heavy = self._writable is not None or self.dropped
        self.router.session_closed(self)
        if not self.closed.done():
            self.closed.set_result(None)
        self.resume_writing()
        self.transport = None  # uvloop's refers to us: its unread buffers waited for a collection
        if heavy:
            give_back()  # megabytes of buffers freed (`aa.router.memory`)

    def pause_writing(self) -> None:
        if self.writing is _FLOWING:
            self._write(_FULL)
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self.writing is not _FLOWING:
            self._write(_FLOWING)
        fut, self._writable = self._writable, None
        if fut is not None and not fut.done():
            fut.set_result(None)
        if self.untold and self.phase in _LIVE and self.transport is not None:
            # Told now, on the drain, not before a next delivery that may never come.
            self._tell_missed()

    async def drained(self) -> None:
        """Return once the transport takes more data (at once unless `DRAIN_ABOVE` bytes wait):
        bulk senders (history replay) pace themselves with it, bounding the router's memory."""
        transport = self.transport
        if (
            self._writable is not None
            and transport is not None
            and transport.get_write_buffer_size()
            > min(DRAIN_ABOVE, self.router.limits.max_session_backlog // 2)
        ):
            await asyncio.shield(self._writable)

    # -- handling ---------------------------------------------------------------------------

    def handle(self, msg: Message) -> None:
        if self.phase is _HELLO:
            if type(msg) is Hello:
                self._hello(msg)
                return
            if self.router.serve(self, msg):
                return
            raise ProtocolError(f"expected 'hello' first, got {msg.kind!r}")
        # Class patterns are isinstance checks in order (no message kind has subclasses):
        # the event path's kind first.
        match msg:
            case Publish():  # `_publish`, inlined on the event path
                self.events_in += len(msg.events)
                self.router.accept_publish(self, msg.seq, self.permitted(msg.events))
            case Subscribe():
                self._subscribe(msg)
            case Unsubscribe():
                sub = self.subscriptions.pop(msg.sub_id, None)
                if sub is not None:
                    self.router.remove_subscription(sub)
            case Update():
                self._update(msg)
            case Ping():
                self.send(Pong(token=msg.token))
            case Bye():
                self.close()
            case Hello():  # not the router's to answer again (`serve` welcomes)
                raise ProtocolError(f"a client may not send {msg.kind!r}")
            case Quench():
                # The answer tells where subscribers of the type are: only for types the
                # user may send.
                if self._may("quench", "register quench prototypes", msg.reg) and self._may(
                    "publish",
                    f"quench events of type {msg.type!r}",
                    msg.reg,
                    lambda rules: rules.may_publish(msg.type),
                ):
                    self.router.serve(self, msg)
            case GetCached():
                if not self._pattern_refused(msg.pattern, msg.req):
                    self.router.serve(self, msg)
            case (
                CacheRegister()
                | CacheFetch()
                | CacheAck()
                | CacheKeepalive()
                | CachePolicy()
                | CacheClear()
                | CacheRemove()
                | GetCacheInfo()
            ):
                if self._may("client_caches", "own client caches", msg.req) and not (
                    type(msg) is CacheRegister and self._pattern_refused(msg.pattern, msg.req)
                ):
                    self.router.serve(self, msg)
            case _:  # questions about the mesh, an unquench: the router answers
                if not self.router.serve(self, msg):
                    raise ProtocolError(f"a client may not send {msg.kind!r}")

    def _publish(
        self, msg: Publish, *, until: float | None = None, done: Callable[[], None] | None = None
    ) -> None:
        """Hand the router the events of *msg* this client's user may publish."""
        self.events_in += len(msg.events)
        events = self.permitted(msg.events)  # what the user may not publish is refused
        self.router.accept_publish(self, msg.seq, events, until=until, done=done)

    def refuse(self, error: Error, now: float | None = None) -> None:
        """Tell the client a request of its was refused (*error*); past `MAX_REFUSALS` in a
        row (earning `REFUSALS_EARNED` a second back), close the connection saying why.
        *now*: monotonic seconds (default: the clock's now)."""
        now = time.monotonic() if now is None else now
        left = self._refusals_left + (now - self._refused_at) * REFUSALS_EARNED
        self._refusals_left = min(float(MAX_REFUSALS), left) - 1.0
        self._refused_at = now
        if self._refusals_left >= 0.0:
            self.send(error)
            return
        self.counters["refused_too_often"] += 1
        # Its address is held back at the port (`RefusalBudget.hold`): a client that
        # reconnects at once would cost a handshake and its subscriptions again, each time.
        self.router.security.strangers.hold(self.host, now)
        log.info(
            "closing %s: %d requests refused in a row, the last: %s",
            self.client_id or self.address,
            MAX_REFUSALS,
            error.message,
            extra=self.log_fields(),
        )
        self.fail(
            "refused-too-often",
            f"closing this connection: {MAX_REFUSALS} requests refused in a row "
            f"(the last: {error.code}: {error.message})",
        )

    def _may(
        self, rule: str, what: str, ref: int, allows: Callable[[Rules], bool] | None = None
    ) -> bool:
        """Whether this client's user may do *what* (permission *rule*, or *allows* of the
        user's rules where the rule is a list); tells it why not."""
        gate = self.router.security
        rules = gate.rules_for(self.identity)
        if rules is not None and (getattr(rules, rule) if allows is None else allows(rules)):
            return True
        reason = rules.refusal(rule, what) if rules is not None else None
        self.refuse(
            Error(
                code="permission-denied", message=gate.denial(self.identity, rules, reason), ref=ref
            )
        )
        return False

    def _pattern_refused(self, spec: PatternSpec, ref: int, tier: str | None = None) -> bool:
        """Whether this user may not run *spec* (told why, naming the rule); *tier* is
        *spec*'s tier when the caller has it already."""
        gate = self.router.security
        rules = gate.rules_for(self.identity)
        refusal = None
        if rules is not None:
            refusal = rules.pattern_refusal(spec, tier or self.router.tier(spec))
        if rules is not None and refusal is None:
            return False
        message = gate.denial(self.identity, rules, refusal)
        self.refuse(Error(code="permission-denied", message=message, ref=ref))
        return True

    def permitted(self, events: Sequence[Event]) -> Sequence[Event]:
        """The events this client's user may publish; the rest refused once per frame, by rule."""
        gate = self.router.security
        rules = gate.rules_for(self.identity)
        if rules is not None and rules.publish_any and rules.persist:
            return events
        allowed, reason = gate.screen(rules, events, "persist")
        if reason is not None:
            self.counters["refused_permission"] += len(events) - len(allowed)
            self.refuse(
                Error(
                    code="permission-denied",
                    message=f"{len(events) - len(allowed)} event(s) refused: "
                    + gate.denial(self.identity, rules, reason),
                )
            )
        return allowed

    def _hello(self, msg: Hello) -> None:
        gate = self.router.security
        refusal = gate.admit_client(self.identity, self.host)
        if refusal is not None:
            gate.refusals.note(
                self.host,
                f"refusing client {msg.client_id} from {self.address}: {refusal}",
                time.monotonic(),
                logging.INFO,
            )
            self.fail("forbidden", refusal)
            return
        self.client_id = msg.client_id
        self.name = msg.name
        # The client's own scope when it proves it holds the secret; a scope of this
        # connection alone otherwise (its retries are then recognised on this router only).
        self.id_scope = id_scope(msg.secret if msg.secret is not None else os.urandom(16).hex())
        self._enter(_OPEN)
        self.router.serve(self, msg)  # the welcome

    def _subscribe(self, msg: Subscribe) -> None:
        if msg.sub_id in self.subscriptions:
            self.refuse(
                Error(code="duplicate", message=f"sub_id {msg.sub_id} is in use", ref=msg.sub_id)
            )
            return
        limit = self.router.limits.max_subscriptions_per_client
        if len(self.subscriptions) >= limit:
            self.refuse(
                Error(
                    code="limit",
                    message=f"at most {limit} subscriptions per client",
                    ref=msg.sub_id,
                )
            )
            return
        # Worked out once: refused users (no rules) do not pay for it.
        allowed = self.router.security.rules_for(self.identity) is not None
        tier = self.router.tier(msg.pattern) if allowed else None
        if self._pattern_refused(msg.pattern, msg.sub_id, tier):
            return
        # The types its user may receive, by the rules in force at each event.
        gate = self.router.security
        receives = gate.receive_filter(self.identity)
        sub = SessionSubscriber(self, msg.sub_id, receives, msg.overflow, msg.pattern)
        rules = gate.rules_for(self.identity)
        if receives is not None and rules is not None and not rules.subscribe_any:
            sub.scope = rules.subscribe  # pattern code runs over these types only
        if receives is not None and tier != PREDICATE_TIER:
            # Pattern code saw events by the scope of its subscribe: when the rules change
            # it, the subscription ends at its next event (subscribing again takes the new).
            sub.receives = _ScopeCheck(self, sub, gate, receives)
        try:
            self.router.add_subscription(sub, msg.pattern, msg.params, msg.history)
        except (PatternError, UsageError) as exc:
            code = getattr(exc, "code", "pattern-refused")
            self.refuse(Error(code=code, message=str(exc), ref=msg.sub_id))
            return
        self.subscriptions[msg.sub_id] = sub
        self.send(
            Subscribed(
                sub_id=msg.sub_id,
                **self.router.subscription_notes(msg.pattern, msg.params, msg.history),
            )
        )
        away = None if msg.away is None else (msg.away, sub.missed_away)  # after a lost router
        self.router.subscription_added(sub, msg.history, away)

    def _update(self, msg: Update) -> None:
        sub = self.subscriptions.get(msg.sub_id)
        if sub is None:
            self.send(
                Error(
                    code="unknown-subscription",
                    message=f"no subscription {msg.sub_id}",
                    ref=msg.sub_id,
                )
            )
            return
        try:
            self.router.update_subscription(sub, msg.params)
        except (PatternError, UsageError) as exc:
            self.send(
                Error(code=getattr(exc, "code", "bad-params"), message=str(exc), ref=msg.sub_id)
            )
            return
        self.send(Updated(sub_id=msg.sub_id))

    # -- writing ----------------------------------------------------------------------------

    def send(self, msg: Message) -> None:
        """Write one control frame now (after any queued deliveries, to keep order)."""
        if self.transport is None or self.phase not in _LIVE:
            return
        if self._pending or self._ack is not None:
            self.flush()
        self.transport.write(self.codec.send(msg))

    def queue_delivery(self, sub_id: int, event: Event) -> None:
        """Queue *event* for subscription *sub_id*, written at the batch's flush
        (`SessionSubscriber.deliver` does the same inline)."""
        pending = self._pending
        if pending:
            last = pending[-1]
            if last[1] is event:  # same event, another of our subscriptions
                _also(pending, last, sub_id)
                return
        elif self._ack is None:  # the first thing this batch writes to us
            self._batch.queued(self)
        pending.append(((sub_id,), event))

    def flush(self) -> None:
        """Write queued deliveries as one frame (or several, if one is too large), then the ack."""
        self._flush_deliveries()
        seq, self._ack = self._ack, None
        if seq is not None and self.transport is not None and self.phase in _LIVE:
            self.transport.write(self.codec.send(Ack(seq=seq)))

    def _flush_deliveries(self) -> None:
        pending, self._pending = self._pending, []
        if not pending or self.transport is None or self.phase not in _LIVE:
            return
        if (
            self.writing is _SHEDDING
            or self.transport.get_write_buffer_size() > self.router.limits.max_session_backlog
        ):
            self._overflow(pending)
            return
        if self.untold:
            self._tell_missed()
        try:
            self.transport.write(self.codec.send_deliver(pending))  # each event packed once for all
            self.events_out += len(pending)
            self.counters["delivered"] += len(pending)
        except UsageError:  # over the frame cap: split and retry
            if len(pending) == 1:
                log.warning(
                    "dropping an event too large to deliver to %s",
                    self.client_id,
                    extra={**self.log_fields(), "event_id": getattr(pending[0][1], "id", None)},
                )
                return
            half = len(pending) // 2
            for part in (pending[:half], pending[half:]):
                self._pending = part
                self._flush_deliveries()

    def _overflow(self, pending: list[_Pending]) -> None:
        """The client does not read: drop these, then tell it (`Missed`) or close, per
        subscription. While its transport is paused, later deliveries are dropped as they
        come (`shedding`) until it drains; a transport that is not paused (a bound under its
        high-water mark) drains without telling, so its drops are told at the next flush."""
        if self.writing is _FULL:
            self._write(_SHEDDING)
        self.dropped += len(pending)
        self.counters["dropped_slow"] += len(pending)
        subs = self.subscriptions
        for sub_ids, _event in pending:
            for sid in sub_ids:
                sub = subs.get(sid)
                if sub is None:
                    continue
                if sub.overflow == "disconnect":
                    log.info(
                        "closing %s: it does not read its deliveries (overflow=disconnect)",
                        self.client_id,
                        extra=self.log_fields(),
                    )
                    self.fail(
                        "overflow",
                        f"subscription {sid} asked to be disconnected rather than miss events, "
                        f"and this client did not read fast enough: {self.dropped} events dropped",
                    )
                    return
                sub.missed += 1
                self.untold += 1

    def _tell_missed(self) -> None:
        self.untold = 0
        transport = self.transport
        assert transport is not None  # only a flush with a transport tells
        for sub in self.subscriptions.values():
            if sub.missed:
                n, sub.missed = sub.missed, 0
                transport.write(self.codec.send(Missed(sub_id=sub.sub_id, count=n)))

    def ack(self, seq: int) -> None:
        """Acknowledge frames up to *seq*; while frames are handled, once at the batch's end."""
        if self.reading not in _IN_PROCESS or self.phase not in _LIVE:
            self.send(Ack(seq=seq))
            return
        if not self._pending and self._ack is None:
            self._batch.queued(self)
        self._ack = seq  # cumulative: one ack (one wake-up of the client) per read, not per frame

    def scope_changed(self, sub: SessionSubscriber) -> None:
        """The permissions changed what *sub*'s pattern code may see: end it, saying why."""
        if self.subscriptions.get(sub.sub_id) is not sub:
            return
        self.router.remove_subscription(sub)
        self.pattern_failed(
            sub.sub_id,
            "permission-denied",
            "the permissions changed the event types this pattern may see: subscribe again",
        )

    def pattern_failed(self, sub_id: int, code: str, message: str) -> None:
        if self.subscriptions.pop(sub_id, None) is not None:
            self.send(PatternFailed(sub_id=sub_id, code=code, message=message))

    def fail(self, code: str, message: str) -> None:
        """Tell the client why, then close this connection (and only this one). What the
        client is still sending (the rest of a refused frame) is read and dropped for up to
        `LINGER` seconds after our end is shut: closed at once, the kernel would answer it
        with a reset that can destroy the error before the client reads it."""
        self.send(Error(code=code, message=message, fatal=True))
        transport = self.transport
        if transport is None or self.phase not in _LIVE or not transport.can_write_eof():
            self.close()
            return
        self.flush()
        self._enter(_CLOSING)
        self.codec = Connection(max_items=MAX_FRAME_ITEMS)  # what it held is let go at once
        self._publishes = PublishReader(self.codec)
        self.router.partial_frames.hold(self, 0)
        transport.write_eof()
        transport.resume_reading()
        asyncio.get_running_loop().call_later(LINGER, transport.close)
        self._cut_later(transport)

    def detach(self) -> tuple[asyncio.Transport, Connection]:
        """Give the connection up to another protocol (a peer called): stop handling frames,
        leave the router's sessions, return the transport and the codec (it may hold frames)."""
        transport = self.transport
        if transport is None or self.phase is not _HELLO:
            raise UsageError("only a session not yet a client's can be detached")
        self._enter(_HANDED_OVER)
        self.transport = None
        self.router.session_closed(self)
        if not self.closed.done():
            self.closed.set_result(None)
        return transport, self.codec

    def close(self) -> None:
        if self.transport is not None and self.phase in _LIVE:
            self.flush()
            self._enter(_CLOSING)
            self.transport.close()
            self._cut_later(self.transport)

    def _cut_later(self, transport: asyncio.Transport) -> None:
        """Abort *transport* after `CLOSE_GRACE` unless its connection is lost by then."""
        self._cut = asyncio.get_running_loop().call_later(CLOSE_GRACE, transport.abort)

    # -- after a reload of the rules or the revocation list -----------------------------------

    def recheck(self) -> None:
        """Hold this live session to the rules and the revocation list in force now (after
        SIGHUP, a changed CRL): a revoked certificate or a client no longer admitted is told
        why, its subscriptions stopped, and closed; a subscription whose pattern its user may
        no longer register is stopped with the rule's reason (`PatternFailed`, which ends
        ``aa subscribe`` with that line)."""
        if self.phase not in _LIVE:
            return
        gate = self.router.security
        user = self.identity.user
        revoked = gate.certificate_refusal(self.identity)
        if revoked is not None:
            self.end("revoked", revoked)
            return
        if self.client_id is None:
            return  # not a client yet: its hello meets the rules in force
        refusal = gate.admit_client(self.identity, self.host)
        if refusal is not None:
            self.end("forbidden", refusal)
            return
        rules = gate.rules_for(self.identity)
        for sub_id, sub in list(self.subscriptions.items()):
            spec = sub.pattern
            if spec is None:
                continue
            why = (
                rules.pattern_refusal(spec, self.router.tier(spec))
                if rules is not None
                else "not allowed to subscribe (no rule covers this user)"
            )
            if why is not None:
                self.stop_subscription(sub_id, "permission-denied", f"user {user!r} is {why}")

    def log_fields(self) -> dict[str, str | None]:
        """Who this session is, for a structured log line (``extra=``)."""
        return {"client_id": self.client_id, "user": self.identity.user, "address": self.address}

    def stop_subscription(self, sub_id: int, code: str, message: str) -> None:
        """Stop subscription *sub_id* from the router's side, telling the client why."""
        sub = self.subscriptions.pop(sub_id, None)
        if sub is None:
            return
        self.router.remove_subscription(sub)
        log.info(
            "stopping subscription %d of %s: %s",
            sub_id,
            self.client_id,
            message,
            extra=self.log_fields(),
        )
        self.send(PatternFailed(sub_id=sub_id, code=code, message=message))

    def end(self, code: str, message: str) -> None:
        """Close the session, telling the client why: on each of its subscriptions when it
        has any (that ends them, and ``aa subscribe`` with one line), else in an error frame
        (a second copy of the reason would be a second line of a client's log). Its next
        attempt to connect is refused with the reason too."""
        log.warning(
            "closing %s (%s): %s",
            self.client_id or self.address,
            code,
            message,
            extra=self.log_fields(),
        )
        if not self.subscriptions:
            self.fail(code, message)
            return
        for sub_id in list(self.subscriptions):
            self.stop_subscription(sub_id, code, message)
        self.close()
