"""The messages of the wire protocol (pure: no I/O).

Every frame is one msgpack map with a `kind`. Each kind is a frozen, slotted dataclass with a
keyword-only constructor that validates; `to_wire()` gives the map, `from_wire(map)` checks a
peer's map and raises `MalformedFrame` with a clear reason. Other modules add kinds with
`@register` (the router-to-router kinds live beside the flooding rules).

Client ⇄ router conversation::

    client                          router
    Hello ───────────────────────►
          ◄─────────────────────── Welcome
    Publish(seq) ────────────────►              dispatched (and persisted if asked)
          ◄─────────────────────── Ack(seq)      acks are cumulative: all seq ≤ n are done
    Subscribe(sub_id) ───────────►
          ◄─────────────────────── Subscribed(sub_id) | Error(ref=sub_id)
          ◄─────────────────────── Deliver([(sub_ids, event), ...])
    Update(sub_id, params) ──────►              applied between two events: none missed,
          ◄─────────────────────── Updated        none delivered twice
          ◄─────────────────────── PatternRaised(sub_id)   the pattern raised (it goes on)
          ◄─────────────────────── PatternFailed(sub_id)   the sandbox stopped the pattern
    Subscribe(sub_id, away) ─────►              again after a lost router, away so long:
          ◄─────────────────────── MissedAway(sub_id)      stored events it matched meanwhile
    Unsubscribe(sub_id) ─────────►
    Ping / Pong, GetRouters / Routers, Bye   either way as listed
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from dataclasses import Field, dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypeVar

from ..errors import InvalidValue, MalformedFrame, UsageError
from ..event import MAX_ID_LENGTH, Event
from ..values import Values, check_values
from .wire_events import (
    deliver_items,
    event_from_wire,
    event_to_wire,
    events_from_wire_steps,
)

__all__ = [
    "Message",
    "register",
    "MESSAGE_KINDS",
    "PatternSpec",
    "Hello",
    "Welcome",
    "Publish",
    "Ack",
    "Subscribe",
    "Subscribed",
    "Missed",
    "MissedAway",
    "MAX_AWAY",
    "OVERFLOW_MODES",
    "Unsubscribe",
    "Update",
    "Updated",
    "Deliver",
    "PatternFailed",
    "PatternRaised",
    "Error",
    "Ping",
    "Pong",
    "GetRouters",
    "Routers",
    "Bye",
    "event_to_wire",
    "event_from_wire",
    "PROTOCOL_VERSION",
    "MAX_PATTERN_SOURCE",
]

PROTOCOL_VERSION = 1

#: Longest pattern source accepted, in characters. Patterns are compiled and kept by every
#: router that holds the subscription; 64 KiB is far beyond any hand-written pattern.
MAX_PATTERN_SOURCE = 65536


class Message:
    """Base of every message kind."""

    __slots__ = ()
    kind: ClassVar[str]
    if TYPE_CHECKING:  # every kind is a dataclass: `fields` takes it
        __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        for f in fields(self):
            out[f.name] = getattr(self, f.name)
        return out

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Message:
        kwargs = {}
        for f in fields(cls):
            if f.name in data:
                kwargs[f.name] = data[f.name]
        try:
            return cls(**kwargs)
        except (TypeError, UsageError) as exc:
            raise MalformedFrame(f"bad {cls.kind!r} message: {exc}") from None


MESSAGE_KINDS: dict[str, type[Message]] = {}
M = TypeVar("M", bound=type[Message])


def register(kind: str) -> Callable[[M], M]:
    """Class decorator: make *kind* decode to the class."""

    def deco(cls: M) -> M:
        if kind in MESSAGE_KINDS:
            raise RuntimeError(f"message kind {kind!r} registered twice")
        cls.kind = kind
        MESSAGE_KINDS[kind] = cls
        return cls

    return deco


def unchecked(data: Mapping[str, Any], key: str) -> Any:
    """The wire value under *key* (None if it is absent), not checked yet: for a message
    whose constructor checks it (`__post_init__`), which raises for a wrong type."""
    return data.get(key)


def _need(value: Any, types: type | tuple[type, ...], name: str) -> None:
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _tuple(types)):
        expected = " or ".join(t.__name__ for t in _tuple(types))
        raise InvalidValue(f"{name} must be {expected}, not {type(value).__name__}")


def _tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


# -- events on the wire --------------------------------------------------------------------


# -- patterns --------------------------------------------------------------------------------

KERNEL_FORMATS = {"python": ("expr", "script"), "xpath": ("expr",)}


@dataclass(frozen=True, slots=True, kw_only=True)
class PatternSpec:
    """What a subscriber asks for: a pattern's kernel, format and source (Å §4.3).

    >>> PatternSpec(source="Temperature > 100")
    PatternSpec(kernel='python', format='expr', source='Temperature > 100')
    """

    kernel: str = "python"
    format: str = "expr"
    source: str

    def __post_init__(self) -> None:
        _need(self.kernel, str, "pattern kernel")
        _need(self.format, str, "pattern format")
        _need(self.source, str, "pattern source")
        if self.kernel not in KERNEL_FORMATS:
            raise InvalidValue(f"unknown pattern kernel {self.kernel!r} (known: python, xpath)")
        if self.format not in KERNEL_FORMATS[self.kernel]:
            known = ", ".join(KERNEL_FORMATS[self.kernel])
            raise InvalidValue(
                f"kernel {self.kernel!r} has no format {self.format!r} (known: {known})"
            )
        if len(self.source) > MAX_PATTERN_SOURCE:
            raise InvalidValue(f"pattern source is longer than {MAX_PATTERN_SOURCE} characters")

    def to_wire(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "format": self.format, "source": self.source}

    @classmethod
    def from_wire(cls, data: Any) -> PatternSpec:
        if type(data) is not dict:
            raise InvalidValue("pattern must be a map with kernel, format and source")
        return cls(
            kernel=data.get("kernel", "python"),
            format=data.get("format", "expr"),
            source=unchecked(data, "source"),
        )


# -- the kinds -----------------------------------------------------------------------------


@register("hello")
@dataclass(frozen=True, slots=True, kw_only=True)
class Hello(Message):
    """First frame of a connection: who is calling. *secret* (16 to 128 characters, kept by
    the client across fail-overs and never shown to anyone) gives the client its id scope
    (`aa.mesh.id_scope`): the ids it proposes are its own, so a retried publish is
    recognised on any router, and nobody else can claim them."""

    client_id: str
    name: str | None = None
    protocol: int = PROTOCOL_VERSION
    secret: str | None = None

    def __post_init__(self) -> None:
        _need(self.client_id, str, "client_id")
        if not 0 < len(self.client_id) <= MAX_ID_LENGTH:
            raise InvalidValue(f"client_id must have 1 to {MAX_ID_LENGTH} characters")
        _need(self.name, (str, type(None)), "name")
        _need(self.protocol, int, "protocol")
        _need(self.secret, (str, type(None)), "secret")
        if self.secret is not None and not 16 <= len(self.secret) <= 128:
            raise InvalidValue("secret must have 16 to 128 characters")


@register("welcome")
@dataclass(frozen=True, slots=True, kw_only=True)
class Welcome(Message):
    router_id: str
    router_name: str
    client_id: str
    protocol: int = PROTOCOL_VERSION
    #: Other routers' client endpoints ("host:port"), to fail over to.
    alternatives: tuple[str, ...] = ()
    #: The prefix ("scope-") of the event ids this connection may propose as they are;
    #: any other id it proposes travels the mesh under this scope (`aa.router.dispatch`).
    id_scope: str | None = None

    def __post_init__(self) -> None:
        _need(self.router_id, str, "router_id")
        _need(self.router_name, str, "router_name")
        _need(self.client_id, str, "client_id")
        _need(self.alternatives, (list, tuple), "alternatives")
        object.__setattr__(self, "alternatives", tuple(self.alternatives))


@register("publish")
@dataclass(frozen=True, slots=True, kw_only=True)
class Publish(Message):
    """A batch of events, acknowledged as a whole by `Ack(seq)`."""

    seq: int
    events: tuple[Event, ...]

    def __post_init__(self) -> None:
        _need(self.seq, int, "seq")
        _need(self.events, (list, tuple), "events")

    def to_wire(self) -> dict[str, Any]:
        return {
            "kind": "publish",
            "seq": self.seq,
            "events": [event_to_wire(e) for e in self.events],
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Publish:
        steps = cls.from_wire_steps(data)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                message: Publish = done.value
                return message

    @classmethod
    def from_wire_steps(cls, data: Mapping[str, Any]) -> Generator[None, None, Publish]:
        """`from_wire` 256 events per step (~0.25 ms), for a frame decoded in steps (checking
        10,000 events is ~10 ms): the codec resumes it until it returns the message."""
        seq = data.get("seq")
        events = data.get("events")
        if type(seq) is not int or type(events) is not list:
            raise MalformedFrame("bad 'publish' message: needs int seq and a list of events")
        return cls(seq=seq, events=tuple((yield from events_from_wire_steps(events))))


@register("ack")
@dataclass(frozen=True, slots=True, kw_only=True)
class Ack(Message):
    """Every `Publish` with a seq up to and including this one has been dispatched."""

    seq: int

    def __post_init__(self) -> None:
        _need(self.seq, int, "seq")


@register("subscribe")
@dataclass(frozen=True, slots=True, kw_only=True)
class Subscribe(Message):
    sub_id: int
    pattern: PatternSpec
    params: Values = field(default_factory=dict)
    #: History wanted from the store: None for none, else {"since": datetime | None}.
    history: Values | None = None
    #: When the client reads too slowly for the router to buffer its deliveries: "notify"
    #: (the events are dropped and the client told how many, `Missed`) or "disconnect"
    #: (the router closes the connection with error "overflow").
    overflow: str = "notify"
    #: Seconds since the client last heard from its previous router, when this subscribe
    #: registers the subscription again after losing it (None: a first subscribe). A router
    #: with a store answers `MissedAway`: the stored events the pattern matched meanwhile.
    away: float | None = None

    def __post_init__(self) -> None:
        _need(self.sub_id, int, "sub_id")
        if self.away is not None:
            _need(self.away, (int, float), "away")
            if not 0 <= self.away <= MAX_AWAY:  # also refuses NaN
                raise InvalidValue(f"away must be 0 to {MAX_AWAY} seconds, not {self.away!r}")
        if self.overflow not in OVERFLOW_MODES:
            raise InvalidValue(
                f"overflow must be one of {', '.join(OVERFLOW_MODES)}, not {self.overflow!r}"
            )
        if isinstance(self.pattern, dict):
            object.__setattr__(self, "pattern", PatternSpec.from_wire(self.pattern))
        _need(self.pattern, PatternSpec, "pattern")
        _need(self.params, dict, "params")
        check_values(self.params, "params")
        _need(self.history, (dict, type(None)), "history")

    def to_wire(self) -> dict[str, Any]:
        return {
            "kind": "subscribe",
            "sub_id": self.sub_id,
            "pattern": self.pattern.to_wire(),
            "params": self.params,
            "history": self.history,
            "overflow": self.overflow,
            **({"away": self.away} if self.away is not None else {}),
        }


#: Longest absence a re-subscribe may claim (`Subscribe.away`), in seconds: ten years. A
#: router counts only a bounded number of stored events however long the claim
#: (`aa.router.store.away`); this only refuses what is no duration at all.
MAX_AWAY: Final = 10 * 365 * 24 * 3600.0

#: What a subscription asks the router to do when its client does not keep up.
OVERFLOW_MODES: Final = ("notify", "disconnect")


@register("missed")
@dataclass(frozen=True, slots=True, kw_only=True)
class Missed(Message):
    """Events of subscription *sub_id* the router dropped because the client did not read
    them fast enough (its connection's backlog was over the router's bound)."""

    sub_id: int
    count: int

    def __post_init__(self) -> None:
        _need(self.sub_id, int, "sub_id")
        _need(self.count, int, "count")


@register("missed-away")
@dataclass(frozen=True, slots=True, kw_only=True)
class MissedAway(Message):
    """Stored events subscription *sub_id* matches (and its user may receive) that the
    router's store took while the client was away (`Subscribe.away`): *count* of them, or
    at least that many when *more* (the router counts a bounded number). They are not
    delivered now; subscribing with history gets them."""

    sub_id: int
    count: int
    more: bool = False

    def __post_init__(self) -> None:
        _need(self.sub_id, int, "sub_id")
        _need(self.count, int, "count")
        _need(self.more, bool, "more")


@register("subscribed")
@dataclass(frozen=True, slots=True, kw_only=True)
class Subscribed(Message):
    """The router took the pattern. *tier*: where it runs ("predicate": evaluated by the
    router itself, no code run; "worker": in a sandbox worker process; "sandbox": in the
    router's own sandbox). *warnings*: why it may never match (a name no event has had)."""

    sub_id: int
    tier: str | None = None
    warnings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _need(self.sub_id, int, "sub_id")
        _need(self.tier, (str, type(None)), "tier")
        _need(self.warnings, (list, tuple), "warnings")
        object.__setattr__(self, "warnings", tuple(str(w)[:500] for w in self.warnings[:20]))


@register("unsubscribe")
@dataclass(frozen=True, slots=True, kw_only=True)
class Unsubscribe(Message):
    sub_id: int

    def __post_init__(self) -> None:
        _need(self.sub_id, int, "sub_id")


@register("update")
@dataclass(frozen=True, slots=True, kw_only=True)
class Update(Message):
    """Change named parameters of a subscription's pattern (parametric subscriptions)."""

    sub_id: int
    params: Values

    def __post_init__(self) -> None:
        _need(self.sub_id, int, "sub_id")
        _need(self.params, dict, "params")
        check_values(self.params, "params")


@register("updated")
@dataclass(frozen=True, slots=True, kw_only=True)
class Updated(Message):
    sub_id: int

    def __post_init__(self) -> None:
        _need(self.sub_id, int, "sub_id")


@register("deliver")
@dataclass(frozen=True, slots=True, kw_only=True)
class Deliver(Message):
    """Events for one client: each with the ids of its subscriptions that matched."""

    items: tuple[tuple[tuple[int, ...], Event], ...]

    def to_wire(self) -> dict[str, Any]:
        return {"kind": "deliver", "items": [[list(s), event_to_wire(e)] for s, e in self.items]}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Deliver:
        return cls(items=deliver_items(data.get("items")))


@register("pattern-failed")
@dataclass(frozen=True, slots=True, kw_only=True)
class PatternFailed(Message):
    """The router stopped this subscription's pattern; the subscription is over."""

    sub_id: int
    code: str
    message: str


#: Longest error text and pattern line a `PatternRaised` carries, in characters.
MAX_RAISED_TEXT = 300


@register("pattern-raised")
@dataclass(frozen=True, slots=True, kw_only=True)
class PatternRaised(Message):
    """This subscription's pattern raised while running; it goes on (for that event an
    expression did not match, a script forwarded nothing). *error*: the exception's type and
    message; *count*: how many runs raised since the last such notice (a router sends at
    most one a second per pattern and params); *line*: the line of the pattern's source it
    was raised on (0: unknown), *text* that line."""

    sub_id: int
    error: str
    count: int
    line: int = 0
    text: str = ""

    def __post_init__(self) -> None:
        _need(self.sub_id, int, "sub_id")
        _need(self.error, str, "error")
        _need(self.count, int, "count")
        _need(self.line, int, "line")
        _need(self.text, str, "text")
        object.__setattr__(self, "error", self.error[:MAX_RAISED_TEXT])
        object.__setattr__(self, "text", self.text[:MAX_RAISED_TEXT])

    def __str__(self) -> str:
        where = f"line {self.line}: {self.error}" if self.line else self.error
        if self.text:
            where += f"  [{self.text}]"
        times = "once" if self.count == 1 else f"{self.count:,} times"
        return f"{where} ({times} since the last notice)"


@register("error")
@dataclass(frozen=True, slots=True, kw_only=True)
class Error(Message):
    """A request was refused (`ref` names it: a sub_id or a seq), or, if `fatal`, the
    connection is about to be closed."""

    code: str
    message: str
    ref: int | None = None
    fatal: bool = False


@register("ping")
@dataclass(frozen=True, slots=True, kw_only=True)
class Ping(Message):
    token: int = 0


@register("pong")
@dataclass(frozen=True, slots=True, kw_only=True)
class Pong(Message):
    token: int = 0


@register("get-routers")
@dataclass(frozen=True, slots=True, kw_only=True)
class GetRouters(Message):
    """Ask for the client endpoints of other routers in the mesh."""


@register("routers")
@dataclass(frozen=True, slots=True, kw_only=True)
class Routers(Message):
    addresses: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _need(self.addresses, (list, tuple), "addresses")
        object.__setattr__(self, "addresses", tuple(self.addresses))


@register("bye")
@dataclass(frozen=True, slots=True, kw_only=True)
class Bye(Message):
    """An orderly goodbye: the sender closes after this frame."""
