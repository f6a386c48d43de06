"""Client event caches (Å §4.5) — pure: no I/O; every deadline takes `now` (float seconds,
any monotonic clock the caller keeps).

A client that is often away asks the mesh to keep the events matching its pattern for it,
under its own expiry policy (age, count), and keeps the cache alive by sending keep-alives;
it later fetches what was kept and acknowledges what it has handled. The registration,
keep-alives and acks flood the mesh, so every router keeps the same cache and the client
may come back through any of them (the router does the flooding; this module is one
router's copy).

Cost. Every dispatched event is offered to the caches, so `offer` must not grow with the
number of caches (Performance in the manual has the throughput with 1,000 of them). Caches are
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

Order (what lets replicas converge, `aa.router.caches.sync`). A log is kept in one
order that every router computes alike: the event's time stamp (set by the router the event
entered the mesh at; `now` for an event without one), then the id (shorter first, so the
``prefix-counter`` ids of one publisher's batch, which share a time stamp, keep their
order). Count and age limits and acknowledgements are taken in that order, so two routers
holding the same events keep the same ones. A cache's *floor* is a mark in that order —
``(time, len(id), id)`` — not a position: "everything up to and including this event" means
the same thing on a router that never saw the event. An event arriving late (a repair, or
a flood copy from a router whose clock is behind) is inserted at its place, and the entries
after it are given fresh sequence numbers, so a client's cursor never skips it (it may get
those few entries twice; clients de-duplicate by id). An id already in a group's log is not
taken again: the flood and a repair may both bring the same event.

Sequence numbers (cursors) are one counter for all caches of this router, so a cursor stays
meaningful for a client whose cache changes policy. They are this router's own: a client
that comes back through another router acknowledges by event id (`ack(client, "id")`),
which every router knows.

Expiry (the risky part): `expire(now)` removes the caches whose keep-alive lapsed
(`now - last keep-alive > timeout`) and drops log entries older than any member's age
limit; between sweeps, `fetch` filters by age itself, so a client never gets an event past
its age. Age is the event's time stamp's, so `now` is wall-clock seconds (the router passes
`time.time()`); the log being in time order is what lets `fetch` find the age boundary by
bisection.
"""

from __future__ import annotations

import logging
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from aa.mesh import (
    Event,
    UnknownCache,  # the tree's; re-exported here
    UsageError,
)

from ..store import ExpiryPolicy, id_hash
from .compact import shrunk
from .grouplog import Group, Mark, Member, entry_mark, entry_seq, entry_time, mark_of, time_of

