"""The index over predicate-tier buckets: which of them an event can match, without
evaluating each.

Choice. Each bucket's pattern is a disjunction of conjunctions (`predicates/grammar.py`);
each conjunction is filed under ONE *access predicate*, its most selective indexable atom,
and verified on its other atoms when an event hits it. This is the clustering of Fabret et
al. ("Filtering algorithms and implementation for very fast publish/subscribe systems",
SIGMOD 2001: subscriptions clustered by an access predicate, then checked on the rest),
with the access chosen per subscription by the size of the posting list it would join, the
cost-based choice of BE-Tree (Sadoghi and Jacobsen, SIGMOD 2011). Counting (Fabret's first
algorithm, PADRES's predicate counting) touches every satisfied predicate of every
subscription; Rete (PADRES) shares predicate nodes and keeps join state; both cost far more
interpreted Python per event than one access lookup plus a short verification, and neither
makes a parametric update cheaper. Here an update is: remove the bucket's entries, insert
the new ones (`update` in the engine), so it moves one subscription with no window in which
an event could miss it or see it twice (the engine is single-threaded and updates between
two `match` calls) — the "parametric subscription" of Jayaram, Jayalath and Eugster.

Per event field (an event value, the event type, a meta field):

- equality and `in` over constants: a dict constant → posting (hash and `==`, so 1, 1.0
  and True agree as in Python; an unhashable event value equals no constant);
- ranges `< <= > >=`: for numbers and for strings, two sorted lists of bounds (lower and
  upper); an event value takes the prefix (or suffix) of bounds it satisfies by bisection;
- pairs of ranges on two fields (`X > a and Y < b`): a range access whose conjunction also
  checks a second event value against a constant bound goes in a two-dimensional table
  (`_Pairs`) instead, so that an event takes the conjunctions whose two bounds it satisfies,
  not the half of them whose access bound it satisfies (each of which verification would
  then reject);
- intervals (a lower and an upper numeric bound on one field, `lo <= X < hi`): in classes
  of width (powers of two, as BE-Tree partitions its value space), each a grid of cells one
  class-width wide keyed by the cell of lo; an event value probes two cells per class, so
  mostly intervals that contain it are visited;
- `startswith` / `endswith`: a dict prefix → posting, probed once per distinct prefix length;
- presence: the conjunctions that only need the field to exist.

A conjunction with no indexable atom (`X > Y`, arithmetic only, `True`) is on the scan list.
Candidates are found by walking the event's own fields (a handful of dict lookups), so an
event costs the lookups plus the verification of its candidates, whatever the number of
subscriptions.
"""

from __future__ import annotations

import math
import operator
import time
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from sortedcontainers import SortedList

from aa.mesh import Event

from ..predicates import (
    EQ,
    INTERVAL,
    MAX_INTERVAL_BOUND,
    META,
    PARAM,
    PREFIX,
    RANGE,
    SUFFIX,
    TYPE,
    VALUE,
    Plan,
    hashable,
)
from ..sandbox import NO_MATCH_IN_EXPRESSIONS, SandboxStop
from .postings import Entry, Posting, post, posting_size, unpost

if TYPE_CHECKING:
    from ..predicates import PredicateProgram
    from .buckets import Bucket

__all__ = ["PredicateIndex"]

_MISSING: Any = object()
_PASS_THROUGH = (KeyboardInterrupt, SystemExit)


