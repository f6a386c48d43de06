"""Interest routing: what each router wants, and where an event must go (pure: no I/O, no
asyncio; time is passed in).

Flooding sends every event to every router. Interest routing sends an event on a link only
if some router reached through that link may want it. Three parts, all here; the router
owns the sockets and the control flood that carries the summaries (`aa.router.links`).

1. **Interest** — one router's summary: a set of `InterestFilter`s, each a conjunction of
   *necessary* conditions (an event type, equalities of values with constants, names that
   must be present, "persisted", "not opted out of the mesh cache"), or "anything". A
   filter says "may match": an event it rejects is one the router's subscribers, store and
   caches can never want; an event it accepts may still match nothing there. Filters are
   merged and covered (`InterestFilter.covers`: a filter that accepts every event another
   accepts replaces it), so a thousand subscribers of ``type == "hot"`` cost one filter.
   Every count is capped (the constants below); past a cap a summary widens — filters to
   their types, then to "anything" — never grows. Widening only ever forwards more.

2. **The view** (`MeshInterests`) — every router's links and interest, as flooded by each
   of them. The graph keeps an edge only when both ends claim it. For an event from router
   *s*, every router computes the same shortest-path tree rooted at *s* (breadth-first,
   neighbours in order of router id: the deterministic tie-break), and forwards it to the
   children of its own node whose subtree holds a router whose interest may match. The
   subtree interests are folded bottom-up once per (view, source) and cached.

3. **Safety** (`InterestTable`) — a router forwards by the tree only when it is sure:

   - the view is *complete*: every router named as a peer has told its own links and
     interest (else some router's links or interest are unknown to us). An edge counts
     only when both its ends claim it: a router's word on its own links wins, so the stale
     summary of a router that died (still claiming links its neighbours dropped) leaves
     it outside the graph until it is forgotten, and a link one end has not yet told of
     is not used (both ends, and everyone who heard of the change, flood meanwhile);
   - the view is *settled*: nothing changed for `SETTLE_TIME` (a link came or went here, a
     router's links or interest changed, a router appeared or was forgotten);
   - the copy came the tree's way: from this router's parent in the tree of its source (a
     copy from anywhere else means a router upstream floods, or sees another view);
   - the view is *confirmed*: every router it reaches has been heard from since it last came
     back into reach. A router that went out of reach (a partition, a link down) may have
     changed its summary meanwhile without our hearing; when the topology brings it back,
     its old summary completes the view but may be stale (a subscription made during a
     short partition). So until every router that came back into reach has told its summary
     again (the link ends hand over every summary they hold: `aa.router.links.interests`),
     or `CATCH_UP_TIME` has passed, the router floods.

   Otherwise it floods, as without interest routing. Why no event is lost to a change: a
   router that sees a change floods its new summary *at once* (before relaying any further
   event), and routers relay a control before the events that follow it on the same link
   (links are FIFO, controls are forwarded on first receipt). So every router a flooded
   copy reaches after a change has heard of the change first, is unsettled, and floods it
   on; by the time a router settles (`SETTLE_TIME` later, far longer than a flood takes to
   cross the mesh), every router holds the same view. What is still lost is what flooding
   would also lose on that link — a copy in flight to a router that dies — except that
   flooding had other copies on other routes: an event that was on its way *through* the
   router that died is lost for the routers behind it. A silent death (no TCP reset) is
   seen only after the link timeout.

An event reaches a subscriber whose router's interest was in the view of every router on
the way when the event passed there: "after subscribe() returned" means after the new
summary reached the publisher's router (one flood, milliseconds per hop).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, NamedTuple

import msgpack

from .errors import InvalidValue
from .event import MAX_ID_LENGTH, Event
from .interest_reach import Reach

__all__ = [
    "InterestFilter",
    "Interest",
    "MeshInterests",
    "InterestTable",
    "PERSISTED",
    "CACHED",
    "SETTLE_TIME",
    "CATCH_UP_TIME",
    "MAX_ROUTERS",
    "MAX_FILTERS",
    "MAX_TYPES",
    "MAX_CONSTRAINTS",
    "STORE_INTEREST",
    "CACHE_INTEREST",
]

#: Filter flag: the event asks to be persisted (meta ``persist: True``): a store's interest.
PERSISTED: Final = 1
#: Filter flag: the event is not opted out of the mesh cache (meta ``mesh_cache`` not False).
CACHED: Final = 2
_FLAGS: Final = PERSISTED | CACHED
#: The meta keys the flags read (the store's own names: `aa.router.store.expiry`).
_META_PERSIST: Final = "persist"
_META_MESH_CACHE: Final = "mesh_cache"

#: Filters beyond type-only ones in one summary, in filters. A summary crosses the mesh on
#: every change and is held by every router: 128 filters of a few constraints are a few KB.
#: A router whose subscribers need more widens its filters to their types.
MAX_FILTERS: Final = 128
#: Event types in one summary, in types; past it the summary is "anything". Sites have tens
#: of event types; a summary of hundreds is still a few KB.
MAX_TYPES: Final = 256
#: Equalities and names in one filter, each; a longer conjunction keeps its first ones (a
#: filter with fewer conditions accepts more: still sound).
MAX_CONSTRAINTS: Final = 4
#: Longest type, value name or string constant kept, in characters; a longer constant is
#: dropped from its filter (the filter accepts more), a longer type widens the filter.
MAX_TEXT: Final = 128
#: Filters of a subtree's folded interest (the union over many routers), in filters: past it
#: the subtree wants "anything" (its link carries every event).
MAX_FOLDED_FILTERS: Final = 1024
#: Seconds a router floods after any change of the view. Must exceed by far the time a
#: summary takes to cross the mesh (milliseconds per hop): routers then settle on one view.
SETTLE_TIME: Final = 1.0
#: Most seconds a router floods after routers came back into its reach, waiting for their
#: summaries (handed over by the link ends within a round trip and one flood): a summary that
#: is lost or slower than this is waited for no longer, and the router routes on its view.
CATCH_UP_TIME: Final = 2.0
#: Event types whose answer a tree remembers per router (`MeshInterests.forward_many`), in
#: types: sites have tens; past it the answers are forgotten and worked out again.
MAX_TYPE_ANSWERS: Final = 1024
#: Distinct answers one type's check keeps to share (`MeshInterests.forward_many`), in answers:
#: with several children to ask, events choose among as many sets of them as they like.
MAX_SHARED_ANSWERS: Final = 64
#: Trees kept per view (sources the router relays for), in trees: each holds a few entries
#: per router of the mesh.
MAX_TREES: Final = 256

#: The neighbours an event goes to, as `MeshInterests.forward_many` answers: a batch's events
#: that go the same way share one tuple.
Peers = tuple[str, ...]
#: Routers a view holds unless told otherwise (`MeshConfig.max_routers`), in routers; past
#: it the router floods. Each costs its summary (at most a few KB under the caps above,
#: about a hundred bytes for a typical one) and its entries in the trees kept.
MAX_ROUTERS: Final = 10_000
#: Trees kept times routers in the view, in tree entries: bounds the trees' memory (each
#: entry three dict slots, some 300 bytes with its share of the folded interests) whatever
#: the mesh's size. Below `MAX_TREES` trees a big mesh recomputes trees more often (one
#: breadth-first walk each), never holds more.
MAX_TREE_ENTRIES: Final = 500_000

#: Interests `Interest.from_wire_shared` keeps, by their packed wire form, in interests: while
#: a partition heals a router is handed each summary by many of its peers (the same one
#: each), and most routers of a mesh want the same few things or nothing, so a mesh of
#: thousands of routers holds a few hundred distinct interests. Past the bound (or
#: `MAX_DECODED_BYTES`) the cache starts again empty: a peer that sends ever new ones only
#: costs their decoding, as without the cache.
MAX_DECODED: Final = 4096
#: Packed bytes of the wire forms `Interest.from_wire_shared` keeps, in bytes: their
#: interests take about twice as much as objects, so the cache holds some 12 MB at most, even
#: when every summary is at the caps (up to a few hundred KB packed; typical ones are 40-110
#: bytes).
MAX_DECODED_BYTES: Final = 4 << 20

_MISSING: Final = object()
_CONSTANT_TYPES: Final = (str, int, float, bool)


class InterestFilter(NamedTuple):
    """Necessary conditions for an event to be wanted: all must hold.

    >>> f = InterestFilter(type="hot", eq=(("site", "a"),))
    >>> f.matches(Event(values={"site": "a", "t": 1}, type="hot"))
    True
    >>> f.matches(Event(values={"site": "b"}, type="hot"))
    False
    >>> InterestFilter(type="hot").covers(f)
    True
    """

    #: The event's type, or None for any type (and none).
    type: str | None = None
    #: (value name, constant) pairs, sorted: the event's value equals the constant (``==``
    #: on hashable values, as the predicate index compares).
    eq: tuple[tuple[str, Any], ...] = ()
    #: Value names the event must carry, sorted.
    has: tuple[str, ...] = ()
    #: `PERSISTED`, `CACHED`, or both.
    flags: int = 0

    def matches(self, event: Event) -> bool:
        """Whether *event* meets every condition (it *may* be wanted)."""
        if self.type is not None and event.type != self.type:
            return False
        flags = self.flags
        if flags:
            meta = event.meta
            if flags & PERSISTED and meta.get(_META_PERSIST) is not True:
                return False
            if flags & CACHED and meta.get(_META_MESH_CACHE) is False:
                return False
        values = event.values
        for name in self.has:
            if name not in values:
                return False
        for name, constant in self.eq:
            v = values.get(name, _MISSING)
            if v is _MISSING:
                return False
            try:
                hash(v)
            except TypeError:  # a list or a map equals no constant
                return False
            if v != constant:
                return False
        return True

    def covers(self, other: InterestFilter) -> bool:
        """Whether every event *other* accepts, this one accepts too."""
        if self.type is not None and self.type != other.type:
            return False
        if self.flags & ~other.flags:
            return False
        if any(pair not in other.eq for pair in self.eq):
            return False
        named = set(other.has)
        named.update(name for name, _ in other.eq)
        return all(name in named for name in self.has)

    @property
    def universal(self) -> bool:
        """Accepts every event."""
        return self.type is None and not self.eq and not self.has and not self.flags

    @classmethod
    def make(
        cls,
        *,
        type: str | None = None,
        eq: Iterable[tuple[str, Any]] = (),
        has: Iterable[str] = (),
        flags: int = 0,
    ) -> InterestFilter:
        """A filter with its conditions checked and capped: constants that are no str, int,
        float or bool (or too long), and conditions past `MAX_CONSTRAINTS`, are dropped —
        the filter then accepts more, never less. A type that is no str of at most
        `MAX_TEXT` characters means any type."""
        if type is not None and (not isinstance(type, str) or len(type) > MAX_TEXT):
            type = None
        pairs: dict[str, Any] = {}
        for name, c in eq:
            if name in pairs or not _name_ok(name) or not _constant_ok(c):
                continue
            pairs[name] = c
        names = sorted({n for n in has if _name_ok(n) and n not in pairs})
        return cls(
            type,
            tuple(sorted(pairs.items(), key=lambda kv: kv[0]))[:MAX_CONSTRAINTS],
            tuple(names[:MAX_CONSTRAINTS]),
            flags & _FLAGS,
        )


def _name_ok(name: object) -> bool:
    return type(name) is str and 0 < len(name) <= MAX_TEXT


def _constant_ok(c: object) -> bool:
    if type(c) not in _CONSTANT_TYPES:
        return False
    if type(c) is str:
        return len(c) <= MAX_TEXT
    return not (type(c) is float and not math.isfinite(c))


class Interest:
    """One router's interest (or a subtree's): "anything", or event types wanted whole
    plus filters. Immutable; build with `Interest.of` (merged, covered, capped).

    >>> hot = Interest.of([InterestFilter(type="hot"), InterestFilter(type="hot", has=("x",))])
    >>> hot.types, hot.filters
    (frozenset({'hot'}), frozenset())
    >>> hot.may_match(Event(values={}, type="cold"))
    False
    >>> Interest.ANYTHING.covers(hot), hot.covers(Interest.ANYTHING)
    (True, False)
    """

    __slots__ = ("anything", "types", "filters")

    ANYTHING: Interest
    NOTHING: Interest

    def __init__(
        self, anything: bool, types: frozenset[str], filters: frozenset[InterestFilter]
    ) -> None:
        self.anything = anything
        self.types = types
        self.filters = filters

    @classmethod
    def of(cls, filters: Iterable[InterestFilter]) -> Interest:
        """The interest of *filters* (each a way an event may be wanted), merged: covered
        filters go; past `MAX_FILTERS` the filters widen to their types, past `MAX_TYPES`
        (or with a filter that accepts everything) the interest is "anything"."""
        types: set[str] = set()
        rest: set[InterestFilter] = set()
        for f in filters:
            if f.universal:
                return cls.ANYTHING
            if f.type is not None and not f.eq and not f.has and not f.flags:
                types.add(f.type)
                if len(types) > MAX_TYPES:
                    return cls.ANYTHING
            else:
                rest.add(f)
                if len(rest) > 4 * MAX_FILTERS:  # covering is quadratic: widen now
                    return cls._widened(types, rest)
        rest = {f for f in rest if f.type not in types}
        kept = _uncovered(rest)
        if len(kept) > MAX_FILTERS:
            return cls._widened(types, kept)
        return cls(False, frozenset(types), frozenset(kept))

    @classmethod
    def _widened(cls, types: set[str], filters: Iterable[InterestFilter]) -> Interest:
        """Too many filters: a typed filter widens to its type, a filter of any type keeps
        only the names it needs and its flags (``x == 1`` and ``x == 2`` both become "has
        ``x``"); "anything" only when even those are too many."""
        types = set(types)
        loose: set[InterestFilter] = set()
        for f in filters:
            if f.type is not None:
                types.add(f.type)
                continue
            names = sorted({*f.has, *(name for name, _ in f.eq)})[:MAX_CONSTRAINTS]
            wide = InterestFilter(None, (), tuple(names), f.flags)
            if wide.universal:
                return cls.ANYTHING
            loose.add(wide)
        if len(types) > MAX_TYPES or len(loose) > 2 * MAX_FILTERS:  # covering is quadratic
            return cls.ANYTHING
        kept = _uncovered(loose)
        if len(kept) > MAX_FILTERS:
            return cls.ANYTHING
        return cls(False, frozenset(types), frozenset(kept))

    @classmethod
    def union(cls, interests: Iterable[Interest]) -> Interest:
        """What any of *interests* may want (a subtree's), without covering (cheap); past
        `MAX_FOLDED_FILTERS` filters or `MAX_TYPES` types: "anything"."""
        types: set[str] = set()
        filters: set[InterestFilter] = set()
        for i in interests:
            if i.anything:
                return cls.ANYTHING
            types |= i.types
            filters |= i.filters
        if len(filters) > MAX_FOLDED_FILTERS or len(types) > 4 * MAX_TYPES:
            return cls.ANYTHING
        if types and filters:
            filters = {f for f in filters if f.type not in types}
        return cls(False, frozenset(types), frozenset(filters))

    @property
    def empty(self) -> bool:
        """Wants nothing."""
        return not self.anything and not self.types and not self.filters

    def may_match(self, event: Event) -> bool:
        """Whether *event* may be wanted (False: certainly not)."""
        if self.anything:
            return True
        if event.type in self.types:
            return True
        return any(f.matches(event) for f in self.filters)

    def covers(self, other: Interest) -> bool:
        """Whether this interest accepts every event *other* accepts."""
        if self.anything:
            return True
        if other.anything:
            return False
        if not other.types <= self.types:
            return False
        mine = [InterestFilter(type=t) for t in self.types]
        mine.extend(self.filters)
        return all(any(m.covers(f) for m in mine) for f in other.filters)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Interest):
            return NotImplemented
        return (self.anything, self.types, self.filters) == (
            other.anything,
            other.types,
            other.filters,
        )

    def __hash__(self) -> int:
        return hash((self.anything, self.types, self.filters))

    def __repr__(self) -> str:
        if self.anything:
            return "Interest.ANYTHING"
        return f"Interest(types={sorted(self.types)!r}, filters={len(self.filters)})"

    # -- the wire ---------------------------------------------------------------------------

    def to_wire(self) -> dict[str, Any]:
        """The interest as a control body's value (values of the model only)."""
        if self.anything:
            return {"any": True}
        return {
            "any": False,
            "types": sorted(self.types),
            "f": [
                [f.type, [list(p) for p in f.eq], list(f.has), f.flags]
                for f in sorted(self.filters, key=repr)
            ],
        }

    @classmethod
    def from_wire(cls, data: object) -> Interest:
        """The interest a peer sent. Raises `InvalidValue` for a malformed one, or one over
        the caps (`MAX_TYPES`, `MAX_FILTERS`, `MAX_CONSTRAINTS`, `MAX_TEXT`): the caller
        then takes that router as wanting anything."""
        if not isinstance(data, Mapping):
            raise InvalidValue("an interest must be a map")
        if data.get("any") is True:
            return cls.ANYTHING
        types = data.get("types", [])
        raw = data.get("f", [])
        if type(types) is not list or type(raw) is not list:
            raise InvalidValue("an interest's types and filters must be lists")
        if len(types) > MAX_TYPES or len(raw) > MAX_FILTERS:
            raise InvalidValue(
                f"an interest holds at most {MAX_TYPES} types and {MAX_FILTERS} filters"
            )
        if not all(_name_ok(t) for t in types):
            raise InvalidValue(f"event types must be str of 1 to {MAX_TEXT} characters")
        filters = []
        for item in raw:
            if type(item) is not list or len(item) != 4:
                raise InvalidValue("a filter must be [type, eq, has, flags]")
            t, eq, has, flags = item
            if t is not None and not _name_ok(t):
                raise InvalidValue(f"a filter's type must be a str of 1 to {MAX_TEXT} characters")
            if type(eq) is not list or type(has) is not list or type(flags) is not int:
                raise InvalidValue("a filter's eq and has must be lists, its flags an int")
            if len(eq) > MAX_CONSTRAINTS or len(has) > MAX_CONSTRAINTS:
                raise InvalidValue(
                    f"a filter holds at most {MAX_CONSTRAINTS} conditions of each kind"
                )
            pairs = []
            for p in eq:
                if type(p) is not list or len(p) != 2 or not _name_ok(p[0]):
                    raise InvalidValue("an equality must be [name, constant]")
                if not _constant_ok(p[1]):
                    raise InvalidValue("a constant must be a str, int, finite float or bool")
                pairs.append((p[0], p[1]))
            if not all(_name_ok(n) for n in has):
                raise InvalidValue(f"names must be str of 1 to {MAX_TEXT} characters")
            if flags & ~_FLAGS:
                raise InvalidValue("unknown filter flags")
            filters.append(InterestFilter.make(type=t, eq=pairs, has=has, flags=flags))
        filters.extend(InterestFilter(type=t) for t in types)
        return cls.of(filters)

    @classmethod
    def from_wire_shared(cls, data: object) -> Interest:
        """`from_wire`, decoded once per content: equal wire forms (packed to the same bytes,
        so ``1``, ``1.0`` and ``True`` stay apart) get one shared object, which is immutable.
        Raises `InvalidValue` as `from_wire` does (a refused form is not kept)."""
        try:
            key = msgpack.packb(data)
        except Exception:  # not a value of the model: from_wire says why
            return cls.from_wire(data)
        interest = _decoded.interests.get(key)
        if interest is None:
            interest = cls.from_wire(data)
            _decoded.keep(key, interest)
        return interest


