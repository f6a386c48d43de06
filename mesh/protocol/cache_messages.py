"""The messages a client uses for the mesh cache and its client cache (pure: no I/O).

Registered with `aa.mesh.protocol.messages.register`, like the router-to-router kinds. Each request
carries `req`, a number the client picks (unique among its open requests, sub_ids included:
a refusal comes back as `Error(ref=req)`), and gets exactly one answer: the kind named below,
or an `Error` whose `code` says why (``invalid-policy``, ``unknown-cache``,
``pattern-compile``, ``limit``, ...). Answers that carry events may take several frames
(`partial` is True on all but the last), so no answer outgrows the frame cap.

Client ⇄ router::

    GetCached(req, pattern, since, limit) ───►            the mesh cache (Å §4.5): asked
              ◄──────────────────────── Cached(req, events, partial)   for, never pushed
    CacheRegister(req, pattern, max_age, max_count, timeout) ─►
              ◄──────────────────────── CacheDone(req, info)           the registration
    CacheKeepalive(req) ───────────────►                                floods the mesh;
              ◄──────────────────────── CacheDone | Error("unknown-cache")   so do these:
    CachePolicy(req, max_age, max_count), CacheClear(req), CacheRemove(req),
    CacheAck(req, upto) ───────────────►
              ◄──────────────────────── CacheDone(req, info)
    CacheFetch(req, after, limit) ─────►
              ◄──────────────────────── CacheEvents(req, events, cursor, more, partial)
    GetCacheInfo(req) ─────────────────► CacheDone(req, info)

Policies travel as the publisher or user wrote them (`max_age` in seconds or as text such as
``"3h"``, `max_count` an int): the router parses them and refuses bad ones with the reason
(`aa.router.store.expiry`), so every client, in any language, gets the same rules and messages.

`info` (in `CacheDone`) is a map: ``{"client_id", "max_age": seconds | None, "max_count":
int | None, "timeout": seconds, "size": events waiting, "dropped": events the cache took and
lost unacknowledged to its count or age limit since this router registered it, or None when
permissions hide some event types from its owner}``, or
``{"client_id", "removed": bool}`` after `CacheRemove`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, TypeAlias, get_args

from ..errors import InvalidValue, MalformedFrame
from ..event import MAX_ID_LENGTH, Event
from ..values import Values, check_values
from .messages import (
    Message,
    PatternSpec,
    register,
    unchecked,
)
from .wire_events import event_from_wire, event_to_wire

__all__ = [
    "GetCached",
    "Cached",
    "CacheRegister",
    "CacheKeepalive",
    "CacheFetch",
    "CacheEvents",
    "CacheAck",
    "CachePolicy",
    "CacheClear",
    "CacheRemove",
    "GetCacheInfo",
    "CacheDone",
    "CacheRequest",
    "CacheAnswer",
    "CACHE_REQUESTS",
    "CACHE_ANSWERS",
    "DEFAULT_CACHE_TIMEOUT",
    "MAX_ANSWER_EVENTS",
    "MAX_CACHE_TIMEOUT",
]

#: Seconds a client cache lives without a keep-alive unless the client says otherwise: a
#: day, so a phone that is off overnight still finds its events in the morning.
DEFAULT_CACHE_TIMEOUT: Final = 24 * 3600.0
#: Longest keep-alive timeout a client may ask for, in seconds (7 days; routers enforce it
#: too, `aa.router.caches.clientcaches.MAX_KEEPALIVE_TIMEOUT`): a forgotten cache goes at last.
MAX_CACHE_TIMEOUT: Final = 7 * 24 * 3600.0
#: Most events in one answer frame. A thousand typical events are ~100 KiB: far below the
#: frame cap, and the client starts decoding while the router still sends.
MAX_ANSWER_EVENTS: Final = 1000


def _int(value: Any, name: str, *, optional: bool = False, minimum: int = 0) -> None:
    if value is None and optional:
        return
    if type(value) is not int or value < minimum:
        raise InvalidValue(
            f"{name} must be an int of at least {minimum}{' or nil' if optional else ''}"
        )


def _age(value: Any) -> None:
    if value is not None and type(value) not in (int, float, str):
        raise InvalidValue("max_age must be seconds (a number), text such as '3h', or nil")
    if type(value) is str and len(value) > 64:
        raise InvalidValue("max_age text is longer than 64 characters")


def _count(value: Any) -> None:
    if value is not None and type(value) not in (int, str):
        raise InvalidValue("max_count must be an int, text, or nil")
    if type(value) is str and len(value) > 64:
        raise InvalidValue("max_count text is longer than 64 characters")


def _pattern(msg: Any) -> None:
    if isinstance(msg.pattern, dict):
        object.__setattr__(msg, "pattern", PatternSpec.from_wire(msg.pattern))
    if type(msg.pattern) is not PatternSpec:
        raise InvalidValue("pattern must be a map with kernel, format and source")


def _events_to_wire(events: tuple[Event, ...]) -> list[Any]:
    return [event_to_wire(e) for e in events]


def _events_from_wire(kind: str, data: Any) -> tuple[Event, ...]:
    if type(data) is not list:
        raise MalformedFrame(f"bad {kind!r} message: events must be a list")
    return tuple(event_from_wire(e) for e in data)


@register("get-cached")
@dataclass(frozen=True, slots=True, kw_only=True)
class GetCached(Message):
    """Ask for the mesh-cached events *pattern* matches, taken at or after *since*, oldest
    first, at most *limit*."""

    req: int
    pattern: PatternSpec
    since: datetime | None = None
    limit: int | None = None

    def __post_init__(self) -> None:
        _int(self.req, "req")
        _pattern(self)
        if self.since is not None and type(self.since) is not datetime:
            raise InvalidValue("since must be a datetime or nil")
        _int(self.limit, "limit", optional=True)

    def to_wire(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "req": self.req,
            "pattern": self.pattern.to_wire(),
            "since": self.since,
            "limit": self.limit,
        }


@register("cached")
@dataclass(frozen=True, slots=True, kw_only=True)
class Cached(Message):
    """Mesh-cached events answering a `GetCached`; more frames follow while `partial`."""

    req: int
    events: tuple[Event, ...] = ()
    partial: bool = False

    def __post_init__(self) -> None:
        _int(self.req, "req")
        if type(self.events) not in (list, tuple):
            raise InvalidValue("events must be a list")
        object.__setattr__(self, "events", tuple(self.events))
        if type(self.partial) is not bool:
            raise InvalidValue("partial must be a bool")

    def to_wire(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "req": self.req,
            "events": _events_to_wire(self.events),
            "partial": self.partial,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Cached:
        try:
            return cls(
                req=unchecked(data, "req"),
                events=_events_from_wire(cls.kind, data.get("events")),
                partial=data.get("partial", False),
            )
        except InvalidValue as exc:
            raise MalformedFrame(f"bad {cls.kind!r} message: {exc}") from None


@register("cache-register")
@dataclass(frozen=True, slots=True, kw_only=True)
class CacheRegister(Message):
    """Keep the events *pattern* matches for this client, under this policy, on every router
    of the mesh, while keep-alives come at least every *timeout* seconds."""

    req: int
    pattern: PatternSpec
    max_age: float | str | None = None
    max_count: int | str | None = None
    timeout: float = DEFAULT_CACHE_TIMEOUT

    def __post_init__(self) -> None:
        _int(self.req, "req")
        _pattern(self)
        _age(self.max_age)
        _count(self.max_count)
        if type(self.timeout) not in (int, float) or not 0 < self.timeout <= MAX_CACHE_TIMEOUT:
            raise InvalidValue(
                f"timeout must be more than 0 and at most {MAX_CACHE_TIMEOUT:.0f} seconds"
            )

    def to_wire(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "req": self.req,
            "pattern": self.pattern.to_wire(),
            "max_age": self.max_age,
            "max_count": self.max_count,
            "timeout": self.timeout,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class _Plain(Message):
    req: int

    def __post_init__(self) -> None:
        _int(self.req, "req")


@register("cache-keepalive")
@dataclass(frozen=True, slots=True, kw_only=True)
class CacheKeepalive(_Plain):
    """The client is still there: push its cache's removal back (everywhere)."""


