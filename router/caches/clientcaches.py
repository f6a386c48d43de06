"""Client event caches (Å §4.5) — pure: no I/O; every deadline takes `now` (float seconds,
any monotonic clock the caller keeps).

A client that is often away asks the mesh to keep the events matching its pattern for it,
under its own expiry policy (age, count), and keeps the cache alive by sending keep-alives;
it later fetches what was kept and acknowledges what it has handled. The registration,
keep-alives and acks flood the mesh, so every router keeps the same cache and the client
may come back through any of them (the router does the flooding; this module is one
router's copy).

Cost. Every dispatched event is offered to the caches, so `offer` must not grow with the
number of caches: a router keeps 70% of its throughput with 1,000 of them. Caches are
therefore grouped by *pattern key* (the same pattern compiled once by the router gives the
same key), and a group has ONE shared log of the events its pattern accepted. Offering an
event evaluates each distinct pattern once and appends to each accepting group's log once,
whatever the number of caches in the group. A cache is then a view over its group's log:

    entries with seq > floor            (floor: registration point, acks, clear)
    and among the newest max_count      (count policy)
    and taken at or after now - max_age (age policy)

so each cache's policy holds exactly, while the shared log keeps only what the most
demanding member may still need: as many entries as the largest count, for as long as the
longest age (members with no limit count as `max_events_per_cache`, and never more than
that, so a peer cannot make a cache grow without end). Entries every member has
acknowledged are dropped by `expire(now)`.

Sequence numbers are one counter for all caches of this router, so a cursor stays
meaningful for a client whose cache changes policy. They are this router's own: a client
that comes back through another router acknowledges by event id (`ack(client, "id")`),
which every router knows.

Expiry (the risky part): `expire(now)` removes the caches whose keep-alive lapsed
(`now - last keep-alive > timeout`) and drops log entries older than any member's age
limit; between sweeps, `fetch` filters by age itself, so a client never gets an event past
its age. Times in the log are made non-decreasing (a `now` that goes backwards is taken as
the previous one), which is what lets `fetch` find the age boundary by bisection.
"""

from __future__ import annotations

import logging
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Callable, Final, Hashable, Iterable

from aa.mesh import Event, UsageError
from aa.mesh import UnknownCache  # the tree's; re-exported here

from ..store import ExpiryPolicy

__all__ = [
    "ClientCaches",
    "Fetched",
    "CacheInfo",
    "UnknownCache",
    "MAX_CLIENT_CACHES",
    "MAX_EVENTS_PER_CACHE",
    "MAX_KEEPALIVE_TIMEOUT",
]

log = logging.getLogger("aa.router.caches")

#: Most client caches one router keeps. Registrations flood the mesh, so any client can
#: add one at every router; each costs little until it fills.
MAX_CLIENT_CACHES: Final = 10_000
#: Most events one cache (and one shared group log) holds, whatever its count policy: a
#: cache with no count limit is bounded by this instead of by the router's memory.
MAX_EVENTS_PER_CACHE: Final = 10_000
#: Longest keep-alive timeout accepted, in seconds (7 days): a forgotten cache goes at last.
MAX_KEEPALIVE_TIMEOUT: Final = 7 * 24 * 3600.0
#: A group log is compacted (its dead prefix deleted) once the prefix is this long and at
#: least half the list: amortised O(1) per event, no copy per trim.
_COMPACT_AT: Final = 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Fetched:
    """Events fetched from a client cache, oldest first."""

    #: The events, oldest first.
    events: list[Event]
    #: Sequence number of the last event returned (or the starting point when none was):
    #: pass it as `after` for the next page, and to `ack` once the events are handled.
    cursor: int
    #: True when more events wait after `cursor`.
    more: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheInfo:
    """What a client cache is, for the monitor and the `aa cache` command."""

    client_id: str
    policy: ExpiryPolicy
    #: Seconds without keep-alive after which the cache goes.
    timeout: float
    #: `now` of the registration or last keep-alive.
    last_seen: float
    #: Events the client would get from `fetch` now (ignoring age, which needs `now`).
    size: int