class _Field:
    """The index of one event field."""

    __slots__ = (
        "eq",
        "ranges",
        "pairs",
        "intervals",
        "prefix",
        "prefix_lens",
        "suffix",
        "suffix_lens",
        "present",
    )

    def __init__(self) -> None:
        self.eq: dict[Any, Posting] = {}
        #: (family, side) → SortedList of (bound, flag, key, entry); family "n" or "s",
        #: side "lo" (X > b, X >= b) or "hi" (X < b, X <= b).
        self.ranges: dict[tuple[str, str], Any] = {}
        #: `_pair_key` → the range entries that also check a second value's bound.
        self.pairs: dict[tuple[Any, ...], _Pairs] = {}
        #: Width class e (width < 2**e) → (2.0**e, cell → posting), the cell of an interval
        #: being floor(lo / 2**e): v lies in an interval of the class only if its lo lies in
        #: (v - 2**e, v], that is in the cell of v or the one before (exact: powers of two
        #: scale floats exactly, and bounds stay under MAX_INTERVAL_BOUND).
        self.intervals: dict[int, tuple[float, dict[int, Posting]]] = {}
        self.prefix: dict[str, Posting] = {}
        self.prefix_lens: dict[int, int] = {}
        self.suffix: dict[str, Posting] = {}
        self.suffix_lens: dict[int, int] = {}
        self.present: dict[Entry, None] = {}

    def empty(self) -> bool:
        return not (
            self.eq
            or self.ranges
            or self.pairs
            or self.intervals
            or self.prefix
            or self.suffix
            or self.present
        )

    def add(self, e: Entry) -> None:
        """File *e* under its access (the entry keeps the access's kind, src and keys)."""
        kind = e.kind
        if kind == EQ:
            for k in e.keys:
                post(self.eq, k, e)
        elif kind == RANGE:
            paired = _pair_key(e)
            if paired is not None:
                pairs = self.pairs.get(paired[0])
                if pairs is None:
                    pairs = self.pairs[paired[0]] = _Pairs()
                pairs.add(e, paired[1])
                return
            sl = self.ranges.get(_side(e.keys))
            if sl is None:
                sl = self.ranges[_side(e.keys)] = SortedList()
            sl.add(_bound(e))
        elif kind == INTERVAL:
            cls = _width_class(e)
            got = self.intervals.get(cls)
            if got is None:
                got = self.intervals[cls] = (2.0**cls, {})
            post(got[1], math.floor(e.keys[1] / got[0]), e)
        elif kind in (PREFIX, SUFFIX):
            table, lens = (
                (self.prefix, self.prefix_lens)
                if kind == PREFIX
                else (self.suffix, self.suffix_lens)
            )
            for k in e.keys:
                if k not in table:
                    lens[len(k)] = lens.get(len(k), 0) + 1
                post(table, k, e)
        else:
            self.present[e] = None

    def remove(self, e: Entry) -> None:
        kind = e.kind
        if kind == EQ:
            for k in e.keys:
                unpost(self.eq, k, e)
        elif kind == RANGE:
            paired = _pair_key(e)
            if paired is not None:
                pairs = self.pairs[paired[0]]
                pairs.remove(e, paired[1])
                if not pairs.count:
                    del self.pairs[paired[0]]
                return
            side = _side(e.keys)
            sl = self.ranges[side]
            sl.remove(_bound(e))
            if not sl:
                del self.ranges[side]
        elif kind == INTERVAL:
            cls = _width_class(e)
            width, cells = self.intervals[cls]
            unpost(cells, math.floor(e.keys[1] / width), e)
            if not cells:
                del self.intervals[cls]
        elif kind in (PREFIX, SUFFIX):
            table, lens = (
                (self.prefix, self.prefix_lens)
                if kind == PREFIX
                else (self.suffix, self.suffix_lens)
            )
            for k in e.keys:
                unpost(table, k, e)
                if k not in table:
                    n = lens[len(k)] - 1
                    if n:
                        lens[len(k)] = n
                    else:
                        del lens[len(k)]
        else:
            self.present.pop(e, None)

    def size(self, kind: str, keys: Any) -> int:
        if kind == EQ:
            return (
                posting_size(self.eq.get(keys[0]))
                if len(keys) == 1
                else sum(posting_size(self.eq.get(k)) for k in keys)
            )
        if kind == RANGE:
            side = _side(keys)
            return len(self.ranges.get(side, ())) + sum(
                t.count for k, t in self.pairs.items() if k[:2] == side
            )
        if kind == INTERVAL:
            return sum(len(cells) for _, cells in self.intervals.values())
        if kind == PREFIX:
            return sum(posting_size(self.prefix.get(k)) for k in keys)
        if kind == SUFFIX:
            return sum(posting_size(self.suffix.get(k)) for k in keys)
        return len(self.present)

    def collect(self, v: Any, out: list[Entry], values: Any) -> None:
        """Add the entries whose access the value *v* satisfies (for pairs: and whose second
        bound the event's *values* satisfy)."""
        if self.eq:
            try:
                p = self.eq.get(v)
            except TypeError:  # unhashable: equal to no constant
                p = None
            if p is not None:
                if type(p) is Entry:
                    out.append(p)
                else:
                    out.extend(p)
        if (
            self.intervals
            and isinstance(v, (int, float))
            and -MAX_INTERVAL_BOUND < v < MAX_INTERVAL_BOUND
        ):
            for width, cells in self.intervals.values():
                cell = math.floor(v / width)
                for p in (cells.get(cell), cells.get(cell - 1)):
                    if p is None:
                        continue
                    for e in (p,) if type(p) is Entry else p:
                        lo_op, lo, hi_op, hi = e.keys
                        if (lo < v or lo == v and lo_op == ">=") and (
                            v < hi or v == hi and hi_op == "<="
                        ):
                            out.append(e)
        if self.ranges or self.pairs:
            family = _family(v)
            if family is not None:
                probe = (v, 1)
                lo = self.ranges.get((family, "lo"))
                if lo is not None:
                    out.extend(b[2] for b in lo.islice(0, lo.bisect_left(probe)))
                hi = self.ranges.get((family, "hi"))
                if hi is not None:
                    out.extend(b[2] for b in hi.islice(hi.bisect_left(probe)))
                for (f_family, f_side, name, g_family, g_side), table in self.pairs.items():
                    if f_family == family:
                        w = values.get(name, _MISSING)
                        if w is not _MISSING and _family(w) == g_family:
                            table.collect(v, f_side == "lo", w, g_side == "lo", out)
        if (self.prefix_lens or self.suffix_lens) and isinstance(v, str):
            n = len(v)
            for length in self.prefix_lens:
                if length <= n:
                    p = self.prefix.get(v[:length])
                    if p is not None:
                        out.append(p) if type(p) is Entry else out.extend(p)
            for length in self.suffix_lens:
                if length <= n:
                    p = self.suffix.get(v[n - length :])
                    if p is not None:
                        out.append(p) if type(p) is Entry else out.extend(p)
        if self.present:
            out.extend(self.present)


