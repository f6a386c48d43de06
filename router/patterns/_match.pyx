# cython: language_level=3, boundscheck=False, wraparound=False
"""Matching the usual event, compiled (no I/O): `PatternEngine.match` when only the predicate
index has patterns.

A `Matcher` is made once per engine. `Matcher.match(event)` returns what
`PatternEngine.match(event)` returns, the reference in `engine.py`, with the same effects on
the engine and its buckets (the engine's evaluation mark, each evaluated bucket's mark, the
index's count of candidates, a raising check told to the sandbox's error tallies), or None
without any effect: the caller then runs the reference. It takes the event only when no
worker pool has patterns, no bucket is on the engine's scan list, no run-time error of a
pattern is pending, the index has no meta field and no shadowed name, and the event is not
one of those timed for `cpu_top` (one in `CPU_SAMPLE_EVERY`). `Matcher.deliver_each(events)`
is `PatternEngine.deliver_each`: each delivery of each event handed to its key's `deliver`,
in order, an event the matcher does not take matched by the engine's `match`.

The index's probe reads a table of each value field's equality, prefix, suffix and presence
postings, emptied whenever the index changes (`PredicateIndex.version`) and filled again with
each field as an event first carries it (a change costs as much as the fields read, however
many the index has); a field with ranges, pairs or intervals is asked through its own
`collect`. The candidates are found in the order the reference finds them. A candidate whose
conjunction has one check of an event value is verified here; any other (a whole pattern to
run, several checks) and the rest after it are verified by the reference's `_verify`, so the
order of evaluation is the reference's.

The engine's and the index's containers are held from the start (neither replaces them);
what may change between two events (the worker pool, the counts, the evaluation mark) is
read per event, since a delivery may call back into the engine.

`aa.router.patterns.engine` chooses it when it was built from this file as it is now and
``AA_PURE_PYTHON`` is not set; `tests/test_compiled_match.py` holds it to the reference.
"""

from aa.router.patterns.index.buckets import Member, first
from aa.router.patterns.index.postings import Entry
from aa.router.patterns.index.predicate_index import told
from aa.router.patterns.predicates import VALUE
from aa.router.patterns.sandbox import NO_MATCH_IN_EXPRESSIONS, SandboxStop

__all__ = ["Matcher"]

cdef object _MISSING = object()
cdef long _VALUE = VALUE


cdef class _Field:
    """One value field's postings, as the probe reads them (None: that kind is empty)."""

    cdef object field  # the index's own field, when it has ranges, pairs or intervals
    cdef dict eq
    cdef dict prefix
    cdef tuple prefix_lens
    cdef dict suffix
    cdef tuple suffix_lens
    cdef list present


cdef _Field _probe_of(f):
    """The probe's view of the index's field *f*, or None when *f* holds nothing."""
    cdef _Field p = _Field()
    if f.intervals or f.ranges or f.pairs:
        p.field = f
        return p
    p.eq = f.eq or None
    p.prefix = f.prefix or None
    p.prefix_lens = tuple(f.prefix_lens)
    p.suffix = f.suffix or None
    p.suffix_lens = tuple(f.suffix_lens)
    p.present = list(f.present) or None
    if p.eq is None and p.prefix is None and p.suffix is None and p.present is None:
        return None
    return p


cdef inline void _posted(list out, p):
    if p is None:
        return
    if type(p) is Entry:
        out.append(p)
    else:
        out.extend(p)


cdef void _collect(_Field p, v, list out, dict values) except *:
    """`_Field.collect` of the reference, for a field of equalities, prefixes, suffixes and
    presences: the same entries in the same order."""
    cdef Py_ssize_t n, length
    if p.field is not None:
        p.field.collect(v, out, values)
        return
    if p.eq is not None:
        try:
            q = p.eq.get(v)
        except TypeError:  # unhashable: equal to no constant
            q = None
        _posted(out, q)
    if (p.prefix is not None or p.suffix is not None) and isinstance(v, str):
        n = len(<str>v)
        if p.prefix is not None:
            for length in p.prefix_lens:
                if length <= n:
                    _posted(out, p.prefix.get((<str>v)[:length]))
        if p.suffix is not None:
            for length in p.suffix_lens:
                if length <= n:
                    _posted(out, p.suffix.get((<str>v)[n - length :]))
    if p.present is not None:
        out.extend(p.present)