#: A store's interest: every persisted event.
STORE_INTEREST: Final = InterestFilter(flags=PERSISTED)
#: A mesh cache's interest (when it counts: `MeshConfig.cache_interest`): every event not
#: opted out of the mesh cache.
CACHE_INTEREST: Final = InterestFilter(flags=CACHED)

Interest.ANYTHING = Interest(True, frozenset(), frozenset())
Interest.NOTHING = Interest(False, frozenset(), frozenset())


class _Decoded:
    """`Interest.from_wire_shared`'s cache: packed wire form → its interest, bounded by
    `MAX_DECODED` and `MAX_DECODED_BYTES`."""

    def __init__(self) -> None:
        self.interests: dict[bytes, Interest] = {}
        self.size = 0  # bytes of the keys

    def keep(self, key: bytes, interest: Interest) -> None:
        if len(self.interests) >= MAX_DECODED or self.size + len(key) > MAX_DECODED_BYTES:
            self.interests.clear()
            self.size = 0
        self.interests[key] = interest
        self.size += len(key)


_decoded: Final = _Decoded()


def _uncovered(filters: set[InterestFilter]) -> list[InterestFilter]:
    """*filters* without those another covers (of two equal filters, one stays)."""
    # A filter that covers another and differs from it weighs strictly less (an equality
    # weighs two: it is a presence and more), so coverers come first.
    ordered = sorted(filters, key=_weight)
    kept: list[InterestFilter] = []
    for f in ordered:
        if not any(k.covers(f) for k in kept):
            kept.append(f)
    return kept


