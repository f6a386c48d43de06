"""The router-to-router messages (pure: no I/O).

Registered with `aa.mesh.protocol.messages.register`, so the frame codec decodes them like any other
kind. A router connection is told apart from a client connection by its first frame
(`PeerHello` instead of `Hello`).

Router ⇄ router conversation::

    router A                        router B
    PeerHello ───────────────────►             each side sends one first; a router that meets
              ◄─────────────────── PeerHello   its own id closes (it dialled itself)
    Flood([group, ...]) ─────────►             either way, any time: batches of events
    Control(id, ttl, path, …) ───►             either way: mesh-wide control messages
    PeerRouters([...]) ──────────►             either way, now and then: routers we know
    Ping / Pong, Bye                           as between client and router

`Control` carries its ttl and path as fields; flooded events carry theirs in the header of
their group (below). Both follow `aa.mesh.flood.FloodRules`.

How events are flooded: groups with an opaque blob
---------------------------------------------------
A `Flood` frame is ``{"kind": "flood", "groups": [[ttl, path, ids, blob], ...]}``; a group
that goes round a congested link has a fifth element, the routers it is for
(`FloodGroup.to`, `aa.mesh.detour`), and is sent only to a peer whose hello has
``"detours": true``. A group
(`FloodGroup`) is events that share a ttl and a path: ``ids`` lists their event ids, in
order, and ``blob`` is one msgpack ``bin`` holding the array of their wire arrays
(``[id, type, values, meta]``, `aa.mesh.protocol.messages.event_to_wire`), packed once with the
codec's conventions (`aa.mesh.protocol.codec.pack`). Why this shape (the eight-router ring of
``tests/bench/bench_ring.py`` measures it):

- **Relaying costs no encoding.** A router forwards a group it received, when every event
  in it was new here, as the *same blob bytes* under a new header (its hop's ttl and path).
  Re-encoding each event for every link would be the biggest single cost of a relaying router.
  Events that originate here are packed once per flush into one blob that every link
  shares, not once per link.
- **Duplicates cost no decoding.** The ids are outside the blob, so a router checks them
  against its seen-id set first and drops a group whose every id it has seen *without
  unpacking the blob* (`aa.mesh.flood`, rule 1). In a ring every event arrives twice at
  the routers where the two fronts meet; in a full mesh of n routers, n-1 times at each.
- **One ttl and path per group**, not per event: the flooding rules (`FloodRules`) run
  once per group for the path and the ttl, and once per event only for the seen-id check.

What is authoritative. The group header's ttl and path are; the ttl and path inside each
event's ``meta`` in the blob are *not* (they are what the origin stamped, and go stale
after the first hop since relays do not rewrite the blob). A receiver therefore sets
``meta["ttl"]`` and ``meta["path"]`` from its own hop (`FloodGroup.decode`), so
subscribers see them as if every router had rewritten them. The ids in the header must
equal the blob's event ids exactly, in order: a receiver that decodes the blob checks this,
and a mismatch makes the frame malformed (the peer broke the protocol; its link is closed).
A receiver that drops a group unread never learns whether its blob was sound; that is
harmless, since it neither dispatches nor forwards anything from it.

Validation happens in two steps. Decoding a frame (`Flood.from_wire`) checks the structure
(ttl, path, ids and that the blob is bytes: everything the dedup decision reads), so a
malformed header closes the link before anything is acted on. The blob is checked lazily,
by `FloodGroup.decode`, only when a router needs the events — and before it records their
ids as seen (`aa.router.links.meshservice`), so a bad blob marks nothing and the same events
arriving intact by another route are still dispatched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ..endpoints import check_endpoint
from ..errors import InvalidValue, MalformedFrame, UsageError
from ..event import MAX_ID_LENGTH, Event
from ..flood import MAX_PATH_LENGTH, check_flood_meta
from ..values import Values, check_values
from .codec import pack, pack_events, unpack
from .messages import Message, register, unchecked
from .wire_events import flood_events

__all__ = [
    "KnownRouter",
    "PeerHello",
    "Flood",
    "FloodGroup",
    "PeerRouters",
    "Control",
    "MAX_KNOWN_ROUTERS",
    "MAX_TOPIC_LENGTH",
    "MAX_NAME_LENGTH",
    "MAX_GROUP_EVENTS",
    "MAX_GROUP_TO",
    "MESH_PROTOCOL_VERSION",
]

#: The version of the router-to-router protocol, told in `PeerHello`. 2: events flood in
#: groups around an opaque blob (`FloodGroup`); 1 flooded them one by one. Routers of two
#: versions cannot relay each other's floods, so a router closes a link whose hello names
#: another version, saying why (both ways: a version-1 router checks the same field), rather
#: than meet a frame it cannot read. Clients and discovery beacons speak
#: `aa.mesh.protocol.messages.PROTOCOL_VERSION`, which is unchanged.
MESH_PROTOCOL_VERSION: Final = 2
#: Most routers in one hello or router list, in routers. Å meshes are tens of routers; the
#: receiver's peer table is capped anyway (`aa.mesh.peers.MAX_PEERS`).
MAX_KNOWN_ROUTERS: Final = 256
#: Longest control topic, in characters ("quench.prototype", "cache.register", …).
MAX_TOPIC_LENGTH: Final = 64
#: Longest router name, in characters (names are for people: pictures, `aa mesh`).
MAX_NAME_LENGTH: Final = 128
#: Most seconds between keep-alives a peer may say it waits (an hour).
_MAX_KEEPALIVE: Final = 3600.0
#: Most events in one flood group, in events. Bounds the ids a receiver checks before it
#: may drop a group, and the events one bad blob can hold up. A router's batches are a
#: client frame's worth (a thousand or so at full speed); larger ones are cut into groups
#: of this size when packed, and a group is never merged with another, so a router never
#: has to re-encode a received group to obey the cap.
MAX_GROUP_EVENTS: Final = 8192
#: Most routers a directed group names (`FloodGroup.to`), in router ids. A detour is taken
#: only toward a known, small set of routers; past it the router keeps the congested link.
MAX_GROUP_TO: Final = 256


def _id(value: Any, name: str, optional: bool = False) -> None:
    if value is None and optional:
        return
    if type(value) is not str or not 0 < len(value) <= MAX_ID_LENGTH:
        raise InvalidValue(f"{name} must be a str of 1 to {MAX_ID_LENGTH} characters")


def _name(value: Any, name: str) -> None:
    if value is not None and (type(value) is not str or len(value) > MAX_NAME_LENGTH):
        raise InvalidValue(f"{name} must be a str of at most {MAX_NAME_LENGTH} characters")


def _routers(value: Any) -> tuple[KnownRouter, ...]:
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
    def from_wire(cls, data: Any) -> KnownRouter:
        if type(data) is not dict:
            raise InvalidValue("a known router must be a map")
        return cls(
            peer=unchecked(data, "peer"),
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
    protocol: int = MESH_PROTOCOL_VERSION
    #: Routers the sender knows (so a new router learns the mesh in one round).
    routers: tuple[KnownRouter, ...] = ()
    #: Seconds between the sender's keep-alives on a quiet link (None: not said, from a
    #: router before this field): the receiver waits three of them, or of its own if longer,
    #: before it calls the link dead, so routers with different settings do not cut links
    #: that are alive.
    keepalive: float | None = None
    #: Whether the sender reads directed flood groups (`FloodGroup.to`): only such a peer is
    #: sent one. An older router ignores the field, and is never sent one.
    detours: bool = False

    def __post_init__(self) -> None:
        _id(self.router_id, "router_id")
        if type(self.detours) is not bool:
            raise InvalidValue("detours must be true or false")
        _name(self.name, "name")
        if self.keepalive is not None:
            k = self.keepalive
            if type(k) not in (int, float) or not 0 < k <= _MAX_KEEPALIVE:
                raise InvalidValue(
                    f"keepalive must be a number of seconds in (0, {_MAX_KEEPALIVE}]"
                )
            object.__setattr__(self, "keepalive", float(k))
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
            **({} if self.keepalive is None else {"keepalive": self.keepalive}),
            **({"detours": True} if self.detours else {}),
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


def _group_to(to: Any) -> None:
    if type(to) is not list and type(to) is not tuple:
        raise InvalidValue("a flood group's 'to' must be a list")
    if len(to) > MAX_GROUP_TO:
        raise InvalidValue(f"a flood group's 'to' names at most {MAX_GROUP_TO} routers")
    for r in to:
        if type(r) is not str or not 0 < len(r) <= MAX_ID_LENGTH:
            raise InvalidValue(f"router ids must be str of 1 to {MAX_ID_LENGTH} characters")


def _group_ids(ids: Any) -> None:
    if type(ids) is not list and type(ids) is not tuple:
        raise InvalidValue("flood group ids must be a list")
    if not 0 < len(ids) <= MAX_GROUP_EVENTS:
        raise InvalidValue(f"a flood group holds 1 to {MAX_GROUP_EVENTS} events")
    for i in ids:
        if type(i) is not str or not 0 < len(i) <= MAX_ID_LENGTH:
            raise InvalidValue(f"flood group ids must be str of 1 to {MAX_ID_LENGTH} characters")


@dataclass(frozen=True, slots=True, kw_only=True)
class FloodGroup:
    """Flooded events that share a ttl and a path: their ids, and their encoding as one blob
    (see the module docstring for the form and for what is authoritative).

    >>> g = FloodGroup.encode([Event(values={"T": 1}, id="e1")], ttl=63, path=["r1"])
    >>> g.ids, g.path
    (('e1',), ('r1',))
    >>> [(e.id, e.meta) for e in g.decode(ttl=62, path=["r1", "r2"])]
    [('e1', {'ttl': 62, 'path': ['r1', 'r2']})]

    The constructor checks the header (raises `InvalidValue`), not the blob: `decode` does.
    """

    #: Hops the events may still make from the sender; the receiver counts the one it just
    #: made (`aa.mesh.flood`, rule 3).
    ttl: int
    #: Router ids the events passed, origin first.
    path: tuple[str, ...]
    #: The events' ids, in the blob's order: what a receiver de-duplicates on, unread.
    ids: tuple[str, ...]
    #: msgpack array of the events' wire arrays, as `encode` packs it.
    blob: bytes
    #: Routers this copy is for, when it goes round a congested link (a *directed* copy,
    #: `aa.mesh.detour`); empty for the ordinary copy that the flood and interest rules
    #: route. Sent as a fifth element only when set, and only to a peer whose hello said it
    #: reads it (`PeerHello.detours`).
    to: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        try:
            check_flood_meta(self.ttl, self.path)
        except MalformedFrame as exc:
            raise InvalidValue(str(exc)) from None
        _group_ids(self.ids)
        if type(self.blob) is not bytes:
            raise InvalidValue("a flood group's events must be bytes (a msgpack bin)")
        _set(self, "path", tuple(self.path))
        _set(self, "ids", tuple(self.ids))
        if self.to:
            _group_to(self.to)
            _set(self, "to", tuple(self.to))

    @classmethod
    def trusted(
        cls,
        ttl: int,
        path: Sequence[str],
        ids: tuple[str, ...],
        blob: bytes,
        to: tuple[str, ...] = (),
    ) -> FloodGroup:
        """A group built without checks, for parts already known good (a checked group's ids
        and blob under a hop from `FloodRules`): the relaying hot path."""
        group = object.__new__(cls)
        _set(group, "ttl", ttl)
        _set(group, "path", tuple(path))
        _set(group, "ids", ids)
        _set(group, "blob", blob)
        _set(group, "to", to)
        return group

    @classmethod
    def encode(
        cls,
        events: Sequence[Event],
        *,
        ttl: int,
        path: Sequence[str],
        to: Sequence[str] = (),
    ) -> FloodGroup:
        """Pack *events* (each with an id, each within the value model) into one group.
        Raises `UsageError` if one has no id or cannot be encoded, `InvalidValue` for a bad
        ttl or path or more than `MAX_GROUP_EVENTS` events."""
        ids = [e.id for e in events if e.id is not None]
        if len(ids) != len(events):
            raise UsageError("a flooded event needs an id")
        try:
            blob = pack_events(events)  # each event's own bytes, shared with its deliveries
        except UsageError as exc:
            raise UsageError(f"cannot encode flooded events: {exc}") from None
        return cls(ttl=ttl, path=tuple(path), ids=tuple(ids), blob=blob, to=tuple(to))

    def decode(self, *, ttl: int | None = None, path: list[str] | None = None) -> list[Event]:
        """The events, checked, each with ``meta`` ttl and path set to *ttl* and *path*
        (default: this group's; a receiver passes its hop). Events in one group share the
        *path* list: treat it as read-only.

        Raises `MalformedFrame` unless the blob is an array of well-formed event arrays whose
        ids are exactly `ids`, in order.
        """
        ids = self.ids
        try:
            items = unpack(self.blob)
        except MalformedFrame:
            raise
        except Exception as exc:  # msgpack raises several unrelated types for bad input
            raise MalformedFrame(
                f"bad 'flood' message: a group's events are not valid msgpack: {exc}"
            ) from None
        if type(items) is not list or len(items) != len(ids):
            raise MalformedFrame("bad 'flood' message: a group's events do not match its ids")
        if ttl is None:
            ttl = self.ttl
        hop_path: Any = list(self.path) if path is None else path  # a list of str: a Value
        return flood_events(items, ids, ttl, hop_path)

    def split(self) -> tuple[FloodGroup, FloodGroup]:
        """Two groups holding the first and second half of the events (for a frame that
        would be over the cap). Re-encodes: rare. Raises `UsageError` for a group of one."""
        n = len(self.ids)
        if n < 2:
            raise UsageError("a group of one event cannot be split")
        try:
            items = unpack(self.blob)
        except Exception as exc:
            raise UsageError(f"cannot split a group whose events do not decode: {exc}") from None
        half = n // 2
        return (
            FloodGroup.trusted(self.ttl, self.path, self.ids[:half], pack(items[:half]), self.to),
            FloodGroup.trusted(self.ttl, self.path, self.ids[half:], pack(items[half:]), self.to),
        )

    def to_wire(self) -> list[Any]:
        if self.to:
            return [self.ttl, self.path, self.ids, self.blob, self.to]
        return [self.ttl, self.path, self.ids, self.blob]

    @classmethod
    def from_wire(cls, data: Any) -> FloodGroup:
        if type(data) is not list or not 4 <= len(data) <= 5:
            raise InvalidValue("a flood group must be an array [ttl, path, ids, events(, to)]")
        if len(data) == 5:
            ttl, path, ids, blob, to = data
            if type(to) is not list or not to:
                raise InvalidValue("a flood group's 'to' must be a non-empty list")
            return cls(ttl=ttl, path=path, ids=ids, blob=blob, to=tuple(to))
        ttl, path, ids, blob = data
        return cls(ttl=ttl, path=path, ids=ids, blob=blob)


_set = object.__setattr__


@register("flood")
@dataclass(frozen=True, slots=True, kw_only=True)
class Flood(Message):
    """A batch of flooded events, as groups (`FloodGroup`; the form is in the module
    docstring).

    From a peer, every group's header is checked as the frame is decoded: a ttl, path or id
    that is not one makes the whole frame malformed (the peer broke the protocol; its
    connection is closed). The events themselves are checked by `FloodGroup.decode`, when
    the receiving router needs them.

    >>> Flood(groups=[FloodGroup.encode([Event(values={}, id="e1")], ttl=1,
    path=["r1"])]).event_count 1
    """

    groups: tuple[FloodGroup, ...]

    def __post_init__(self) -> None:
        if type(self.groups) not in (list, tuple):
            raise InvalidValue("groups must be a list")
        for g in self.groups:
            if type(g) is not FloodGroup:
                raise InvalidValue("groups must hold FloodGroup objects")
        _set(self, "groups", tuple(self.groups))

    @property
    def event_count(self) -> int:
        """Events in all groups."""
        return sum(len(g.ids) for g in self.groups)

    def to_wire(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "groups": [
                [g.ttl, g.path, g.ids, g.blob, g.to] if g.to else [g.ttl, g.path, g.ids, g.blob]
                for g in self.groups
            ],
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Flood:
        groups = data.get("groups")
        if type(groups) is not list:
            raise MalformedFrame("bad 'flood' message: groups must be a list")
        try:
            return cls(groups=tuple([FloodGroup.from_wire(g) for g in groups]))
        except InvalidValue as exc:
            raise MalformedFrame(f"bad 'flood' message: {exc}") from None


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

    def forwarded(self, ttl: int, path: list[str] | tuple[str, ...]) -> Control:
        """The copy to forward, with the ttl and path of `FloodRules.receive`'s hop."""
        if len(path) > MAX_PATH_LENGTH:
            raise InvalidValue("path too long")
        return Control(
            id=self.id, ttl=ttl, path=tuple(path), topic=self.topic, body=self.body, to=self.to
        )