#: The comparison functions of flat checks (`grammar.OPS`) a pair's second bound can be.
_RANGE_FNS: dict[Any, str] = {
    operator.gt: ">",
    operator.ge: ">=",
    operator.lt: "<",
    operator.le: "<=",
}
#: Entries per block of a pair table: a lookup bisects each block its access bound wholly
#: satisfies and compares one by one in the block that bound cuts, so it costs about
#: n / block bisections plus a block's comparisons (a block splits past twice this, and
#: merges with a neighbour under a quarter).
_PAIR_BLOCK = 64


def _family(v: Any) -> str | None:
    """The bounds an event value compares with: "s" strings, "n" numbers (not NaN, which
    satisfies no bound), None neither (a comparison with either raises: no match)."""
    if isinstance(v, str):
        return "s"
    if isinstance(v, (int, float)) and v == v:
        return "n"
    return None


def _pair_key(e: Entry) -> tuple[Any, ...] | None:
    """Where a range entry goes in `_Field.pairs`: (access family, access side, other name,
    other family, other side), and the other bound's sort key, for the first check of its
    rest that compares an event value with a constant string or number; None: no such check
    (a param's bound is read when verifying, and may change without the index: never one)."""
    rest = e.rest
    if not rest:
        return None
    for i in range(0, len(rest) - 3, 4):
        where, key, fn, c = rest[i : i + 4]
        if where != VALUE or type(key) is not str:
            continue
        try:
            op = _RANGE_FNS.get(fn)
        except TypeError:  # an unhashable check function: no range
            continue
        if op is None:
            continue
        family = _family(c)
        if family is None:
            continue
        side = _side(e.keys)
        return (
            side[0],
            side[1],
            key,
            family,
            "lo" if op[0] == ">" else "hi",
        ), (c, 1 if op in (">", "<=") else 0)
    return None