@register("cache-clear")
@dataclass(frozen=True, slots=True, kw_only=True)
class CacheClear(_Plain):
    """Empty the client's cache (everywhere); it stays registered."""


@register("cache-remove")
@dataclass(frozen=True, slots=True, kw_only=True)
class CacheRemove(_Plain):
    """Remove the client's cache (everywhere)."""


@register("get-cache-info")
@dataclass(frozen=True, slots=True, kw_only=True)
class GetCacheInfo(_Plain):
    """What is the client's cache (policy, timeout, events waiting)?"""


@register("cache-policy")
@dataclass(frozen=True, slots=True, kw_only=True)
class CachePolicy(Message):
    """Change the cache's expiry policy (everywhere); it applies to the events kept too."""

    req: int
    max_age: float | str | None = None
    max_count: int | str | None = None

    def __post_init__(self) -> None:
        _int(self.req, "req")
        _age(self.max_age)
        _count(self.max_count)


@register("cache-fetch")
@dataclass(frozen=True, slots=True, kw_only=True)
class CacheFetch(Message):
    """The cache's events, oldest first: after cursor *after* (None: from what is not yet
    acknowledged), at most *limit*. Fetching removes nothing; `CacheAck` does. Counts as a
    keep-alive."""

    req: int
    after: int | None = None
    limit: int | None = None

    def __post_init__(self) -> None:
        _int(self.req, "req")
        _int(self.after, "after", optional=True)
        _int(self.limit, "limit", optional=True)