cdef class Matcher:
    """The compiled `match` of one `PatternEngine` (see the module docstring)."""

    cdef object engine
    cdef object tier
    cdef object index
    cdef dict scan  # the engine's buckets run per event
    cdef dict tallies  # the sandbox's pending run-time errors
    cdef dict values  # the index's value fields
    cdef dict meta  # the index's meta fields
    cdef dict shadow  # the index's shadowed names
    cdef dict index_scan  # the index's entries with no access
    cdef object type_source  # the index's field of the event type
    cdef long every
    cdef object version  # the index's version the table below was made at
    cdef dict fields  # value name -> _Field, of the fields events read since the last change
    cdef _Field type_field  # None: no pattern reads the event type

    def __init__(self, engine, index, tier, scan, tallies, long every):
        self.engine = engine
        self.index = index
        self.tier = tier
        self.scan = scan
        self.tallies = tallies
        self.values = index._values
        self.meta = index._meta
        self.shadow = index._shadow
        self.index_scan = index._scan
        self.type_source = index._type
        self.every = every
        self.version = None

    cdef void _table(self) except *:
        """Empty the probe's table of the index's fields, if the index changed: each field is
        made again when an event first carries it (`_probe`), so a change costs as much as
        the fields the next events read, not as much as all the index's fields."""
        version = self.index.version
        if version is self.version or version == self.version:
            return
        self.fields = {}
        self.type_field = _probe_of(self.type_source)
        self.version = version

    cdef _Field _probe(self, name):
        """The probe of value field *name*, not in the table yet, or None when no pattern
        reads it."""
        f = self.values.get(name)
        if f is None:
            return None
        cdef _Field p = _probe_of(f)
        if p is not None:
            self.fields[name] = p
        return p

    def match(self, event):
        """`PatternEngine.match(event)` for the usual event, or None (nothing done)."""
        return self._match(event)

    def deliver_each(self, events):
        """`key.deliver(ev)` for each (key, ev) `PatternEngine.match` gives each of
        *events*, in order."""
        engine = self.engine
        for event in events:
            out = self._match(event, True)
            if out is None:
                out = engine.match(event)
            for key, ev in out:
                key.deliver(ev)

    cdef object _match(self, event, bint deliver=False):
        """The deliveries of *event*, or None (nothing done). With *deliver*, those of
        the usual outcome (no stop, no pending error) are handed to their keys here, once
        the whole event is matched, and an empty list returned."""
        engine = self.engine
        cdef long stamp = engine._stamp + 1
        if stamp % self.every == 0:
            return None  # timed for cpu_top: the reference's way
        pool = self.tier.pool
        if pool is not None and len(pool):
            return None
        if self.scan or self.tallies or self.meta or self.shadow:
            return None
        index = self.index
        if not index._count:
            return None
        self._table()
        engine._stamp = stamp

        cdef dict values = event.values
        cdef list cands = []
        cdef dict fields = self.fields
        cdef _Field p
        if self.values:
            for name, v in values.items():
                p = fields.get(name)
                if p is None:
                    p = self._probe(name)
                    if p is None:
                        continue
                _collect(p, v, cands, values)
        if self.type_field is not None:
            _collect(self.type_field, event.type, cands, values)
        if self.index_scan:
            cands.extend(self.index_scan)

        cdef list matched = []
        cdef list stops = []
        cdef Py_ssize_t i, n = len(cands)
        cdef tuple rest
        for i in range(n):
            e = cands[i]
            b = e.bucket
            if b.stamp == stamp:
                continue
            r = e.rest
            if type(r) is not tuple or len(<tuple>r) != 4 or (<tuple>r)[0] != _VALUE:
                more, stopped = index._verify(event, stamp, cands[i:], [])
                matched += more
                stops += stopped
                break
            rest = <tuple>r
            v = values.get(rest[1], _MISSING)
            if v is _MISSING:
                continue
            try:
                ok = bool(rest[2](v, rest[3]))
            except SandboxStop as stop:
                b.stamp = stamp
                stops.append((b, stop))
                continue
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:
                if not isinstance(exc, NO_MATCH_IN_EXPRESSIONS):
                    b.stamp = stamp
                    told(b, exc)
                continue
            if ok:
                b.stamp = stamp
                matched.append(b)
        if n:
            index.candidates += n

        if stops or self.scan or self.tallies:
            return engine._matched(event, matched, stops, None)
        if not matched:
            return []
        if len(matched) == 1:
            members = (<object>matched[0]).members
            if type(members) is Member:
                if deliver:
                    members.key.deliver(event)
                    return []
                return [(members.key, event)]
            out = [(sub.key, event) for sub in members.values()]
        else:
            hits = [(sub.seq, sub.key, event) for b in matched for sub in b.members.values()]
            hits.sort(key=first)
            out = [(key, ev) for _, key, ev in hits]
        if deliver:
            for key, ev in out:
                key.deliver(ev)
            return []
        return out
