"""The small interfaces the router's rooms are given instead of the whole `Router`.

A room (peer links, quenching, the store, the caches, the event log, the patterns) is
handed only what it uses: something to dispatch events into, a way to reach one client,
a clock. The `Router` composes the rooms and is the one object that implements these;
tests can hand a room a small fake instead. Nothing here holds state.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any, Protocol

from aa.mesh import Control, Event
from aa.mesh.protocol import Message

__all__ = [
    "Clock",
    "Sink",
    "Dispatch",
    "Controls",
    "ClientPort",
    "Subscriber",
    "SubscriptionHost",
    "RouterFacts",
]

#: Monotonic seconds (`time.monotonic`); every deadline of a room is measured with one.
Clock = Callable[[], float]

#: Called with each event dispatched on this router (store, caches, event log).
Sink = Callable[[Event], None]


class Dispatch(Protocol):
    """Where a room hands events it received from elsewhere (a peer's flood)."""

    def dispatch(self, event: Event) -> None:
        """Deliver *event* to local subscribers and sinks: once per router per event."""

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

    def subscription_added(self, key: Hashable, history: Mapping[str, Any] | None) -> None: ...

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