class _Pairs:
    """Range entries of one field that also check a second event value (the *other*)
    against a constant bound, all of one (access family and side, other name, family and
    side): a two-dimensional dominance table.

    Blocks of entries in the order of their access bound, each kept twice: by access bound
    (`fs`: (bound, flag, entry, other key)) and by the other bound (`gs`: (bound, flag,
    entry)). The access bounds an event value satisfies are a prefix (lower bounds) or a
    suffix (upper bounds) of that order, so every block but one is wholly in or wholly out;
    in a block wholly in, the other bounds the event satisfies are again a prefix or suffix
    of `gs`, found by bisection. Candidates are then the entries whose two bounds hold, at
    the cost of a bisection a block, whatever the number that fail. Sort keys and flags are
    `_bound`'s; an entry is found again on removal by its keys (its rest never changes).
    """

    __slots__ = ("blocks", "firsts", "lasts", "count")

    def __init__(self) -> None:
        self.blocks: list[tuple[list[Any], list[Any]]] = []
        self.firsts: list[Any] = []
        self.lasts: list[Any] = []
        self.count = 0

    def add(self, e: Entry, other: tuple[Any, int]) -> None:
        f = _bound(e)
        g = (other[0], other[1], e)
        self.count += 1
        blocks = self.blocks
        if not blocks:
            blocks.append(([(*f, other)], [g]))
            self.firsts.append(f)
            self.lasts.append(f)
            return
        i = max(bisect_right(self.firsts, f) - 1, 0)
        fs, gs = blocks[i]
        insort(fs, (*f, other))
        insort(gs, g)
        self.firsts[i] = fs[0][:3]
        self.lasts[i] = fs[-1][:3]
        if len(fs) > 2 * _PAIR_BLOCK:
            half = len(fs) // 2
            self._set(i, fs[:half], [fs[half:]])

    def remove(self, e: Entry, other: tuple[Any, int]) -> None:
        f = _bound(e)
        i = bisect_left(self.lasts, f)
        fs, gs = self.blocks[i]
        del fs[bisect_left(fs, f)]
        del gs[bisect_left(gs, (other[0], other[1], e))]
        self.count -= 1
        if not fs:
            del self.blocks[i], self.firsts[i], self.lasts[i]
            return
        self.firsts[i] = fs[0][:3]
        self.lasts[i] = fs[-1][:3]
        if len(fs) < _PAIR_BLOCK // 4 and len(self.blocks) > 1:
            j = i if i + 1 < len(self.blocks) else i - 1  # merge blocks j and j + 1
            merged = self.blocks[j][0] + self.blocks[j + 1][0]
            del self.blocks[j + 1], self.firsts[j + 1], self.lasts[j + 1]
            if len(merged) > 2 * _PAIR_BLOCK:
                half = len(merged) // 2
                self._set(j, merged[:half], [merged[half:]])
            else:
                self._set(j, merged, [])

    def _set(self, i: int, fs: list[Any], more: list[list[Any]]) -> None:
        """Block *i* holds *fs* (sorted), and blocks *more* follow it."""
        for k, part in enumerate((fs, *more)):
            block = (part, sorted((t[3][0], t[3][1], t[2]) for t in part))
            if k == 0:
                self.blocks[i] = block
                self.firsts[i], self.lasts[i] = part[0][:3], part[-1][:3]
            else:
                self.blocks.insert(i + k, block)
                self.firsts.insert(i + k, part[0][:3])
                self.lasts.insert(i + k, part[-1][:3])

    def collect(self, v: Any, f_lo: bool, w: Any, g_lo: bool, out: list[Entry]) -> None:
        """Add the entries whose access bound *v* satisfies and whose other bound *w* does
        (each of the same family as the table's)."""
        pv, pw = (v, 1), (w, 1)
        blocks = self.blocks
        if f_lo:  # bounds < (v, 1) hold: whole blocks before the one the probe cuts
            cut = bisect_left(self.lasts, pv)
            whole = range(cut)
        else:  # bounds >= (v, 1) hold: whole blocks from the first that starts there
            start = bisect_left(self.firsts, pv)
            whole = range(start, len(blocks))
            cut = start - 1
        for k in whole:  # the ends of `gs` tell whether any of its bounds hold
            gs = blocks[k][1]
            if g_lo:
                if gs[0] < pw:
                    out.extend([t[2] for t in gs[: bisect_left(gs, pw)]])
            elif not gs[-1] < pw:
                out.extend([t[2] for t in gs[bisect_left(gs, pw) :]])
        if 0 <= cut < len(blocks):
            fs = blocks[cut][0]
            n = bisect_left(fs, pv)
            for t in fs[:n] if f_lo else fs[n:]:
                if (t[3] < pw) is g_lo:
                    out.append(t[2])