__all__ = [
    "ClientCaches",
    "Fetched",
    "CacheInfo",
    "UnknownCache",
    "MAX_CLIENT_CACHES",
    "MAX_EVENTS_PER_CACHE",
    "MAX_KEEPALIVE_TIMEOUT",
    "Mark",
    "mark_of",
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
        self,
        *,
        max_caches: int = MAX_CLIENT_CACHES,
        max_events_per_cache: int = MAX_EVENTS_PER_CACHE,
    ) -> None:
        if type(max_caches) is not int or max_caches < 1:
            raise UsageError("max_caches must be a positive int")
        if type(max_events_per_cache) is not int or max_events_per_cache < 1:
            raise UsageError("max_events_per_cache must be a positive int")
        self.max_caches = max_caches
        self.max_events = max_events_per_cache
        self._caches: dict[str, Member] = {}
        self._groups: dict[Hashable, Group] = {}
        self._seq = 0
        #: Times a matcher raised (the event is then taken as not matching).
        self.matcher_errors = 0

    def __len__(self) -> int:
        return len(self._caches)

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._caches

    @property
    def events_held(self) -> int:
        """Events the caches hold (a group's shared log once, past its dead prefix)."""
        return sum(len(g.log) - g.head for g in self._groups.values())

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
        floor: Mark | None = None,
    ) -> bool:
        """Create or update *client_id*'s cache; True when it is new.

        *matcher* decides which events the cache takes; caches with the same *key*
        (default: the matcher object itself) share one evaluation per event, so the router
        passes its one compiled instance per distinct pattern, or the pattern's identity
        as key. Registering again with the same key updates the policy and timeout and
        keeps the events; with another key the cache starts afresh, empty: with the events
        after *floor* (a mark, from another router's copy), by default those after *now*.
        Counts as a keep-alive. Raises `UsageError` for a bad timeout or when `max_caches` exist.
        """
        if type(client_id) is not str or not client_id:
            raise UsageError("a client cache needs a client id")
        if not isinstance(policy, ExpiryPolicy):
            raise UsageError("a client cache needs an ExpiryPolicy")
        timeout = _check_timeout(timeout)
        gkey = matcher if key is None else key
        old = self._caches.get(client_id)
        if old is not None and old.group.key == gkey:
            old.policy, old.timeout, old.last_seen = policy, timeout, max(old.last_seen, now)
            if floor is not None and (old.floor is None or floor > old.floor):
                old.set_floor(floor, self.max_events)
            old.group.retune(self.max_events)
            return False
        if old is None and len(self._caches) >= self.max_caches:
            raise UsageError(
                f"this router already keeps {self.max_caches} client caches, its limit"
            )
        if old is not None:
            self._leave(old)
        group = self._groups.get(gkey)
        if group is None:
            group = self._groups[gkey] = Group(gkey, matcher)
        start = floor if floor is not None else mark_of(now, "")
        if floor is None and group.log:
            start = max(start, entry_mark(group.log[-1]))
        cache = Member(client_id, group, policy, timeout, now, floor=start)
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

    def clear(self, client_id: str, now: float | None = None) -> Mark | None:
        """Empty the cache (it stays registered): every event it holds and, with *now*, any
        stamped before *now* yet to come. Its new floor. Raises `UnknownCache`."""
        cache = self._need(client_id)
        log = cache.group.log
        marks = ([entry_mark(log[-1])] if log else []) + ([] if now is None else [mark_of(now, "")])
        if marks:
            self.ack_mark(client_id, max(marks))
        return cache.floor

    def ack_mark(self, client_id: str, mark: Mark) -> None:
        """Drop the cache's events up to and including *mark* (another router's floor).
        Raises `UnknownCache`."""
        cache = self._need(client_id)
        if cache.floor is None or mark > cache.floor:
            cache.set_floor(mark, self.max_events)

    def floor(self, client_id: str) -> Mark | None:
        """The cache's floor (a mark: see the module docstring). Raises `UnknownCache`."""
        return self._need(client_id).floor

    def remove(self, client_id: str) -> bool:
        """Remove the cache and its events; False when there was none."""
        cache = self._caches.pop(client_id, None)
        if cache is None:
            return False
        self._caches = shrunk(self._caches)
        self._leave(cache)
        return True

    def _leave(self, cache: Member) -> None:
        group = cache.group
        del group.members[cache.client_id]
        if group.members:
            group.members = shrunk(group.members)
            group.retune(self.max_events)
        else:
            del self._groups[group.key]
            self._groups = shrunk(self._groups)

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

    def dropped(self, client_id: str, now: float) -> int:
        """Events *client_id*'s cache took and lost unacknowledged to its count or age limit
        since it was registered here: what its client missed while away although it had a
        cache (`aa.router.caches.grouplog`). Raises `UnknownCache`."""
        return self._need(client_id).dropped(self.max_events, now)

    def _need(self, client_id: str) -> Member:
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
        taken = 0
        # One sequence number for the event in every cache that takes it (the HTTP feed merges
        # a client's caches by it); a late insertion's renumbering draws fresh ones after it.
        self._seq += 1
        seq = self._seq
        if keys is not None:
            for key in keys:
                group = self._groups.get(key)
                if group is not None and self._put(group, event, now, seq):
                    taken += len(group.members)
            return taken
        for group in self._groups.values():
            try:
                accepted = group.matcher(event)
            except Exception:
                self.matcher_errors += 1
                log.debug("client cache matcher %r raised", group.key, exc_info=True)
                continue
            if accepted and self._put(group, event, now, seq):
                taken += len(group.members)
        return taken

    def insert(self, client_id: str, event: Event, now: float, *, checked: bool = False) -> bool:
        """Put *event* (another router's copy of it) in
        *client_id*'s cache at its place; False when the cache has it, has acknowledged it,
        or would not keep it (too old, past the count, not matching its pattern, no id).
        *checked*: its pattern took it already (a pattern run in a worker, `matcher_of`).
        Raises `UnknownCache`."""
        cache = self._need(client_id)
        eid = event.id
        if not eid:
            return False  # no id, no de-duplication: not from a router
        t = time_of(event, now)
        if cache.floor is not None and mark_of(t, eid) <= cache.floor:
            return False
        try:  # trust no peer with what a client's cache holds: its pattern must take it
            if not checked and not cache.group.matcher(event):
                return False
        except Exception:
            self.matcher_errors += 1
            return False
        self._seq += 1
        return self._put(cache.group, event, now, self._seq)

    def matcher_of(self, client_id: str) -> Any:
        """The matcher of *client_id*'s pattern (`remote` when it runs in a worker, whose
        events `insert` cannot check itself). Raises `UnknownCache`."""
        return self._need(client_id).group.matcher

    def _put(self, group: Group, event: Event, now: float, seq: int) -> bool:
        """Insert *event* in *group*'s log at its mark; False if not taken (see `insert`)."""
        eid = event.id or ""
        if eid and eid in group.ids:
            return False
        t = time_of(event, now)
        if group.max_age is not None and t < now - group.max_age:
            return False
        log = group.log
        mark = mark_of(t, eid)
        if not log or entry_mark(log[-1]) <= mark:
            log.append((seq, t, mark[1], eid, event))
        else:
            i = bisect_right(log, mark, group.head, key=entry_mark)
            if len(log) - i >= group.keep:
                return False  # older than every entry a member may keep
            # Late: in at its place, and fresh seqs for what follows, so no cursor skips it.
            tail = [(0, t, mark[1], eid, event), *log[i:]]
            del log[i:]
            for _, at, id_length, late_id, late in tail:
                self._seq += 1
                log.append((self._seq, at, id_length, late_id, late))
        if eid:
            group.ids.add(eid)
        group.settle(now)
        return True

    def view(self, client_id: str, now: float) -> list[Event]:
        """Every event the cache holds at *now*, in its order (what a full `fetch` returns)."""
        return self.fetch(client_id, now=now).events

    def id_digests(self, client_ids: Iterable[str], now: float) -> dict[str, tuple[int, int]]:
        """Per cache of *client_ids* (unknown ones left out): the count and the XOR of the id
        hashes of what `view` holds at *now*. A cache's events are a tail of its group's log,
        so each log is hashed once, from its end, however many caches share it."""
        tails: dict[int, list[int]] = {}
        out: dict[str, tuple[int, int]] = {}
        for client_id in client_ids:
            cache = self._caches.get(client_id)
            if cache is None:
                continue
            group, lo = cache.group, cache.first(self.max_events, now)
            xors = tails.get(id(group))
            if xors is None:
                log, acc = group.log, 0
                xors = [0] * (len(log) + 1)
                for i in range(len(log) - 1, group.head - 1, -1):
                    acc ^= id_hash(log[i][4].id or "")
                    xors[i] = acc
                tails[id(group)] = xors
            out[client_id] = (len(group.log) - lo, xors[lo])
        return out

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
        start = self._cursor(cache)
        if after is not None:
            lo = bisect_right(log, after, lo, key=entry_seq)
            start = max(start, after)
        if since is not None:
            lo = bisect_left(log, since, lo, key=entry_time)
        hi = len(log) if limit is None else min(len(log), lo + limit)
        if hi > lo:
            return Fetched(
                events=[e[4] for e in log[lo:hi]], cursor=log[hi - 1][0], more=hi < len(log)
            )
        return Fetched(events=[], cursor=start, more=False)

    def ack(self, client_id: str, upto: int | str) -> int:
        """Remove from the cache every event up to and including *upto*: a cursor from
        `fetch`, or an event id (cursors are per router; ids hold across the mesh). An id
        not in the cache removes nothing. Returns the cache's new floor (a cursor).
        Raises `UnknownCache`."""
        cache = self._need(client_id)
        log = cache.group.log
        if type(upto) is int:
            i = bisect_right(log, upto, cache.group.head, key=entry_seq) - 1
            if i >= cache.group.head:
                self.ack_mark(client_id, entry_mark(log[i]))
        elif type(upto) is str:
            for i in range(len(log) - 1, cache.first(self.max_events, None) - 1, -1):
                if log[i][3] == upto:
                    self.ack_mark(client_id, entry_mark(log[i]))
                    break
        else:
            raise UsageError(f"ack takes a cursor (int) or an event id (str), not {upto!r}")
        return self._cursor(cache)

    def _cursor(self, cache: Member) -> int:
        """Cursor of the cache's floor: the seq of the last entry at or below it."""
        log = cache.group.log
        if cache.floor is None:
            return 0
        i = bisect_right(log, cache.floor, key=entry_mark) - 1
        return log[i][0] if i >= 0 else 0

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
