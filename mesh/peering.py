"""The router-to-router messages (pure: no I/O).

Registered with `aa.mesh.messages.register`, so the frame codec decodes them like any other
kind. A router connection is told apart from a client connection by its first frame
(`PeerHello` instead of `Hello`).

Router ⇄ router conversation::

    router A                        router B
    PeerHello ───────────────────►             each side sends one first; a router that meets
              ◄─────────────────── PeerHello   its own id closes (it dialled itself)
    Flood([event, ...]) ─────────►             either way, any time: batches of events
    Control(id, ttl, path, …) ───►             either way: mesh-wide control messages
    PeerRouters([...]) ──────────►             either way, now and then: routers we know
    Ping / Pong, Bye                           as between client and router

Flooded events carry their ttl and path in `meta` (`aa.mesh.event.META_TTL`, `META_PATH`);
`Control` carries them as fields. Both follow `aa.mesh.flood.FloodRules`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Mapping

from .endpoints import check_endpoint
from .errors import InvalidValue, MalformedFrame
from .event import MAX_ID_LENGTH, META_PATH, META_TTL, Event
from .flood import MAX_PATH_LENGTH, check_flood_meta
from .messages import PROTOCOL_VERSION, Message, event_from_wire, event_to_wire, register
from .values import Values, check_values

__all__ = [
    "KnownRouter",
    "PeerHello",
    "Flood",
    "PeerRouters",
    "Control",
    "MAX_KNOWN_ROUTERS",
    "MAX_TOPIC_LENGTH",
    "MAX_NAME_LENGTH",
]

#: Most routers in one hello or router list, in routers. Å meshes are tens of routers; the
#: receiver's peer table is capped anyway (`aa.mesh.peers.MAX_PEERS`).
MAX_KNOWN_ROUTERS: Final = 256
#: Longest control topic, in characters ("quench.prototype", "cache.register", …).
MAX_TOPIC_LENGTH: Final = 64
#: Longest router name, in characters (names are for people: pictures, `aa mesh`).
MAX_NAME_LENGTH: Final = 128


def _id(value: Any, name: str, optional: bool = False) -> None:
    if value is None and optional:
        return
    if type(value) is not str or not 0 < len(value) <= MAX_ID_LENGTH:
        raise InvalidValue(f"{name} must be a str of 1 to {MAX_ID_LENGTH} characters")


def _name(value: Any, name: str) -> None:
    if value is not None and (type(value) is not str or len(value) > MAX_NAME_LENGTH):
        raise InvalidValue(f"{name} must be a str of at most {MAX_NAME_LENGTH} characters")


def _routers(value: Any) -> tuple["KnownRouter", ...]:
    if type(value) not in (list, tuple):
        raise InvalidValue("routers must be a list")
    if len(value) > MAX_KNOWN_ROUTERS:
        raise InvalidValue(f"at most {MAX_KNOWN_ROUTERS} routers in one message")
    return tuple(r if type(r) is KnownRouter else KnownRouter.from_wire(r) for r in value)


@dataclass(frozen=True, slots=True, kw_only=True)
class KnownRouter:
    """A router as one router tells another about it."""

    #: Its mesh endpoint, "host:port": where routers dial it.
    peer: str
    #: Its id, when known.
    router_id: str | None = None
    #: Its client endpoint, "host:port", when known: what clients fail over to.
    client: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        check_endpoint(self.peer, "peer")
        _id(self.router_id, "router_id", optional=True)
        if self.client is not None:
            check_endpoint(self.client, "client")
        _name(self.name, "name")

    def to_wire(self) -> dict[str, Any]:
        return {"peer": self.peer, "id": self.router_id, "client": self.client, "name": self.name}

    @classmethod
    def from_wire(cls, data: Any) -> "KnownRouter":
        if type(data) is not dict:
            raise InvalidValue("a known router must be a map")
        return cls(
            peer=data.get("peer"),  # type: ignore[arg-type]  # checked in __post_init__
            router_id=data.get("id"),
            client=data.get("client"),
            name=data.get("name"),
        )


@register("peer-hello")
@dataclass(frozen=True, slots=True, kw_only=True)
class PeerHello(Message):
    """First frame of a router-to-router connection, sent by both sides."""

    router_id: str
    name: str | None = None
    #: Where routers dial the sender ("host:port"); None if it accepts no router connections.
    peer: str | None = None
    #: Where clients connect to the sender ("host:port"), if anywhere.
    client: str | None = None
    protocol: int = PROTOCOL_VERSION
    #: Routers the sender knows (so a new router learns the mesh in one round).
    routers: tuple[KnownRouter, ...] = ()

    def __post_init__(self) -> None:
        _id(self.router_id, "router_id")
        _name(self.name, "name")
        for key in ("peer", "client"):
            if getattr(self, key) is not None:
                check_endpoint(getattr(self, key), key)
        if type(self.protocol) is not int:
            raise InvalidValue("protocol must be an int")
        object.__setattr__(self, "routers", _routers(self.routers))

    def to_wire(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "router_id": self.router_id,
            "name": self.name,
            "peer": self.peer,
            "client": self.client,
            "protocol": self.protocol,
            "routers": [r.to_wire() for r in self.routers],
        }


@register("peer-routers")
@dataclass(frozen=True, slots=True, kw_only=True)
class PeerRouters(Message):
    """Routers the sender knows (Å §4.1: routers "exchange addresses of known routers")."""

    routers: tuple[KnownRouter, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "routers", _routers(self.routers))

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.kind, "routers": [r.to_wire() for r in self.routers]}


@register("flood")
@dataclass(frozen=True, slots=True, kw_only=True)
class Flood(Message):
    """A batch of flooded events. Each has an id, and its ttl and path in `meta`.

    From a peer, every event is checked: a missing id, or a ttl or path that is not one, makes
    the whole frame malformed (the peer broke the protocol; its connection is closed).
    """

    events: tuple[Event, ...]

    def __post_init__(self) -> None:
        if type(self.events) not in (list, tuple):
            raise InvalidValue("events must be a list")
        object.__setattr__(self, "events", tuple(self.events))

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.kind, "events": [event_to_wire(e) for e in self.events]}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> "Flood":
        events = data.get("events")
        if type(events) is not list:
            raise MalformedFrame("bad 'flood' message: events must be a list")
        out = []
        for item in events:
            ev = event_from_wire(item)
            if ev.id is None:
                raise MalformedFrame("bad 'flood' message: a flooded event needs an id")
            meta = ev.meta
            check_flood_meta(meta.get(META_TTL), meta.get(META_PATH))
            out.append(ev)
        return cls(events=tuple(out))


@register("control")
@dataclass(frozen=True, slots=True, kw_only=True)
class Control(Message):
    """A control message flooded to the whole mesh (quench prototypes, client-cache
    registrations, …), with the same de-duplication, ttl and path rules as events.

    `to`, when set, names the one client (or router) it is for: every router forwards it, and
    only the router holding that client's session acts on it.
    """

    #: Globally unique id (from the originating router's id generator).
    id: str
    #: Hops it may still make (see `aa.mesh.flood`).
    ttl: int
    #: Router ids passed, origin first.
    path: tuple[str, ...]
    #: What it is about, e.g. "quench.prototype"; receivers dispatch on it.
    topic: str
    body: Values = field(default_factory=dict)
    to: str | None = None

    def __post_init__(self) -> None:
        _id(self.id, "id")
        if type(self.path) not in (list, tuple):
            raise InvalidValue("path must be a list")
        try:
            check_flood_meta(self.ttl, self.path)
        except MalformedFrame as exc:
            raise InvalidValue(str(exc)) from None
        object.__setattr__(self, "path", tuple(self.path))
        if type(self.topic) is not str or not 0 < len(self.topic) <= MAX_TOPIC_LENGTH:
            raise InvalidValue(f"topic must be a str of 1 to {MAX_TOPIC_LENGTH} characters")
        if type(self.body) is not dict:
            raise InvalidValue("body must be a map")
        check_values(self.body, "body")
        _id(self.to, "to", optional=True)

    def forwarded(self, ttl: int, path: list[str] | tuple[str, ...]) -> "Control":
        """The copy to forward, with the ttl and path of `FloodRules.receive`'s hop."""
        if len(path) > MAX_PATH_LENGTH:
            raise InvalidValue("path too long")
        return Control(id=self.id, ttl=ttl, path=tuple(path), topic=self.topic, body=self.body, to=self.to)