@register("cache-events")
@dataclass(frozen=True, slots=True, kw_only=True)
class CacheEvents(Message):
    """Events answering a `CacheFetch`. `cursor` (this router's) and `more` are those of the
    whole answer (`aa.router.caches.clientcaches.Fetched`); more frames follow while `partial`."""

    req: int
    events: tuple[Event, ...] = ()
    cursor: int = 0
    more: bool = False
    partial: bool = False

    def __post_init__(self) -> None:
        _int(self.req, "req")
        if type(self.events) not in (list, tuple):
            raise InvalidValue("events must be a list")
        object.__setattr__(self, "events", tuple(self.events))
        _int(self.cursor, "cursor")
        if type(self.more) is not bool or type(self.partial) is not bool:
            raise InvalidValue("more and partial must be bools")

    def to_wire(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "req": self.req,
            "events": _events_to_wire(self.events),
            "cursor": self.cursor,
            "more": self.more,
            "partial": self.partial,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> CacheEvents:
        try:
            return cls(
                req=unchecked(data, "req"),
                events=_events_from_wire(cls.kind, data.get("events")),
                cursor=data.get("cursor", 0),
                more=data.get("more", False),
                partial=data.get("partial", False),
            )
        except InvalidValue as exc:
            raise MalformedFrame(f"bad {cls.kind!r} message: {exc}") from None


@register("cache-ack")
@dataclass(frozen=True, slots=True, kw_only=True)
class CacheAck(Message):
    """Remove from the cache every event up to and including *upto*: an event id (valid on
    every router) or a cursor from this router's `CacheEvents`."""

    req: int
    upto: int | str

    def __post_init__(self) -> None:
        _int(self.req, "req")
        if type(self.upto) is str:
            if not 0 < len(self.upto) <= MAX_ID_LENGTH:
                raise InvalidValue(
                    f"upto must be an event id of 1 to {MAX_ID_LENGTH} characters or a cursor"
                )
        elif type(self.upto) is not int or self.upto < 0:
            raise InvalidValue("upto must be an event id (str) or a cursor (int)")


@register("cache-done")
@dataclass(frozen=True, slots=True, kw_only=True)
class CacheDone(Message):
    """A cache request succeeded; `info` describes the cache now (see the module docstring)."""

    req: int
    info: Values = field(default_factory=dict)

    def __post_init__(self) -> None:
        _int(self.req, "req")
        if type(self.info) is not dict:
            raise InvalidValue("info must be a map")
        check_values(self.info, "info")


#: A request a client sends to its router about storage (the router's session hands it on).
CacheRequest: TypeAlias = (
    GetCached
    | CacheRegister
    | CacheKeepalive
    | CacheFetch
    | CacheAck
    | CachePolicy
    | CacheClear
    | CacheRemove
    | GetCacheInfo
)
#: An answer to one (besides `Error`).
CacheAnswer: TypeAlias = Cached | CacheEvents | CacheDone

#: The kinds of `CacheRequest`.
CACHE_REQUESTS: Final = frozenset(get_args(CacheRequest))
#: The kinds of `CacheAnswer`.
CACHE_ANSWERS: Final = frozenset(get_args(CacheAnswer))
