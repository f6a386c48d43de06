"""Expiry policies for the persistent store and the caches (pure: no I/O).

Å §4.5: a publisher asks, per event, that routers keep it in their persistent store, with a
combination of an age limit ("remove after three hours") and a count limit ("keep at most
five events of that type"). It does so with these event `meta` keys:

=============  ======================  =====================================================
key            value                   meaning
=============  ======================  =====================================================
``persist``    ``True``                keep this event in every router's persistent store
``max_age``    seconds (int or         remove it once it is older than this (measured from
               float > 0) or text      the event's ``time`` stamp); text as in
               such as ``"3h"``        `parse_duration`
``max_count``  int > 0                 keep only the newest N stored events of this event's
                                       *type* (so it needs a type); the latest stored
                                       event's count wins for the type
``mesh_cache`` ``False``               opt this event out of the mesh cache (which is
                                       opt-out, Å §4.5); any other value leaves it in
=============  ======================  =====================================================

Example: ``meta={"persist": True, "max_age": 10800, "max_count": 5}``.

`max_age` and `max_count` without ``persist: True`` are refused rather than ignored: a
publisher who wrote them surely meant the event to be kept, and silently not keeping it is
the failure nobody notices until the data is needed.

Client caches use the same `ExpiryPolicy`, sent by the client with its cache registration.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, cast

from aa.mesh import META_TIME, Event, InvalidPolicy

__all__ = [
    "ExpiryPolicy",
    "parse_duration",
    "persist_policy",
    "wants_mesh_cache",
    "event_time",
    "expired_copies",
    "META_PERSIST",
    "META_MAX_AGE",
    "META_MAX_COUNT",
    "META_MESH_CACHE",
    "MAX_POLICY_AGE",
    "MAX_POLICY_COUNT",
]

#: Meta key: ``True`` asks routers to keep the event in their persistent store.
META_PERSIST: Final = "persist"
#: Meta key: age limit, in seconds (int/float) or as text (``"3h"``, ``"1h30m"``).
META_MAX_AGE: Final = "max_age"
#: Meta key: keep only the newest N stored events of the event's type.
META_MAX_COUNT: Final = "max_count"
#: Meta key: ``False`` keeps the event out of the mesh cache.
META_MESH_CACHE: Final = "mesh_cache"

#: Longest age limit accepted: 100 years. Expiry instants are kept as microseconds since the
#: epoch in a 64-bit column and as `datetime`s; a bound keeps `time + max_age` representable
#: in both, whatever a publisher sends.
MAX_POLICY_AGE: Final = timedelta(days=36_500)
#: Largest count limit accepted. A count only bounds from above, so any size is harmless to
#: us, but it ends up as a SQL OFFSET, which every backend takes as a 32-bit int at least.
MAX_POLICY_COUNT: Final = 1_000_000_000

_UNITS: Final = {
    "ms": timedelta(milliseconds=1),
    "s": timedelta(seconds=1),
    "m": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "d": timedelta(days=1),
    "w": timedelta(weeks=1),
}
_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)")


def parse_duration(text: str) -> timedelta:
    """A duration written for humans: ``"90s"``, ``"3h"``, ``"2d"``, ``"1h30m"``, ``"1.5h"``.

    Units: ``ms``, ``s``, ``m`` (minutes), ``h``, ``d``, ``w``; parts may be separated by
    spaces. Raises `InvalidPolicy` for a missing or unknown unit, or an empty text.

    >>> parse_duration("1h30m")
    datetime.timedelta(seconds=5400)
    """
    if type(text) is not str:
        raise InvalidPolicy(f"a duration must be text such as '3h', not {type(text).__name__}")
    pos, total, seen = 0, timedelta(0), False
    stripped = text.rstrip()
    if stripped.lstrip().startswith("-"):
        raise InvalidPolicy(f"duration {text!r} is negative: an age limit must be positive")
    while pos < len(stripped):
        m = _PART.match(stripped, pos)
        if m is None or m.end() == pos:
            raise InvalidPolicy(
                f"cannot read duration {text!r}: expected a number and a unit at "
                f"{stripped[pos:]!r} "
                "(e.g. '90s', '3h', '1h30m')"
            )
        number, unit = m.group(1), m.group(2)
        if not unit:
            raise InvalidPolicy(
                f"duration {text!r} has a number without a unit: write e.g. '{number}s' "
                f"(units: {', '.join(_UNITS)})"
            )
        if unit not in _UNITS:
            raise InvalidPolicy(
                f"duration {text!r} has an unknown unit {unit!r} (units: {', '.join(_UNITS)})"
            )
        try:
            total += float(number) * _UNITS[unit]
        except OverflowError:
            raise InvalidPolicy(f"duration {text!r} is too long") from None
        seen = True
        pos = m.end()
    if not seen:
        raise InvalidPolicy("a duration cannot be empty: write e.g. '90s', '3h' or '1h30m'")
    return total


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpiryPolicy:
    """When stored or cached events go: by age, by count, both, or neither.

    >>> ExpiryPolicy(max_age=timedelta(hours=3), max_count=5).max_count
    5
    >>> ExpiryPolicy.parse(max_age="3h").max_age
    datetime.timedelta(seconds=10800)

    Raises `InvalidPolicy` for a zero or negative age or count, or one over the caps.
    """

    #: Events older than this go; None keeps them however old. For the store, age counts
    #: from the event's ``time`` stamp; for client caches, from when the cache took it.
    max_age: timedelta | None = None
    #: Only the newest this many are kept (in the store: per event type); None for no limit.
    max_count: int | None = None

    def __post_init__(self) -> None:
        age, count = self.max_age, self.max_count
        if age is not None:
            if not isinstance(age, timedelta):
                raise InvalidPolicy(f"max_age must be a timedelta, not {type(age).__name__}")
            if age <= timedelta(0):
                raise InvalidPolicy(f"max_age must be positive, not {age}")
            if age > MAX_POLICY_AGE:
                raise InvalidPolicy(f"max_age of {age} is over the limit of {MAX_POLICY_AGE}")
        if count is not None:
            if type(count) is not int:
                raise InvalidPolicy(f"max_count must be an int, not {type(count).__name__}")
            if count <= 0:
                raise InvalidPolicy(f"max_count must be at least 1, not {count}")
            if count > MAX_POLICY_COUNT:
                raise InvalidPolicy(f"max_count of {count} is over the limit of {MAX_POLICY_COUNT}")

    @property
    def unlimited(self) -> bool:
        """True when neither limit is set."""
        return self.max_age is None and self.max_count is None

    @classmethod
    def parse(
        cls, *, max_age: str | float | None = None, max_count: str | int | None = None
    ) -> ExpiryPolicy:
        """A policy from human input (command line, config): ``max_age="3h"``, ``max_count="5"``.

        A number for `max_age` is seconds. Raises `InvalidPolicy` with the reason.
        """
        age = None if max_age is None else _age(max_age, "max_age")
        count: int | None
        if max_count is None:
            count = None
        elif isinstance(max_count, str):
            try:
                count = int(max_count.strip())
            except ValueError:
                raise InvalidPolicy(
                    f"max_count must be a whole number, not {max_count!r}"
                ) from None
        else:
            count = max_count  # checked in __post_init__
        return cls(max_age=age, max_count=count)

    def to_meta(self) -> dict[str, Any]:
        """The meta keys that ask routers to persist an event under this policy."""
        out: dict[str, Any] = {META_PERSIST: True}
        if self.max_age is not None:
            out[META_MAX_AGE] = self.max_age.total_seconds()
        if self.max_count is not None:
            out[META_MAX_COUNT] = self.max_count
        return out


def _age(value: object, key: str) -> timedelta:
    if type(value) is str:
        return parse_duration(value)
    if type(value) in (int, float):
        seconds = float(cast(float, value))
        if not math.isfinite(seconds):
            raise InvalidPolicy(f"{key} must be a finite number of seconds, not {value!r}")
        if seconds <= 0:
            raise InvalidPolicy(f"{key} must be positive, not {value!r} seconds")
        if seconds > MAX_POLICY_AGE.total_seconds():
            raise InvalidPolicy(f"{key} of {value!r} seconds is over the limit of {MAX_POLICY_AGE}")
        return timedelta(seconds=seconds)
    raise InvalidPolicy(
        f"{key} must be a number of seconds or text such as '3h', not {type(value).__name__}"
    )


def persist_policy(event: Event) -> ExpiryPolicy | None:
    """The store policy the publisher asked for in *event*'s meta, or None (not persisted).

    >>> ev = Event(values={}, type="snow", meta={"persist": True, "max_age": 10800, "max_count": 5})
    >>> persist_policy(ev)
    ExpiryPolicy(max_age=datetime.timedelta(seconds=10800), max_count=5)

    Raises `InvalidPolicy` when the keys are malformed, when `max_age`/`max_count` come
    without ``persist: True``, or when `max_count` comes on an event without a type (the
    count is kept per type; counting all untyped events together would let one publisher
    erase everyone else's).
    """
    meta: Mapping[str, Any] = event.meta
    persist = meta.get(META_PERSIST)
    age = meta.get(META_MAX_AGE)
    count = meta.get(META_MAX_COUNT)
    if persist is None or persist is False:
        if age is not None or count is not None:
            raise InvalidPolicy(
                f"{META_MAX_AGE!r}/{META_MAX_COUNT!r} only apply to persisted events: "
                f"add {META_PERSIST!r}: True to the event's meta"
            )
        return None
    if persist is not True:
        raise InvalidPolicy(f"meta {META_PERSIST!r} must be True or False, not {persist!r}")
    if count is not None:
        if type(count) is not int:
            raise InvalidPolicy(f"meta {META_MAX_COUNT!r} must be an int, not {count!r}")
        if event.type is None:
            raise InvalidPolicy(
                f"meta {META_MAX_COUNT!r} needs an event type: the count is kept per type"
            )
    return ExpiryPolicy(max_age=None if age is None else _age(age, META_MAX_AGE), max_count=count)


def wants_mesh_cache(event: Event) -> bool:
    """False when the publisher opted *event* out of the mesh cache (``mesh_cache: False``)."""
    return event.meta.get(META_MESH_CACHE) is not False


def event_time(event: Event) -> datetime | None:
    """The event's ``time`` stamp when it is an aware datetime, else None."""
    t = event.meta.get(META_TIME)
    if type(t) is datetime and t.tzinfo is not None:
        return t
    return None


def expired_copies(events: Iterable[Event], now: datetime) -> set[str]:
    """The ids of *events* (copies of persisted events outside a store: the mesh cache's)
    that their own store policy has removed at *now*, as a store would have: older than
    their age limit, or not among the newest `max_count` of their type (newest by time then
    id; the count of the latest event that has one wins for the type). An event without a
    valid policy is never expired here.

    >>> from datetime import UTC
    >>> t = datetime(2030, 1, 1, tzinfo=UTC)
    >>> snow = [Event(values={}, type="snow", id=f"e{i}",
    ...               meta={"persist": True, "max_count": 2, "time": t}) for i in range(3)]
    >>> sorted(expired_copies(snow, t))
    ['e0']
    """
    by_type: dict[str, list[tuple[datetime, str]]] = {}
    count: dict[str, tuple[tuple[datetime, str], int]] = {}
    out: set[str] = set()
    for ev in events:
        try:
            policy = persist_policy(ev)
        except InvalidPolicy:
            continue
        t = event_time(ev)
        if policy is None or t is None or ev.id is None:
            continue
        if policy.max_age is not None and t + policy.max_age <= now:
            out.add(ev.id)
        if ev.type is not None:
            key = (t, ev.id)
            by_type.setdefault(ev.type, []).append(key)
            n = policy.max_count
            if n is not None and (ev.type not in count or key > count[ev.type][0]):
                count[ev.type] = (key, n)
    for type_, (_, n) in count.items():
        keys = by_type[type_]
        if len(keys) > n:
            keys.sort()
            out.update(id_ for _, id_ in keys[: len(keys) - n])
    return out