def _side(keys: tuple[str, Any]) -> tuple[str, str]:
    """The sorted list a range's keys (op, bound) go in."""
    op, bound = keys
    return ("s" if isinstance(bound, str) else "n", "lo" if op[0] == ">" else "hi")


def _bound(e: Entry) -> tuple[Any, int, Entry]:
    """Sort key: lower bounds match bounds < (v, 1) with flag 1 for ">" and 0 for ">=";
    upper bounds match bounds >= (v, 1) with flag 0 for "<" and 1 for "<="."""
    op, bound = e.keys
    flag = 1 if op in (">", "<=") else 0
    return (bound, flag, e)  # entries that tie compare by id (`Entry.__lt__`)


def _width_class(e: Entry) -> int:
    """e with width < 2**e; at least -64, so lo / 2**e stays a finite float."""
    return max(math.frexp(float(e.keys[3] - e.keys[1]))[1], -64)


class PredicateIndex:
    """The predicate-tier buckets of one engine (or of one `PatternSet`), indexed."""

    def __init__(self, verify_budget: Callable[[], None] | None = None) -> None:
        self._values: dict[str, _Field] = {}
        self._type = _Field()
        self._meta: dict[str, _Field] = {}
        self._scan: dict[Entry, None] = {}
        #: Shadowed name → the buckets to evaluate whole when an event carries that name.
        self._shadow: dict[str, dict[Bucket, None]] = {}
        self._count = 0
        self._reset = verify_budget or (lambda: None)
        #: Candidates offered for verification so far, in all: what the index failed to
        #: rule out (a bucket may be offered by more than one access of an event).
        self.candidates = 0
        #: Moves with every entry filed or taken out: the compiled matcher (`_match.pyx`)
        #: makes its table of the fields again when it moves.
        self.version = 0

    def __len__(self) -> int:
        """Number of buckets placed."""
        return self._count

    def _field(self, src: tuple[int, Any], create: bool) -> _Field | None:
        where, key = src
        if where == TYPE:
            return self._type
        table = self._values if where == VALUE else self._meta
        f = table.get(key)
        if f is None and create:
            f = table[key] = _Field()
        return f

    def posting(self, kind: str, src: tuple[int, Any], keys: Any) -> int:
        """How many entries an access (*kind* on field *src* with *keys*) would share its
        posting list with."""
        f = self._field(src, create=False)
        return 0 if f is None else f.size(kind, keys)

    def add(self, bucket: Bucket, plan: Plan) -> None:
        """Place *bucket* (a hashable, slotted engine bucket) as *plan* says."""
        entries: list[Entry] = []
        full = not plan.exact
        conjs = plan.conjs
        if plan.scan and full:
            conjs = conjs[:1]
        for conj in conjs:
            access = None if plan.scan and full else conj.access
            e = Entry(bucket, None if full else conj.rest, access)
            self._file(e)
            entries.append(e)
        shadow = plan.shadow
        for name in shadow:
            self._shadow.setdefault(name, {})[bucket] = None
        # Memory: one entry of a flat plan that pins no params (the common case) is alone,
        # else one tuple (shadow names, pinned params, entries...): a list and a tuple more
        # would cost ~110 bytes a subscription.
        pinned = plan.pinned
        alone = len(entries) == 1 and not shadow and pinned is not None and not pinned
        bucket.placed = entries[0] if alone else (shadow, pinned, *entries)
        self._count += 1

    def place_like(self, bucket: Bucket, like: Bucket) -> None:
        """Place *bucket* as placed *like* is (its accesses and checks), without planning:
        for a subscriber leaving a shared bucket by an update of params the index does not
        read (`movable`): the checks read the params when verifying."""
        placed = like.placed
        alone = type(placed) is Entry
        copies = []
        for e in (placed,) if alone else placed[2:]:
            c = Entry(bucket, e.rest, None)
            c.kind, c.src, c.keys = e.kind, e.src, e.keys
            self._file(c)
            copies.append(c)
        if alone:
            bucket.placed = copies[0]
        else:
            for name in placed[0]:
                self._shadow.setdefault(name, {})[bucket] = None
            bucket.placed = (placed[0], placed[1], *copies)
        self._count += 1

    def _file(self, e: Entry) -> None:
        """File *e* under its access, or on the scan list (no access: kind None)."""
        self.version += 1
        if e.kind is None:
            self._scan[e] = None
        else:
            f = self._field(e.src, create=True)
            assert f is not None
            f.add(e)

    def remove(self, bucket: Bucket) -> None:
        """Take *bucket* out (no-op if it is not placed)."""
        placed = bucket.placed
        if placed is None:
            return
        bucket.placed = None
        self._count -= 1
        self.version += 1
        if type(placed) is Entry:
            entries: tuple[Entry, ...] = (placed,)
        else:
            shadow, _, *rest = placed
            entries = tuple(rest)
            for name in shadow:
                table = self._shadow[name]
                del table[bucket]
                if not table:
                    del self._shadow[name]
        for e in entries:
            if e.kind is not None:
                src = e.src
                f = self._field(src, create=False)
                assert f is not None
                f.remove(e)
                if f.empty() and src[0] != TYPE:
                    del (self._values if src[0] == VALUE else self._meta)[src[1]]
            else:
                del self._scan[e]

    def movable(self, bucket: Bucket, names: Any) -> bool:
        """Whether params *names* of placed *bucket* can change without placing it again:
        its plan reads them when verifying and its accesses use none of them (the caller
        also keeps the set of param names as it is, so names resolve as they did)."""
        placed = bucket.placed
        if placed is None:
            return False
        if type(placed) is Entry:
            return True
        pinned = placed[1]
        return pinned is not None and pinned.isdisjoint(names)

    def rekey(self, bucket: Bucket, changed: Any, before: Any) -> bool:
        """Re-file placed *bucket* when the one param *changed* is its access's equality key
        (`Price == limit`, filed under the limit): its checks read params when verifying.
        False: the plan must be made again (`PatternEngine.update`)."""
        placed = bucket.placed
        if type(placed) is not tuple or len(placed) != 3 or len(changed) != 1:
            return False
        ((name, value),) = changed.items()
        e, old = placed[2], before.get(name)
        if (
            placed[1] != {name}
            or e.kind != EQ
            or e.keys != (old,)
            or not type(value) is type(old) is type(e.keys[0])
        ):
            return False
        if not hashable(value):  # unhashable, or NaN (equal to nothing)
            return False
        f = self._field(e.src, create=False)
        assert f is not None
        f.remove(e)
        e.keys = (value,)
        f.add(e)
        self.version += 1
        return True

    def match(
        self, event: Event, stamp: int, charge: Callable[[Bucket, int], None] | None = None
    ) -> tuple[list[Bucket], list[tuple[Bucket, SandboxStop]]]:
        """The placed buckets whose pattern *event* matches, and the ones the sandbox stopped.
        Marks each evaluated bucket with *stamp* (so a bucket is evaluated at most once).
        With *charge*, each bucket's evaluation is timed on the thread's CPU clock and
        charged to it (`charge(bucket, ns)`): dearer, for a sample of the events."""
        values = event.values
        cands: list[Entry] = []
        fields = self._values
        for name, v in values.items():
            f = fields.get(name)
            if f is not None:
                f.collect(v, cands, values)
        if not self._type.empty():
            self._type.collect(event.type, cands, values)
        if self._meta:
            for name, v in event.meta.items():
                f = self._meta.get(name)
                if f is not None:
                    f.collect(v, cands, values)
        if self._scan:
            cands.extend(self._scan)
        shadowed: list[Bucket] = []
        if self._shadow:
            for name in values:
                s = self._shadow.get(name)
                if s is not None:
                    shadowed.extend(s)
        self.candidates += len(cands) + len(shadowed)
        if charge is not None:
            return self._verify_timed(event, stamp, cands, shadowed, charge)
        return self._verify(event, stamp, cands, shadowed)

    def _verify_timed(
        self,
        event: Event,
        stamp: int,
        cands: list[Entry],
        shadowed: list[Bucket],
        charge: Callable[[Bucket, int], None],
    ) -> tuple[list[Bucket], list[tuple[Bucket, SandboxStop]]]:
        """`_verify`, one candidate at a time, each timed: the same outcome, at a clock read
        per candidate."""
        clock = time.thread_time_ns
        matched: list[Bucket] = []
        stops: list[tuple[Bucket, SandboxStop]] = []
        skip = set(shadowed) if shadowed else None
        for e in cands:
            b = e.bucket
            if b.stamp == stamp or skip is not None and b in skip:
                continue
            start = clock()
            m, s = self._verify(event, stamp, [e], [])
            charge(b, clock() - start)
            matched += m
            stops += s
        for b in shadowed:
            start = clock()
            m, s = self._verify(event, stamp, [], [b])
            charge(b, clock() - start)
            matched += m
            stops += s
        return matched, stops

    def _verify(
        self, event: Event, stamp: int, cands: list[Entry], shadowed: list[Bucket]
    ) -> tuple[list[Bucket], list[tuple[Bucket, SandboxStop]]]:
        values = event.values
        matched: list[Bucket] = []
        stops: list[tuple[Bucket, SandboxStop]] = []
        skip = set(shadowed) if shadowed else None
        for e in cands:
            b = e.bucket
            if b.stamp == stamp or skip is not None and b in skip:
                continue
            try:
                if e.rest is None:
                    b.stamp = stamp
                    if b.run(b, event):
                        matched.append(b)
                elif _holds(e.rest, values, event, b.params, self._reset):
                    b.stamp = stamp
                    matched.append(b)
            except SandboxStop as stop:
                b.stamp = stamp
                stops.append((b, stop))
            except Raised as raised:  # no match, and told (`runerrors.py`)
                b.stamp = stamp
                told(b, raised.exc)
        for b in shadowed:
            if b.stamp != stamp:
                b.stamp = stamp
                try:
                    if b.run(b, event):
                        matched.append(b)
                except SandboxStop as stop:
                    stops.append((b, stop))
        return matched, stops