class _Group:
    """Caches whose patterns have the same key, and the log their pattern filled."""

    __slots__ = ("key", "matcher", "members", "log", "head", "keep", "max_age")

    def __init__(self, key: Hashable, matcher: Callable[[Event], bool]) -> None:
        self.key = key
        self.matcher = matcher
        self.members: dict[str, _Cache] = {}
        #: (seq, time taken, event); seq and time non-decreasing; live from `head` on.
        self.log: list[tuple[int, float, Event]] = []
        self.head = 0
        self.keep = 0  # entries the most demanding member may need
        self.max_age: float | None = None  # longest member age limit; None: some have none

    def retune(self, cap: int) -> None:
        keep, age = 0, 0.0
        for c in self.members.values():
            keep = max(keep, min(c.policy.max_count or cap, cap))
            if age is not None:
                a = c.policy.max_age
                age = None if a is None else max(age, a.total_seconds())  # type: ignore[assignment]
        self.keep, self.max_age = keep, age

    def append(self, seq: int, now: float, event: Event) -> None:
        log = self.log
        if log and log[-1][1] > now:
            now = log[-1][1]  # keep times non-decreasing (see the module docstring)
        log.append((seq, now, event))
        head = max(self.head, len(log) - self.keep)
        if self.max_age is not None:
            oldest = now - self.max_age
            while log[head][1] < oldest:  # the new entry itself is never too old
                head += 1
        self.head = head
        self._compact()

    def trim(self, now: float) -> None:
        """Drop entries no member can still return: acknowledged by all, or too old."""
        log = self.log
        floor = min(c.floor for c in self.members.values())
        head = bisect_right(log, floor, self.head, key=_seq)
        if self.max_age is not None:
            head = bisect_left(log, now - self.max_age, head, key=_time)
        self.head = head
        self._compact()

    def _compact(self) -> None:
        head = self.head
        if head >= _COMPACT_AT and head * 2 >= len(self.log):
            del self.log[:head]
            self.head = 0


class _Cache:
    __slots__ = ("client_id", "group", "policy", "timeout", "last_seen", "floor")

    def __init__(
        self, client_id: str, group: _Group, policy: ExpiryPolicy, timeout: float, now: float, floor: int
    ) -> None:
        self.client_id = client_id
        self.group = group
        self.policy = policy
        self.timeout = timeout
        self.last_seen = now
        #: Entries with seq ≤ floor are not (or no longer) in this cache.
        self.floor = floor

    def first(self, cap: int, now: float | None) -> int:
        """Index in the group log of this cache's oldest event."""
        g, pol = self.group, self.policy
        log = g.log
        lo = max(g.head, len(log) - min(pol.max_count or cap, cap))
        lo = bisect_right(log, self.floor, lo, key=_seq)
        if now is not None and pol.max_age is not None:
            lo = bisect_left(log, now - pol.max_age.total_seconds(), lo, key=_time)
        return lo


def _seq(entry: tuple[int, float, Event]) -> int:
    return entry[0]


def _time(entry: tuple[int, float, Event]) -> float:
    return entry[1]


def _check_timeout(timeout: float) -> float:
    if type(timeout) not in (int, float) or not 0 < timeout <= MAX_KEEPALIVE_TIMEOUT:
        raise UsageError(
            f"a cache keep-alive timeout must be more than 0 and at most "
            f"{MAX_KEEPALIVE_TIMEOUT:.0f} seconds, not {timeout!r}"
        )
    return float(timeout)