def _weight(f: InterestFilter) -> int:
    return 2 * len(f.eq) + len(f.has) + bin(f.flags).count("1") + (f.type is not None)


class _Tree:
    """The shortest-path tree of one source over one view: each router's parent, and the
    folded interest of each router's subtree (its own and all its descendants')."""

    __slots__ = ("parent", "children", "folded", "plans")

    def __init__(
        self,
        source: str,
        graph: Mapping[str, Sequence[str]],
        interests: Mapping[str, Interest],
    ) -> None:
        parent: dict[str, str | None] = {source: None}
        order = [source]
        queue = deque([source])
        while queue:
            v = queue.popleft()
            for w in graph.get(v, ()):  # sorted by id: the tie-break
                if w not in parent:
                    parent[w] = v
                    order.append(w)
                    queue.append(w)
        children: dict[str, list[str]] = {}
        for v in order[1:]:
            above = parent[v]
            assert above is not None  # only the source has none
            children.setdefault(above, []).append(v)
        folded: dict[str, Interest] = {}
        for v in reversed(order):  # leaves first
            own = interests.get(v, Interest.ANYTHING)
            kids = children.get(v)
            folded[v] = Interest.union([own, *(folded[c] for c in kids)]) if kids else own
        self.parent = parent
        self.children = children
        self.folded = folded
        #: Router → its children with their folded interests, and per event type what the
        #: type's events get: the children (when every child's answer follows from the type
        #: alone) or a check made for the type that answers per event; filled as types come
        #: (`MeshInterests.forward_many`).
        self.plans: dict[str, tuple[list[tuple[str, Interest]], dict[str | None, _Answer]]]
        self.plans = {}


