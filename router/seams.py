"""The small interfaces the router's rooms are given instead of the whole `Router`.

A room (peer links, quenching, the store, the caches, the event log, the patterns, a
client's session) is handed only what it uses: something to dispatch events into, a way
to reach one client, a clock. The `Router` composes the rooms and is the one object that
implements these; tests can hand a room a small fake instead. Nothing here holds state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from aa.mesh import Control, Event, PatternSpec
from aa.mesh.protocol import FloodGroup, Message

if TYPE_CHECKING:
    from .security import Gate, Identity, PartialFrames
    from .session import ClientSession

__all__ = [
    "Clock",
    "Sink",
    "Dispatch",
    "Controls",
    "ClientPort",
    "Subscriber",
    "SubscriptionHost",
    "RouterFacts",
    "Flushable",
    "DeliveryBatch",
    "SessionLimits",
    "SessionHost",
]

#: Monotonic seconds (`time.monotonic`); every deadline of a room is measured with one.
Clock = Callable[[], float]

#: Called with each event dispatched on this router (store, caches, event log).
Sink = Callable[[Event], None]

#: Called with the events dispatched on this router, a batch at a time, in order, and the
#: flood group they came in when they are exactly its events at this router's hop (its ttl
#: and path; `Dispatch.dispatch_many`): the bytes they came in, already checked.
BatchSink = Callable[[Sequence[Event], FloodGroup | None], None]


class Dispatch(Protocol):
    """Where a room hands events it received from elsewhere (a peer's flood)."""

    def dispatch(self, event: Event) -> None:
        """Deliver *event* to local subscribers and sinks: once per router per event."""

    def dispatch_many(self, events: list[Event], received: FloodGroup | None = None) -> None:
        """`dispatch` each of *events*, in order (a peer's group: the sinks get them at once).
        *received*: the group they came in, under this router's hop, when *events* are all
        of its events (decoded and checked), for sinks that keep them as bytes."""

    def flush(self) -> None:
        """The batch is handled: write every client's queued deliveries now."""


class Controls(Protocol):
    """The mesh's control messages (`aa.router.links.MeshService`): flooded like events,
    met once per router; `to` names the one client or router a control is for."""

    def on_control(self, topic: str, callback: Callable[[Control], None]) -> Callable[[], None]:
        """Call *callback(control)* for each control of *topic*; returns the undo."""

    def flood_control(
        self, topic: str, body: Mapping[str, Any] | None = None, *, to: str | None = None
    ) -> str:
        """Send a control to every router of the mesh; returns its id."""


class ClientPort(Protocol):
    """What a room may do with one client's connection (a `ClientSession`)."""

    client_id: str | None
    address: str
    #: Who the client proved to be (its certificate's user, or anonymous).
    identity: Identity

    def send(self, msg: Message) -> None:
        """Write one frame to the client (after its queued deliveries)."""

    def ack(self, seq: int) -> None:
        """Acknowledge the client's publish frame *seq* (cumulative)."""

    def fail(self, code: str, message: str) -> None:
        """Tell the client why, then close its connection (only this one)."""

    @property
    def backlog(self) -> int:
        """Bytes written to the client and not yet taken by it (its unread answers)."""


class Subscriber(Hashable, Protocol):
    """The pattern engine's key for one subscription: a TCP client's, or an in-process one."""

    held: Any

    def deliver(self, event: Event) -> None:
        """A matching event (held back while the subscription's history is replayed)."""

    def deliver_now(self, event: Event) -> None:
        """Deliver past any hold (history replay)."""

    def pattern_failed(self, code: str, message: str) -> None:
        """The router stopped the pattern: tell this subscriber why."""

    @property
    def active(self) -> bool:
        """Still subscribed (a replay stops when it is not)."""

    @property
    def client_id(self) -> str | None:
        """The owning client's id, if it has one."""

    async def drained(self) -> None:
        """Wait while the subscriber's connection is congested (bulk senders pace on it)."""


class SubscriptionHost(Protocol):
    """What a client session asks of the router for its subscriptions and publishes."""

    def add_subscription(
        self, key: Hashable, spec: Any, params: Mapping[str, Any], history: Mapping[str, Any] | None
    ) -> None: ...

    def subscription_added(
        self,
        key: Hashable,
        history: Mapping[str, Any] | None,
        away: tuple[float, Callable[[int, bool], None]] | None = None,
    ) -> None:
        """*key* was registered and told so: its history replayed; or, back after *away*
        seconds without a router, ``tell(count, more)`` of the stored events it missed."""

    def remove_subscription(self, key: Hashable) -> None: ...

    def update_subscription(self, key: Hashable, params: Mapping[str, Any]) -> None: ...


class RouterFacts(Protocol):
    """What a room may know of its router: its identity and a summary of its state."""

    @property
    def id(self) -> str: ...

    @property
    def name(self) -> str: ...

    def summary(self) -> dict[str, Any]:
        """Counters and sizes (clients, uptime, dispatched …) for the mesh picture."""


class Flushable(Protocol):
    """A client connection with deliveries queued during a batch (`ClientSession`)."""

    def flush(self) -> None: ...


class DeliveryBatch(Protocol):
    """The batch a client's deliveries wait in: written to once at its end (the dispatcher)."""

    def queued(self, client: Flushable) -> None:
        """*client* has something to write: call its `flush` at the end of the batch."""

    def flush(self) -> None:
        """The batch is handled: write every client's queued deliveries now."""


class SessionLimits(Protocol):
    """The bounds one client connection is held to (`aa.router.RouterConfig`)."""

    @property
    def max_session_backlog(self) -> int:
        """Bytes written to a client and not yet read, above which its deliveries drop."""

    @property
    def max_subscriptions_per_client(self) -> int: ...


class SessionHost(SubscriptionHost, Protocol):
    """What a client session (`aa.router.session.ClientSession`) asks of its router.

    What it is held to: `security` (who is calling and what they may do), `limits`, the
    shared `partial_frames` bound; what it counts in: `counters`; where its deliveries wait:
    `deliveries`. Its life: `session_opened`, `session_closed`. Its frames: publishes go to
    `accept_publish`, subscriptions to the `SubscriptionHost` calls (told `tier` and
    `subscription_notes`), and every frame the session does not handle itself to `serve`
    (the welcome, questions about the mesh, quenching, caches, a peer router calling).
    """

    @property
    def security(self) -> Gate: ...

    @property
    def limits(self) -> SessionLimits: ...

    @property
    def counters(self) -> Counter[str]: ...

    @property
    def partial_frames(self) -> PartialFrames: ...

    @property
    def deliveries(self) -> DeliveryBatch: ...

    def session_opened(self, session: ClientSession) -> None:
        """A connection was made (the admission caps may refuse it at once)."""

    def session_closed(self, session: ClientSession) -> None:
        """Lost or handed over: its subscriptions, acks and partial frames let go."""

    def serve(self, session: ClientSession, msg: Message) -> bool:
        """Answer a frame the session does not handle itself; False: not one a client may
        send (at this point of its connection)."""

    def accept_publish(
        self,
        session: ClientSession,
        seq: int,
        events: Sequence[Event],
        *,
        until: float | None = None,
        done: Callable[[], None] | None = None,
    ) -> None:
        """Dispatch the *events* of publish frame *seq* the client's user may publish, and
        acknowledge the frame when the rule allows (`aa.router.acks`)."""

    def tier(self, spec: PatternSpec) -> str:
        """The tier *spec* runs in (`aa.router.patterns.PREDICATE_TIER` …)."""

    def subscription_notes(
        self,
        spec: PatternSpec,
        params: Mapping[str, Any],
        history: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """What a subscriber is told of its pattern in `Subscribed` (tier, warnings)."""