class ClientCaches:
    """Every client cache of one router.

    >>> caches = ClientCaches()
    >>> hot = lambda e: e.values.get("t", 0) > 30
    >>> caches.register("c1", hot, ExpiryPolicy(max_count=100), timeout=60, now=0.0)
    True
    >>> caches.offer(Event(values={"t": 35}, id="e1"), now=1.0)
    1
    >>> got = caches.fetch("c1", now=2.0)
    >>> [e.id for e in got.events], caches.ack("c1", got.cursor)
    (['e1'], 1)
    """

    __slots__ = ("max_caches", "max_events", "_caches", "_groups", "_seq", "matcher_errors")

    def __init__(
        self, *, max_caches: int = MAX_CLIENT_CACHES, max_events_per_cache: int = MAX_EVENTS_PER_CACHE
    ) -> None:
        if type(max_caches) is not int or max_caches < 1:
            raise UsageError("max_caches must be a positive int")
        if type(max_events_per_cache) is not int or max_events_per_cache < 1:
            raise UsageError("max_events_per_cache must be a positive int")
        self.max_caches = max_caches
        self.max_events = max_events_per_cache
        self._caches: dict[str, _Cache] = {}
        self._groups: dict[Hashable, _Group] = {}
        self._seq = 0
        #: Times a matcher raised (the event is then taken as not matching).
        self.matcher_errors = 0

    def __len__(self) -> int:
        return len(self._caches)

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._caches

    # -- registration -------------------------------------------------------------------------

    def register(
        self,
        client_id: str,
        matcher: Callable[[Event], bool],
        policy: ExpiryPolicy,
        timeout: float,
        now: float,
        *,
        key: Hashable | None = None,
    ) -> bool:
        """Create or update *client_id*'s cache; True when it is new.

        *matcher* decides which events the cache takes; caches with the same *key*
        (default: the matcher object itself) share one evaluation per event, so the router
        passes its one compiled instance per distinct pattern, or the pattern's identity
        as key. Registering again with the same key updates the policy and timeout and
        keeps the events; with another key the cache starts afresh, empty. Counts as a
        keep-alive. Raises `UsageError` for a bad timeout or when `max_caches` exist.
        """
        if type(client_id) is not str or not client_id:
            raise UsageError("a client cache needs a client id")
        if not isinstance(policy, ExpiryPolicy):
            raise UsageError("a client cache needs an ExpiryPolicy")
        timeout = _check_timeout(timeout)
        gkey = matcher if key is None else key
        old = self._caches.get(client_id)
        if old is not None and old.group.key == gkey:
            old.policy, old.timeout, old.last_seen = policy, timeout, now
            old.group.retune(self.max_events)
            return False
        if old is None and len(self._caches) >= self.max_caches:
            raise UsageError(f"this router already keeps {self.max_caches} client caches, its limit")
        if old is not None:
            self._leave(old)
        group = self._groups.get(gkey)
        if group is None:
            group = self._groups[gkey] = _Group(gkey, matcher)
        cache = _Cache(client_id, group, policy, timeout, now, floor=self._seq)
        group.members[client_id] = cache
        group.retune(self.max_events)
        self._caches[client_id] = cache
        return old is None

    def keepalive(self, client_id: str, now: float) -> bool:
        """Push back *client_id*'s cache's removal; False when there is no such cache."""
        cache = self._caches.get(client_id)
        if cache is None:
            return False
        cache.last_seen = max(cache.last_seen, now)
        return True

    def set_policy(self, client_id: str, policy: ExpiryPolicy) -> None:
        """Change the cache's expiry policy; it applies to the events already kept too.
        Raises `UnknownCache`."""
        cache = self._need(client_id)
        cache.policy = policy
        cache.group.retune(self.max_events)

    def clear(self, client_id: str) -> None:
        """Empty the cache (it stays registered). Raises `UnknownCache`."""
        self._need(client_id).floor = self._seq

    def remove(self, client_id: str) -> bool:
        """Remove the cache and its events; False when there was none."""
        cache = self._caches.pop(client_id, None)
        if cache is None:
            return False
        self._leave(cache)
        return True

    def _leave(self, cache: _Cache) -> None:
        group = cache.group
        del group.members[cache.client_id]
        if group.members:
            group.retune(self.max_events)
        else:
            del self._groups[group.key]

    def info(self, client_id: str) -> CacheInfo:
        """What *client_id*'s cache is. Raises `UnknownCache`."""
        c = self._need(client_id)
        return CacheInfo(
            client_id=client_id,
            policy=c.policy,
            timeout=c.timeout,
            last_seen=c.last_seen,
            size=len(c.group.log) - c.first(self.max_events, None),
        )

    def _need(self, client_id: str) -> _Cache:
        cache = self._caches.get(client_id)
        if cache is None:
            raise UnknownCache(f"no event cache is registered for client {client_id!r}")
        return cache

    # -- events -------------------------------------------------------------------------------

    def offer(self, event: Event, now: float, *, keys: Iterable[Hashable] | None = None) -> int:
        """Add *event* to every cache whose pattern accepts it; how many caches took it.

        Each distinct pattern is evaluated once. A matcher that raises is taken as "no"
        (counted in `matcher_errors`): one broken pattern must not stop dispatch. With
        *keys*, the caller has matched the event already (an index over equality patterns,
        say): it goes to the groups with those keys, and no matcher is called.
        """
        seq = self._seq + 1
        taken = 0
        if keys is not None:
            for key in keys:
                group = self._groups.get(key)
                if group is not None:
                    group.append(seq, now, event)
                    taken += len(group.members)
            if taken:
                self._seq = seq
            return taken
        for group in self._groups.values():
            try:
                accepted = group.matcher(event)
            except Exception:
                self.matcher_errors += 1
                log.debug("client cache matcher %r raised", group.key, exc_info=True)
                continue
            if accepted:
                group.append(seq, now, event)
                taken += len(group.members)
        if taken:
            self._seq = seq
        return taken

    def fetch(
        self,
        client_id: str,
        *,
        now: float,
        after: int | None = None,
        since: float | None = None,
        limit: int | None = None,
    ) -> Fetched:
        """The cache's events, oldest first: those after cursor *after*, taken at or after
        *since* (same clock as `now`), at most *limit*. Fetching removes nothing: `ack`
        does. Raises `UnknownCache`, or `UsageError` for a bad limit."""
        if limit is not None and (type(limit) is not int or limit < 0):
            raise UsageError(f"limit must be a non-negative int or None, not {limit!r}")
        cache = self._need(client_id)
        log = cache.group.log
        lo = cache.first(self.max_events, now)
        start = cache.floor
        if after is not None:
            lo = bisect_right(log, after, lo, key=_seq)
            start = max(start, after)
        if since is not None:
            lo = bisect_left(log, since, lo, key=_time)
        hi = len(log) if limit is None else min(len(log), lo + limit)
        if hi > lo:
            return Fetched(events=[e for _, _, e in log[lo:hi]], cursor=log[hi - 1][0], more=hi < len(log))
        return Fetched(events=[], cursor=start, more=False)

    def ack(self, client_id: str, upto: int | str) -> int:
        """Remove from the cache every event up to and including *upto*: a cursor from
        `fetch`, or an event id (cursors are per router; ids hold across the mesh). An id
        not in the cache removes nothing. Returns the cache's new floor (a cursor).
        Raises `UnknownCache`."""
        cache = self._need(client_id)
        if type(upto) is int:
            cache.floor = max(cache.floor, min(upto, self._seq))
        elif type(upto) is str:
            log = cache.group.log
            for i in range(len(log) - 1, cache.first(self.max_events, None) - 1, -1):
                if log[i][2].id == upto:
                    cache.floor = max(cache.floor, log[i][0])
                    break
        else:
            raise UsageError(f"ack takes a cursor (int) or an event id (str), not {upto!r}")
        return cache.floor

    def expire(self, now: float) -> list[str]:
        """Remove caches whose keep-alive lapsed at *now*, drop events past every age limit
        and events all members acknowledged; the ids of the removed caches."""
        gone = [c.client_id for c in self._caches.values() if now - c.last_seen > c.timeout]
        for client_id in gone:
            self.remove(client_id)
            log.info("client cache of %r removed: no keep-alive", client_id)
        for group in self._groups.values():
            group.trim(now)
        return gone
