"""Events and their ids (pure: no I/O).

An event is typed name/value pairs (`values`), an optional opaque `type`, and `meta`: values
the publisher sets for routers and subscribers, and values routers stamp (Å §4.2). Routers
stamp the keys named by the `META_*` constants below; a publisher may not forge them.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidValue
from .values import Values, check_values

__all__ = [
    "Event",
    "IdGenerator",
    "id_scope",
    "ID_SCOPE_LENGTH",
    "META_TIME",
    "META_CLIENT",
    "META_ADDRESS",
    "META_USER",
    "META_TTL",
    "META_PATH",
    "META_ROUTER",
    "META_HISTORICAL",
    "ROUTER_META_KEYS",
    "MAX_ID_LENGTH",
]

#: When the first router received the event (aware datetime, UTC).
META_TIME = "time"
#: The publishing client's id.
META_CLIENT = "client"
#: The publisher's network address, "host:port".
META_ADDRESS = "address"
#: The authenticated user, when the publisher presented a certificate.
META_USER = "user"
#: Hops the event may still make between routers.
META_TTL = "ttl"
#: Ids of the routers the event has passed, first one first.
META_PATH = "path"
#: The id of the router the publisher was connected to.
META_ROUTER = "router"
#: True on events replayed from a store rather than delivered live.
META_HISTORICAL = "historical"

#: Keys only routers set; a publisher's values for them are replaced.
ROUTER_META_KEYS = frozenset(
    {
        META_TIME,
        META_CLIENT,
        META_ADDRESS,
        META_USER,
        META_TTL,
        META_PATH,
        META_ROUTER,
        META_HISTORICAL,
    }
)

#: Longest event id accepted from a client, in characters. Ids are kept in the seen-id set
#: of every router, so a client must not be able to make them large.
MAX_ID_LENGTH = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One event.

    >>> Event(values={"Temperature": 101}, type="reading").values["Temperature"]
    101

    Raises `InvalidValue` when `values` or `meta` hold something outside the value model.
    """

    values: Values
    type: str | None = None
    meta: Values = field(default_factory=dict)
    #: Globally unique id; None until a router (or the publishing client) assigns one.
    id: str | None = None
    #: The event's msgpack encoding, made once by `aa.mesh.protocol.packed_event` and then
    #: shared by every frame, cache and log that carries the event (encode once).
    packed: bytes | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check(self.values, self.type, self.meta, self.id)

    @classmethod
    def checked(
        cls,
        values: Values,
        type: str | None = None,
        meta: Values | None = None,
        id: str | None = None,
    ) -> Event:
        """`Event(values=values, type=type, meta=meta, id=id)`, with the same checks (raises
        `InvalidValue`), at about a third of the cost: for publishers' hot paths. *values*
        and *meta* are kept as they are, not copied."""
        meta = {} if meta is None else meta
        if type_of(values) is not dict or type_of(meta) is not dict:
            return cls(values=values, type=type, meta=meta, id=id)
        _check(values, type, meta, id)
        return cls.trusted(values, type, meta, id)

    @classmethod
    def trusted(cls, values: Values, type: str | None, meta: Values, id: str | None) -> Event:
        """Build an event without checking it: for data that is already known good."""
        # Two per event on a router's hot path (decoded, then stamped). Filling a frozen
        # dataclass takes one object.__setattr__ per field; filling its mutable twin with plain
        # stores and then giving it this class is a fraction of that. The twin has the same
        # slots in the same order, so the object is laid out exactly as an Event; nothing else
        # ever sees it as a twin.
        ev = _Unfrozen()
        ev.values = values
        ev.type = type
        ev.meta = meta
        ev.id = id
        ev.packed = None
        ev.__class__ = cls  # type: ignore[assignment]  # the twin becomes an Event, on purpose
        return ev  # type: ignore[return-value]  # it is one now; a cast would cost a call

    def with_meta(self, **changes: Any) -> Event:
        """A copy with *changes* merged into `meta`."""
        return Event.trusted(self.values, self.type, {**self.meta, **changes}, self.id)

    def with_id(self, id: str) -> Event:
        return Event.trusted(self.values, self.type, self.meta, id)

    def to_dict(self) -> dict[str, Any]:
        """The event as a plain map: `{"id", "type", "values", "meta"}` (JSON lines, HTTP)."""
        return {"id": self.id, "type": self.type, "values": self.values, "meta": self.meta}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Event:
        """The inverse of `to_dict`, checked."""
        return cls(
            values=dict(data.get("values") or {}),
            type=data.get("type"),
            meta=dict(data.get("meta") or {}),
            id=data.get("id"),
        )


type_of = type


def _check(values: Values, type: str | None, meta: Values, id: str | None) -> None:
    check_values(values)
    check_values(meta, "meta")
    if type is not None and type_of(type) is not str:
        raise InvalidValue(f"event type must be str or None, not {type_of(type).__name__}")
    if id is not None and (type_of(id) is not str or not 0 < len(id) <= MAX_ID_LENGTH):
        raise InvalidValue(f"event id must be a str of 1 to {MAX_ID_LENGTH} characters")


class _Unfrozen:
    """`Event`'s slots without its frozen guard: `Event.trusted` fills one, then makes it
    an `Event`. Not an event itself; never leaves `Event.trusted`."""

    __slots__ = Event.__slots__
    values: Any
    type: Any
    meta: Any
    id: Any
    packed: Any


#: Characters of an id scope (hex of 64 bits).
ID_SCOPE_LENGTH = 16


def id_scope(secret: str) -> str:
    """The id scope of a publisher that holds *secret*: the prefix every id it proposes
    must carry (`aa.router.dispatch`). A keyed hash, so knowing a scope (every event id
    shows one) gives no way to the secret; without the secret nobody can publish under
    another publisher's ids, so nobody can make the mesh drop its events as duplicates."""
    digest = hashlib.blake2b(
        secret.encode(), digest_size=ID_SCOPE_LENGTH // 2, person=b"aa.event-id"
    )
    return digest.hexdigest()


class IdGenerator:
    """Globally unique ids, cheaply: a random 64-bit prefix, then a counter.

    Two generators collide only if their random prefixes do (about one in 2**32 after four
    billion generators); within one generator ids never repeat. Far cheaper than uuid4 per
    event, which matters on the event path.
    """

    __slots__ = ("prefix", "_counter")

    def __init__(self, prefix: str | None = None) -> None:
        self.prefix = prefix if prefix is not None else os.urandom(8).hex()
        self._counter = itertools.count(1)

    def __call__(self) -> str:
        return f"{self.prefix}-{next(self._counter):x}"