def told(b: Bucket, exc: BaseException) -> None:
    """Tell the sandbox's error tallies that a check of predicate-tier bucket *b* raised
    *exc* (`runerrors.py`): for it, no match."""
    program = cast("PredicateProgram", b.instance.program)
    program.sandbox.errors.failed(b, exc, program.source, frozenset, expression=True, streak=False)


def _holds(
    rest: tuple[Any, ...], values: Any, event: Event, params: Any, reset: Callable[[], None]
) -> bool:
    """Every check of an exact conjunction holds (a check that raises does not). *rest* is
    flat: (where, key, fn, constant) four by four (one tuple: memory)."""
    if len(rest) == 4 and rest[0] == VALUE:
        # One check of an event value, the commonest rest: without the iterator and zip of
        # the loop below (~250 ns a candidate, a fifth of an event's time at 300k patterns).
        v = values.get(rest[1], _MISSING)
        if v is _MISSING:
            return False
        try:
            return bool(rest[2](v, rest[3]))
        except SandboxStop:
            raise
        except _PASS_THROUGH:
            raise
        except BaseException as exc:
            if isinstance(exc, NO_MATCH_IN_EXPRESSIONS):
                return False
            raise Raised(exc) from None
    it = iter(rest)
    try:
        for where, key, fn, c in zip(it, it, it, it):
            if where == VALUE:
                v = values.get(key, _MISSING)
                if v is _MISSING:
                    return False
            elif where == PARAM:
                v = values.get(key, _MISSING)
                if v is _MISSING:
                    return False
                c = params[c]
            elif where == TYPE:
                v = event.type
            elif where == META:
                v = event.meta.get(key, _MISSING)
                if v is _MISSING:
                    return False
            else:
                reset()
                if not fn(values, event, params):
                    return False
                continue
            if not fn(v, c):
                return False
    except SandboxStop:
        raise
    except _PASS_THROUGH:
        raise
    except BaseException as exc:
        if isinstance(exc, NO_MATCH_IN_EXPRESSIONS):
            return False
        raise Raised(exc) from None
    return True


class Raised(Exception):
    """An exception a check raised that is worth telling (`sandbox/runerrors.py`): no match, and
    counted for the bucket by `_verify`, which knows the bucket."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__()
        self.exc = exc