class MeshInterests:
    """The view: every router's links and interest; shortest-path trees over it.

    >>> view = MeshInterests()
    >>> for rid, peers in {"a": ["b"], "b": ["a", "c"], "c": ["b"]}.items():
    ...     _ = view.put(rid, peers, Interest.NOTHING)
    >>> _ = view.put("c", ["b"], Interest.of([InterestFilter(type="hot")]))
    >>> view.forward("a", "a", None, Event(values={}, type="hot"))
    ['b']
    >>> view.forward("a", "a", None, Event(values={}, type="cold"))
    []
    """

    def __init__(self, *, max_routers: int = MAX_ROUTERS) -> None:
        self.max_routers = max_routers
        self._peers: dict[str, tuple[str, ...]] = {}
        self._interests: dict[str, Interest] = {}
        self._graph: dict[str, list[str]] | None = None
        self._complete = False
        self._trees: OrderedDict[str, _Tree] = OrderedDict()
        #: Changes of the view so far: what was worked out from it is stale once this moved.
        self.changes = 0

    def __len__(self) -> int:
        return len(self._peers)

    def __contains__(self, router_id: object) -> bool:
        return router_id in self._peers

    def interest(self, router_id: str) -> Interest | None:
        """*router_id*'s interest, or None when unknown."""
        return self._interests.get(router_id)

    def peers(self, router_id: str) -> tuple[str, ...]:
        return self._peers.get(router_id, ())

    def routers(self) -> list[str]:
        return list(self._peers)

    def put(self, router_id: str, peers: Iterable[str], interest: Interest) -> bool:
        """Record what *router_id* says of itself. True if that changed the view. Raises
        `InvalidValue` when the view already holds `max_routers` other routers."""
        claimed = tuple(sorted(set(peers) - {router_id}))
        if self._peers.get(router_id) == claimed and self._interests.get(router_id) == interest:
            return False
        if router_id not in self._peers and len(self._peers) >= self.max_routers:
            raise InvalidValue(f"the view holds at most {self.max_routers} routers")
        self._peers[router_id] = claimed
        self._interests[router_id] = interest
        self._changed()
        return True

    def drop(self, router_id: str) -> bool:
        """Forget *router_id*; True if it was known."""
        if router_id not in self._peers:
            return False
        del self._peers[router_id]
        del self._interests[router_id]
        self._changed()
        return True

    def _changed(self) -> None:
        self.changes += 1
        self._graph = None
        self._trees.clear()

    @property
    def complete(self) -> bool:
        """Every router named as a peer told its own links and interest."""
        self._build()
        return self._complete

    def _build(self) -> dict[str, list[str]]:
        if self._graph is None:
            peers = self._peers
            complete = True
            graph: dict[str, list[str]] = {}
            for v, ws in peers.items():
                mine = []
                for w in ws:
                    theirs = peers.get(w)
                    if theirs is None:
                        complete = False  # a router we know nothing of
                    elif v in theirs:
                        mine.append(w)
                graph[v] = mine  # sorted already: `put` sorts
            self._graph = graph
            self._complete = complete
        return self._graph

    def graph(self) -> Mapping[str, Sequence[str]]:
        """Router → the routers it has links with (both ends claim them), in id order. The
        same object until the view changes (read only)."""
        return self._build()

    def reachable(self, me: str) -> set[str]:
        """The routers joined to *me* by edges of the view (both ends claim them), *me* too
        if it is in the view."""
        graph = self._build()
        if me not in graph:
            return set()
        seen = {me}
        stack = [me]
        while stack:
            for w in graph[stack.pop()]:
                if w not in seen:
                    seen.add(w)
                    stack.append(w)
        return seen

    def tree(self, source: str) -> _Tree | None:
        """The tree of *source*, or None if *source* is unknown."""
        tree = self._trees.get(source)
        if tree is not None:
            self._trees.move_to_end(source)
            return tree
        graph = self._build()
        if source not in graph:
            return None
        tree = self._trees[source] = _Tree(source, graph, self._interests)
        room = max(1, min(MAX_TREES, MAX_TREE_ENTRIES // max(1, len(graph))))
        while len(self._trees) > room:
            self._trees.popitem(last=False)
        return tree

    @property
    def trees(self) -> int:
        """Trees kept now (bounded by `MAX_TREES` and `MAX_TREE_ENTRIES`)."""
        return len(self._trees)

    def forward(
        self, me: str, source: str, came_from: str | None, event: Event
    ) -> list[str] | None:
        """The neighbours of *me* to send *event* (from router *source*, received from
        *came_from*, None if *me* is the source) to: its children in the tree of *source*
        whose subtree may want it. None means "flood": the view is incomplete, *source*
        or *me* is not in it, or the copy did not come the tree's way."""
        self._build()
        if not self._complete:
            return None
        tree = self.tree(source)
        if tree is None or me not in tree.parent or tree.parent[me] != came_from:
            return None
        kids = tree.children.get(me)
        if not kids:
            return []
        folded = tree.folded
        return [c for c in kids if folded[c].may_match(event)]

    def forward_many(
        self, me: str, source: str, came_from: str | None, events: Sequence[Event]
    ) -> list[Peers] | None:
        """`forward` for each of *events*, all from *source* and received from *came_from* (a
        relayed group), or None: flood them all. The tree is looked up once, and each child's
        interest is worked out once per event type and kept with the tree (until the view
        changes): where the type alone decides every child (a child wants the whole type,
        anything, or no filter of it applies), its events share that answer; else a check
        made for the type's filters answers each event (`_answer_for`). Events that go the
        same way share one tuple, so a caller works once per distinct answer. A router relays
        its events in batches of a few to hundreds, so what `forward` does per call would
        otherwise be paid per event, and a relay asks this for every event it relays."""
        self._build()
        tree = self.tree(source) if self._complete else None
        if tree is None or me not in tree.parent or tree.parent[me] != came_from:
            return None
        plan = tree.plans.get(me)
        if plan is None:
            plan = tree.plans[me] = ([(c, tree.folded[c]) for c in tree.children.get(me, ())], {})
        folded, by_type = plan
        if not folded:
            return [()] * len(events)
        out: list[Peers] = []
        for ev in events:
            answer = by_type.get(ev.type)
            if answer is None:
                if len(by_type) >= MAX_TYPE_ANSWERS:
                    by_type.clear()  # a publisher of ever new types costs time, not memory
                answer = by_type[ev.type] = _answer_for(folded, ev.type)
            out.append(answer if isinstance(answer, tuple) else answer(ev))
        return out


#: What the events of one type get from `MeshInterests.forward_many`: the children they all go
#: to, or a check that answers per event (the same tuple for events that go the same way).
_Answer = Peers | Callable[[Event], Peers]


def _answer_for(folded: Sequence[tuple[str, Interest]], etype: str | None) -> _Answer:
    """The answer for events of type *etype*, each child's interest worked out once for the
    type: a child that wants the whole type (or anything) gets every such event, one with no
    filter for the type none, and the others are asked per event with a check made from the
    filters that apply to the type (its own and those of any type). The type is then known,
    so the checks test only the rest (values, names, flags)."""
    steps: list[tuple[str, Callable[[Event], bool] | None]] = []  # None: every event
    for c, interest in folded:
        if interest.anything or etype in interest.types:
            steps.append((c, None))
            continue
        tests = [_test(f) for f in interest.filters if f.type is None or f.type == etype]
        checks = [t for t in tests if t is not None]
        if len(checks) < len(tests):
            steps.append((c, None))
        elif checks:
            steps.append((c, checks[0] if len(checks) == 1 else _any_of(checks)))
    asked = [(c, t) for c, t in steps if t is not None]
    if not asked:
        return tuple([c for c, _ in steps])
    if len(asked) == 1:
        child, test = asked[0]
        yes = tuple([c for c, _ in steps])
        no = tuple([c for c, t in steps if c != child])
        return lambda ev: yes if test(ev) else no
    shared: dict[Peers, Peers] = {}

    def answer(ev: Event) -> Peers:
        chosen = tuple([c for c, t in steps if t is None or t(ev)])
        if len(shared) >= MAX_SHARED_ANSWERS:
            shared.clear()  # events whose values pick ever new sets cost time, not memory
        return shared.setdefault(chosen, chosen)

    return answer


def _any_of(tests: list[Callable[[Event], bool]]) -> Callable[[Event], bool]:
    def any_of(ev: Event) -> bool:
        for t in tests:  # noqa: SIM110 (a generator per event is slower)
            if t(ev):
                return True
        return False

    return any_of


def _test(f: InterestFilter) -> Callable[[Event], bool] | None:
    """*f*'s conditions beyond its type as a check of an event (None: there are none, every
    event of the type passes), made for the shapes subscriptions, stores and caches give (one
    name present, one equality, one flag); any other filter is checked by
    `InterestFilter.matches`. Each says what `matches` says for an event of a type *f*
    accepts."""
    if f.flags:
        if f.eq or f.has:
            return f.matches
        if f.flags == PERSISTED:
            return lambda ev: ev.meta.get(_META_PERSIST) is True
        if f.flags == CACHED:
            return lambda ev: ev.meta.get(_META_MESH_CACHE) is not False
        return f.matches
    if not f.eq and not f.has:
        return None
    if not f.eq and len(f.has) == 1:
        (name,) = f.has
        return lambda ev: name in ev.values
    if not f.has and len(f.eq) == 1:
        ((key, constant),) = f.eq

        def equal(ev: Event) -> bool:
            v = ev.values.get(key, _MISSING)
            if v is _MISSING or v != constant:
                return False
            try:
                hash(v)  # a list or a map equals no constant
            except TypeError:
                return False
            return True

        return equal
    return f.matches


class InterestTable:
    """One router's view with the safety rules of the module docstring: time passed in.

    >>> table = InterestTable("a")
    >>> table.local(["b"], Interest.NOTHING, now=0.0)
    True
    >>> table.receive("b", 1, ["a"], Interest.of([InterestFilter(type="hot")]), now=0.0)
    True
    >>> table.targets("a", None, Event(values={}, type="cold"), now=0.5) is None  # settling
    True
    >>> table.targets("a", None, Event(values={}, type="cold"), now=2.0)
    []

    When "b" goes out of reach and comes back, its summary is stale until it is told again:

    >>> _ = table.local([], Interest.NOTHING, now=3.0)
    >>> _ = table.local(["b"], Interest.NOTHING, now=10.0)
    >>> sorted(table.waiting), table.targets("a", None, Event(values={}), now=11.5) is None
    (['b'], True)
    >>> table.sync("b", 1, ["a"], Interest.of([InterestFilter(type="hot")]), now=11.5)
    True
    >>> table.waiting, table.targets("a", None, Event(values={}), now=11.5)
    (set(), [])
    """

    def __init__(
        self,
        router_id: str,
        *,
        settle: float = SETTLE_TIME,
        catch_up: float = CATCH_UP_TIME,
        max_routers: int = MAX_ROUTERS,
    ) -> None:
        if type(router_id) is not str or not 0 < len(router_id) <= MAX_ID_LENGTH:
            raise InvalidValue(f"router_id must be a str of 1 to {MAX_ID_LENGTH} characters")
        self.router_id = router_id
        self.settle = settle
        self.catch_up = catch_up
        self.view = MeshInterests(max_routers=max_routers)
        #: router id → (version, monotonic time last heard) of each remote router.
        self.heard: dict[str, tuple[int, float]] = {}
        #: Routers of the view not heard from since they last went out of reach.
        self.unconfirmed: set[str] = set()
        #: Those of them in reach now: the router floods while any is left (and the wait
        #: has not run out).
        self.waiting: set[str] = set()
        self._reach = Reach(router_id, self.view)
        self._settled_at = math.inf  # not before our own links are known
        self._wait_until = -math.inf

    def unsettle(self, now: float) -> None:
        """Something changed: flood until `settle` seconds have passed quietly."""
        self._settled_at = now + self.settle

    def settled(self, now: float) -> bool:
        return now >= self._settled_at

    def caught_up(self, now: float) -> bool:
        """No router that came back into reach is still awaited (or the wait ran out)."""
        return not self.waiting or now >= self._wait_until

    def local(self, peers: Iterable[str], interest: Interest, now: float) -> bool:
        """This router's links and interest; True (and unsettled) if they changed."""
        if self._settled_at == math.inf:
            self._settled_at = now + self.settle
        links = self.view.peers(self.router_id)
        if self.view.put(self.router_id, peers, interest):
            self.unsettle(now)
            if self.view.peers(self.router_id) != links:
                self._recheck(now, *self._reach.changed(self.router_id, links))
            return True
        return False

    def receive(
        self, origin: str, version: int, peers: Iterable[str], interest: Interest, now: float
    ) -> bool:
        """A router's flooded summary. True if the view changed (then unsettled). An older
        version than the one held is stale and ignored; a router the view has no room for
        leaves it incomplete, so this router floods (`InterestTable.targets` then says so)."""
        return self._take(origin, version, peers, interest, now, now) is not None

    def sync(
        self,
        origin: str,
        version: int,
        peers: Iterable[str],
        interest: Interest,
        now: float,
        age: float = 0.0,
    ) -> bool:
        """A summary handed over by a peer (held by it, heard *age* seconds ago). True if it
        is news here — it changed the view, is a newer version, or confirms a router that
        came back into reach — and so worth handing on to the other peers; each summary is
        so handed on at most once per router and change, and a stale one never."""
        held = self.heard.get(origin)
        at = now - max(age, 0.0)
        if held is not None and version == held[0]:
            at = max(at, held[1])
        was = origin in self.unconfirmed
        changed = self._take(origin, version, peers, interest, now, at)
        if changed is None:
            return False
        return changed or was or held is None or version > held[0]

    def _take(
        self,
        origin: str,
        version: int,
        peers: Iterable[str],
        interest: Interest,
        now: float,
        at: float,
    ) -> bool | None:
        """Record a summary of *origin* heard at *at*: None if it is ignored (ours, stale,
        no room), else whether it changed the view."""
        if origin == self.router_id:
            return None
        held = self.heard.get(origin)
        if held is not None and version < held[0]:
            return None
        links = self.view.peers(origin)
        try:
            changed = self.view.put(origin, peers, interest)
        except InvalidValue:
            self.unsettle(now)
            return None
        self.heard[origin] = (version, at)
        self.unconfirmed.discard(origin)
        self.waiting.discard(origin)
        if changed:
            self.unsettle(now)
            if self.view.peers(origin) != links:
                self._recheck(now, *self._reach.changed(origin, links))
        return changed

    def _recheck(self, now: float, back: set[str], left: set[str]) -> None:
        """The graph changed, and with it our reach: routers that *left* it are unconfirmed
        from now on; unconfirmed ones *back* in it are awaited, for at most `catch_up`
        seconds. (`waiting` stays our reach's unconfirmed routers: those that left are out
        of reach, and a router leaves both sets when it is heard from.)"""
        left.discard(self.router_id)
        self.unconfirmed |= left
        self.waiting -= left
        back &= self.unconfirmed
        if back:
            self._wait_until = now + self.catch_up
            self.waiting |= back

    def confirm(self, origin: str, version: int, now: float) -> bool:
        """*origin* says its summary is still *version* (a digest): when that is the version
        held, it counts as hearing that summary again (True); else nothing changes."""
        held = self.heard.get(origin)
        if held is None or held[0] != version:
            return False
        self.heard[origin] = (version, now)
        self.unconfirmed.discard(origin)
        self.waiting.discard(origin)
        return True

    def widen(self, origin: str) -> bool:
        """Take *origin* to want anything until its next summary (True if that changed the
        view): it claims a summary we lack. This needs no settling: every router forwards
        toward *origin* at least what it did, and a copy still goes only down the tree, so no
        router gets a copy it would flood on or route by a view that differs in its links."""
        if origin == self.router_id or origin not in self.view:
            return False
        return self.view.put(origin, self.view.peers(origin), Interest.ANYTHING)

    def forget(self, origin: str, now: float) -> bool:
        """Drop *origin* from the view (True, unsettled, if it was there)."""
        self.heard.pop(origin, None)
        self.unconfirmed.discard(origin)
        self.waiting.discard(origin)
        links = self.view.peers(origin)
        if self.view.drop(origin):
            self.unsettle(now)
            self._recheck(now, *self._reach.changed(origin, links))
            return True
        return False

    def expire(self, now: float, max_age: float) -> list[str]:
        """Forget routers not heard for *max_age* seconds (gone, or cut off); their ids."""
        gone = [rid for rid, (_, at) in self.heard.items() if now - at > max_age]
        for rid in gone:
            self.forget(rid, now)
        return gone

    def targets(
        self, source: str, came_from: str | None, event: Event, now: float
    ) -> list[str] | None:
        """The peers to send *event* to, or None: flood (unsure). See `MeshInterests.forward`."""
        if not self._sure(now):
            return None
        return self.view.forward(self.router_id, source, came_from, event)

    def _sure(self, now: float) -> bool:
        """Settled, and no router that came back into reach is still awaited."""
        return now >= self._settled_at and (not self.waiting or now >= self._wait_until)

    def targets_many(
        self, source: str, came_from: str | None, events: Sequence[Event], now: float
    ) -> list[Peers] | None:
        """`targets` for each of *events*, all from *source* and received from *came_from*,
        or None: flood them all, unsure (`MeshInterests.forward_many`)."""
        if not self._sure(now):
            return None
        return self.view.forward_many(self.router_id, source, came_from, events)
