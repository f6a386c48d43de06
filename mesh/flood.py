"""The flooding rules of the router mesh (pure: no I/O, no asyncio; time is passed in).

Å §4.1: a router that receives an event from a client stamps it with a globally unique id and
sends it to every router it is connected to; each of those does the same, until the event has
passed through every router or its hop counter has run out. Routers drop ids they have seen.
This module holds those rules and nothing else; the router owns the sockets.

Three mechanisms, and what each one is for
------------------------------------------

1. **Seen ids (de-duplication) — what makes delivery exactly-once.** Every flooded thing (an
   event, or a `Control` message) carries an id fixed once, at its origin. A router records the
   id the first time it meets it *before* it dispatches or forwards anything, and drops every
   later copy unread. Dispatch happens only on that first meeting, so a router dispatches a
   given id at most once, however many copies reach it and by whatever routes: a line (one
   route), a ring (two routes, the copies meet somewhere and the later one is dropped), a full
   mesh (n-1 routes into every router), or any graph with cycles (a copy that goes round a
   cycle and comes back is a copy of a seen id). Nothing here depends on the shape of the
   graph or on the order copies arrive in: the check is local and the first copy wins.

   *At least* once follows from forwarding: the origin sends to all its peers, and every router
   that sees an id for the first time sends it to all its peers but the ones on its path
   (rule 2), while the ttl lasts (rule 3). A copy only ever travels a simple route (rule 2: it
   never enters a router on its path), so no copy needs more than n-1 hops in a mesh of n
   routers. Hence: in a connected mesh of at most `initial_ttl + 1` routers, each router
   dispatches each event exactly once, whatever the timing. In a bigger mesh, a router that
   first hears a copy over a long detour forwards it with what is left of the ttl, and drops
   the later copy that came the short way; so a router `ttl` hops away may be missed when
   copies race badly (when they travel at similar speeds, the first copy comes the short way
   and every router within `ttl` hops is reached). A large ttl costs nothing in messages
   (rule 1 does the work), which is why the default is generous. Links are TCP, so copies are
   not lost in transit; a copy in flight on a connection that breaks is lost, and the other
   routes (if any) carry the event instead.

   The seen set is bounded (a peer can make it grow): it keeps each id until `max_age / 2`
   has passed or `max_ids / 2` later ids have come (whichever happens first), never longer
   than `max_age`, and never more than `max_ids` ids (see `SeenIds`). Exactly-once holds as
   long as every copy of an id reaches a router within that window after the first one;
   copies race round the mesh in milliseconds to seconds, far inside it. Should a copy ever
   arrive after its id was forgotten, rule 2 still catches it if it passed this router.

2. **The path — what keeps the message count down (and a second guard against loops).** Each
   copy carries the ids of the routers it has passed, origin first. A router never forwards to
   a router on the path (it has the event already) nor back to the peer it came from (the last
   entry of the path); and a router that finds its own id on an incoming path drops the copy
   (it went round a cycle). The path is not needed for correctness (rule 1 suffices) but saves
   messages: on a line every link carries the event once (n-1 messages), not twice.

3. **The ttl — the safety net that bounds every flood.** The ttl on a copy is the number of
   hops it may still make from the router holding it. The origin stamps `initial_ttl`; each
   router that receives a copy counts the hop it just made (ttl - 1) and forwards only while
   the result is above zero. Even if every router forgot every id, no copy could travel more
   than `initial_ttl` hops (nor more than n-1, by rule 2), so a flood always ends. The same
   rule bounds the path's length.

Message count: a router forwards an id at most once (on its first meeting), to at most all of
its peers; so a flood costs at most one message per direction of each link, 2·E in all, and at
least n-1 (a spanning tree). Copies beyond n-1 are the duplicates that rule 1 drops.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from typing import Final, NamedTuple

from .errors import MalformedFrame, UsageError
from .event import MAX_ID_LENGTH

__all__ = [
    "SeenIds",
    "FloodRules",
    "Hop",
    "check_flood_meta",
    "SEEN_IDS_MAX",
    "SEEN_IDS_MAX_AGE",
    "CONTROL_IDS_MAX",
    "CONTROL_IDS_MAX_AGE",
    "DEFAULT_TTL",
    "MAX_TTL",
    "MAX_PATH_LENGTH",
]

#: Most ids a router remembers, in ids. Each costs about 100 bytes (the id string and its slot
#: in a set), so the cap bounds the set near 100 MB. At 50,000 events/s a window of 1,000,000
#: ids is 20 s: still a thousand times longer than a flood takes to cross a mesh.
SEEN_IDS_MAX: Final = 1_000_000
#: Longest time an id is remembered, in seconds. Covers a client that re-publishes (same id)
#: on another router after a fail-over, which takes seconds to minutes.
SEEN_IDS_MAX_AGE: Final = 300.0
#: Most control-message ids a router remembers, in ids (about 10 MB), in a set of their own
#: (`FloodRules.for_controls`): controls come from routers (cache registrations and their
#: keep-alives, quench, interests, addresses), so a client that floods cache requests, or a
#: peer that floods controls, fills this set and not the events' (whose ids it would push out
#: early), and costs bounded memory on a lone router as on a mesh. A mesh sends a few controls
#: a second per router; 100,000 is minutes of a flood of thousands a second.
CONTROL_IDS_MAX: Final = 100_000
#: Longest time a control id is remembered, in seconds. A control's id is made by its router
#: and never re-sent after a fail-over (unlike an event's), so it only needs to outlast the
#: copies racing round the mesh: seconds.
CONTROL_IDS_MAX_AGE: Final = 60.0
#: Hops an event may make from its origin, in hops. Reaching every router whatever the timing
#: needs n-1 for n routers (see the module doc); Å meshes are dozens of routers. A large ttl
#: costs no messages: only the path of a copy that really makes many hops grows.
DEFAULT_TTL: Final = 64
#: Largest ttl accepted from a peer, in hops; a larger one is clamped. Bounds the path length.
MAX_TTL: Final = 255
#: Longest path accepted from a peer, in router ids: one per hop, plus the origin.
MAX_PATH_LENGTH: Final = MAX_TTL + 1


#: The key of its own each generation of `SeenIds` holds (see there): no id is this object.
_KEYED: Final = object()


def _generation() -> dict[Hashable, None]:
    return {_KEYED: None}


class SeenIds:
    """The ids met recently, bounded by count and by age; O(1) per check.

    Two generations of sets: new ids go into `current`; when `current` holds `max_ids / 2` ids
    or is `max_age / 2` old, it becomes `previous` and the old `previous` is dropped whole;
    `previous` is also dropped as soon as it began `max_age` ago. An id is looked up in both.
    Hence every id is kept until `max_age / 2` has passed or `max_ids / 2` later ids have
    come (whichever happens first), and never longer than `max_age`; at most `max_ids` ids are
    ever kept. (An exact sliding window, an
    OrderedDict of id → time, costs three times the memory and twice the time per check, for a
    window edge nobody needs to be sharp.)

    The generations are dicts of id → None, not sets: the collector always walks a set, but
    leaves a dict of strings and None untracked, so a full pass stays short (as much memory,
    as fast a lookup). A busy client makes full passes often, a router rarely. Each holds one
    key of its own besides the ids (`_KEYED`, not a str): a dict whose keys are all strings
    keeps no hashes in its entries, so a miss (every new id) reads the object of each key it
    probes, a cache miss apiece in a large generation; with one other key the dict keeps each
    entry's hash, and stays untracked. The counts leave that key out.

    >>> seen = SeenIds(max_ids=4, max_age=10.0)
    >>> seen.check("a", now=0.0), seen.check("a", now=1.0)
    (True, False)
    >>> seen.check("a", now=10.0)   # forgotten: max_age old
    True
    """

    __slots__ = (
        "max_ids",
        "max_age",
        "_half_ids",
        "_half_age",
        "_current",
        "_previous",
        "_started",
        "_previous_started",
        "_deadline",
    )

    def __init__(self, *, max_ids: int = SEEN_IDS_MAX, max_age: float = SEEN_IDS_MAX_AGE) -> None:
        if type(max_ids) is not int or max_ids < 2:
            raise UsageError("max_ids must be an int of at least 2")
        if not max_age > 0:
            raise UsageError("max_age must be positive (seconds)")
        self.max_ids = max_ids
        self.max_age = float(max_age)
        self._half_ids = max_ids // 2
        self._half_age = self.max_age / 2
        self._current = _generation()
        self._previous = _generation()
        self._started = -math.inf  # when `current` began (monotonic seconds)
        self._previous_started = -math.inf  # when `previous` began
        self._deadline = -math.inf  # the next time a generation must move: checked per call

    def check(self, id: Hashable, now: float) -> bool:
        """True if *id* is new (and remember it from now on); False if seen before.

        *now* is monotonic time in seconds.
        """
        current = self._current
        if now >= self._deadline or len(current) > self._half_ids:  # `_KEYED` and the ids
            self._age(now)
            current = self._current
        if id in current or id in self._previous:
            return False
        current[id] = None
        return True

    def check_many(self, ids: Sequence[Hashable], now: float) -> list[bool]:
        """`check` of each of *ids*, in order (an id twice in *ids*: the second is seen),
        in one call: a relayed group's ids. Exactly what `check` of each would say.

        >>> SeenIds().check_many(["a", "b", "a"], now=0.0)
        [True, True, False]
        """
        current = self._current
        if now >= self._deadline or len(current) - 1 + len(ids) > self._half_ids:
            return [self.check(id, now) for id in ids]  # a generation moves on the way
        previous = self._previous
        out = []
        for id in ids:
            if id in current or id in previous:
                out.append(False)
            else:
                current[id] = None
                out.append(True)
        return out

    def __contains__(self, id: object) -> bool:
        """Whether *id* is remembered (ages are only applied by `check` and `expire`)."""
        return id in self._current or id in self._previous

    def __len__(self) -> int:
        return len(self._current) + len(self._previous) - 2  # less their `_KEYED`

    def expire(self, now: float) -> None:
        """Apply the age limit now, without checking an id (for an idle router)."""
        if now >= self._deadline:
            self._age(now)

    def _age(self, now: float) -> None:
        if now - self._started >= self._half_age or len(self._current) > self._half_ids:
            self._previous, self._previous_started = self._current, self._started
            self._current, self._started = _generation(), now
        if now - self._previous_started >= self.max_age:
            # Its oldest id may be max_age old: drop the whole generation.
            self._previous, self._previous_started = _generation(), now
        self._deadline = min(self._started + self._half_age, self._previous_started + self.max_age)


class Hop(NamedTuple):
    """What a router does with a flooded thing it has accepted.

    A NamedTuple, not a dataclass: one is made per event on the hot path.
    """

    #: Hops the copy may still make from this router; forward only if above zero.
    ttl: int
    #: Router ids passed, origin first and this router last. Put it on forwarded copies.
    path: list[str]


_new_tuple = tuple.__new__


def check_flood_meta(ttl: object, path: object) -> None:
    """Raise `MalformedFrame` unless *ttl* and *path* are a well-formed ttl and path."""
    if type(ttl) is not int:
        raise MalformedFrame(f"flood ttl must be an int, not {type(ttl).__name__}")
    if type(path) is not list and type(path) is not tuple:
        raise MalformedFrame(f"flood path must be a list, not {type(path).__name__}")
    if not 0 < len(path) <= MAX_PATH_LENGTH:
        raise MalformedFrame(f"flood path must hold 1 to {MAX_PATH_LENGTH} router ids")
    for hop in path:
        if type(hop) is not str or not 0 < len(hop) <= MAX_ID_LENGTH:
            raise MalformedFrame(
                f"flood path entries must be router ids of 1 to {MAX_ID_LENGTH} characters"
            )


class FloodRules:
    """The flooding rules for one router (see the module docstring for why they work).

    >>> rules = FloodRules("B")
    >>> hop = rules.receive("ev-1", ttl=16, path=["A"], now=0.0)
    >>> hop
    Hop(ttl=15, path=['A', 'B'])
    >>> rules.forward_to(hop, ["A", "C", "D"])
    ['C', 'D']
    >>> rules.receive("ev-1", ttl=15, path=["A", "C"], now=0.1) is None   # a duplicate
    True
    """

    __slots__ = ("router_id", "seen", "initial_ttl")

    def __init__(
        self, router_id: str, *, seen: SeenIds | None = None, initial_ttl: int = DEFAULT_TTL
    ) -> None:
        if type(router_id) is not str or not 0 < len(router_id) <= MAX_ID_LENGTH:
            raise UsageError(f"router_id must be a str of 1 to {MAX_ID_LENGTH} characters")
        if type(initial_ttl) is not int or not 0 <= initial_ttl <= MAX_TTL:
            raise UsageError(f"initial_ttl must be an int from 0 to {MAX_TTL}")
        self.router_id = router_id
        self.seen = seen if seen is not None else SeenIds()
        self.initial_ttl = initial_ttl

    def for_controls(self) -> FloodRules:
        """The same rules for control messages, over a seen set of their own, smaller and
        shorter-lived (`CONTROL_IDS_MAX`, `CONTROL_IDS_MAX_AGE`): a flood of controls can
        neither grow past it nor push events' ids out."""
        seen = SeenIds(max_ids=CONTROL_IDS_MAX, max_age=CONTROL_IDS_MAX_AGE)
        return FloodRules(self.router_id, seen=seen, initial_ttl=self.initial_ttl)

    def originate(self, id: str, now: float) -> Hop | None:
        """A new thing from a local client (or this router): the ttl and path to stamp on it.

        None if *id* was seen already: a client re-publishing, after a fail-over, an event that
        reached the mesh the first time. Drop it as a duplicate.
        """
        if not self.seen.check(id, now):
            return None
        # tuple.__new__ skips the NamedTuple's Python-level __new__: one per published event.
        return _new_tuple(Hop, (self.initial_ttl, [self.router_id]))

    def receive(self, id: str, ttl: int, path: Sequence[str], now: float) -> Hop | None:
        """A copy from a peer router: None to drop it unread (a duplicate), else the `Hop`.

        Dispatch the copy locally with the hop's ttl and path, then forward it to
        `forward_to(hop, peers)`. *ttl* and *path* must have passed `check_flood_meta`.
        This is `hop` (rules 2 and 3) then `first` (rule 1): the router's relay calls the
        same two for a whole flood group, with `all_seen` between them to drop a group of
        duplicates unread.
        """
        hop = self.hop(ttl, path)
        if hop is None or not self.first(id, now):
            return None
        return hop

    def hop(self, ttl: int, path: Sequence[str]) -> Hop | None:
        """Rules 2 and 3 for a copy (or a group of copies) from a peer: None if it went
        round a cycle back to us, else the ttl and path to dispatch and forward it with.

        Rule 3 counts the hop just made. A peer that sent an exhausted copy (ttl <= 0)
        broke the rule; the copy may still be a first one, so it is dispatched, but goes no
        further (ttl 0). A ttl over `MAX_TTL` is clamped.
        """
        me = self.router_id
        if me in path:
            return None  # went round a cycle back to us (rule 2); also caught by rule 1
        left = (ttl if ttl <= MAX_TTL else MAX_TTL) - 1
        new_path = list(path)
        new_path.append(me)
        return Hop(left if left > 0 else 0, new_path)

    def first(self, id: str, now: float) -> bool:
        """Rule 1: record *id* and say whether this is the first copy met (dispatch it) or a
        later one (drop it). The only place an id is recorded for a peer's copy."""
        return self.seen.check(id, now)

    def first_many(self, ids: Sequence[str], now: float) -> list[bool]:
        """`first` of each of *ids*, in order, in one call (a relayed group's)."""
        return self.seen.check_many(ids, now)

    def all_seen(self, ids: Iterable[str]) -> bool:
        """Whether every one of *ids* was met before: a group of copies to drop without
        reading it. Records nothing, so it can only ever drop ids `first` recorded (at worst
        it treats an id about to age out as still seen, as a check a moment earlier would)."""
        seen = self.seen
        return all(eid in seen for eid in ids)

    @staticmethod
    def forward_to(hop: Hop, peers: Iterable[str], came_from: str | None = None) -> list[str]:
        """The peers (router ids) to send the copy to: none once the ttl is spent, else every
        connected peer that is not on the path (which holds the peer it came from) and not
        *came_from* (for a peer whose copy carried a path without it, against the rules)."""
        if hop.ttl <= 0:
            return []
        path = hop.path
        return [p for p in peers if p not in path and p != came_from]
