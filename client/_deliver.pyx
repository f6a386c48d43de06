# cython: language_level=3, boundscheck=False, wraparound=False
"""Reading a router's delivery frame, compiled (no I/O): the frame's bytes to its items.

`read` returns what the codec's reference path makes of the same payload
(`Connection.next_message` → `Deliver.from_wire` → `aa.mesh.protocol.wire_events.deliver_items`):
the same items, each event's values and meta checked against the value model. It reads the
usual frame only, and returns None for anything else — a nested value, an extension type
among the values, an odd sub id, bytes that are not UTF-8, a frame that is wrong in any way
or holds more items than the codec takes: the reference path then reads the frame and says
what is wrong, so both paths give the same errors.

What it saves: the frame's intermediate lists, and decoding each event's meta again. A
router stamps the events of one publish alike, so consecutive events mostly carry the same
meta bytes: those are decoded and checked once (by msgpack, as the reference does), and
each event gets its own copy of that map (lists and maps in it copied too: no event shares
a mutable value with another).

`aa.client.deliveries` chooses it when it was built from this file as it is now and
``AA_PURE_PYTHON`` is not set; `tests/test_compiled_deliveries.py` holds it to the
reference. Its msgpack primitives (`Buf`, `need`, the lengths, `read_scalar`) are those of
`mesh/_msgpack_read.pxi`, shared with the router's reader of publish frames.
"""

from cpython.dict cimport PyDict_Copy
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.math cimport INFINITY
from libc.string cimport memcmp, memset
from cpython.mem cimport PyMem_Calloc, PyMem_Free
from libc.stdint cimport uint64_t

include "../mesh/_msgpack_read.pxi"

__all__ = ["DeliveredIds", "hand_over", "read"]


cdef enum:
    SLOTS = 16  # the values' first keys and str values whose text `read` keeps per frame
    _TUPLE_SIDS = 8  # sub ids of one event id `DeliveredIds` keeps in a tuple; more: a set
    MAX_DEPTH = 64  # deepest nesting `skip` follows (deeper: the reference path reads it)


cdef object read_key(Buf* b, list slots, Py_ssize_t j):
    """`read_str`, through *slots* (`slot_text`)."""
    need(b, 1)
    cdef unsigned char c = b.p[b.pos]
    b.pos += 1
    cdef Py_ssize_t n = str_len(b, c)
    if n < 0:
        raise _Other()
    return slot_text(b, n, slots, j)


cdef int skip(Buf* b, int depth) except -1:
    """Step over one value of any kind, counting the items of its lists and maps."""
    if depth > MAX_DEPTH:
        raise _Other()
    need(b, 1)
    cdef unsigned char c = b.p[b.pos]
    cdef Py_ssize_t n, i
    if c <= 0x7f or c >= 0xe0 or c == 0xc0 or c == 0xc2 or c == 0xc3:
        b.pos += 1
        return 0
    if 0x80 <= c <= 0x8f or c == 0xde or c == 0xdf:
        n = map_len(b)
        b.items += n
        for i in range(2 * n):
            skip(b, depth + 1)
        return 0
    if 0x90 <= c <= 0x9f or c == 0xdc or c == 0xdd:
        n = array_len(b)
        b.items += n
        for i in range(n):
            skip(b, depth + 1)
        return 0
    b.pos += 1
    n = str_len(b, c)
    if n >= 0:
        need(b, n)
        b.pos += n
        return 0
    if c == 0xcc or c == 0xd0:
        n = 1
    elif c == 0xcd or c == 0xd1:
        n = 2
    elif c == 0xce or c == 0xd2 or c == 0xca:
        n = 4
    elif c == 0xcf or c == 0xd3 or c == 0xcb:
        n = 8
    elif 0xd4 <= c <= 0xd8:  # fixext 1, 2, 4, 8, 16: a type byte, then the data
        n = 1 + (1 << (c - 0xd4))
    elif 0xc4 <= c <= 0xc9:  # bin 8, 16, 32, ext 8, 16, 32
        i = 1 << ((c - 0xc4) % 3)
        need(b, i)
        n = <Py_ssize_t>be(b.p + b.pos, <int>i)
        b.pos += i
        if c >= 0xc7:
            n += 1  # the ext's type byte
    else:
        raise _Other()  # 0xc1: never used
    need(b, n)
    b.pos += n
    return 0


cdef object copied(object value):
    """*value* with each list and map in it copied (its scalars are immutable)."""
    if type(value) is dict:
        return {k: copied(v) for k, v in (<dict>value).items()}
    if type(value) is list:
        return [copied(v) for v in <list>value]
    return value


cdef dict copied_meta(dict meta, tuple mutable):
    """`copied(meta)`, *mutable* the keys of its lists and maps: the map copied whole, then
    those values copied in place (a stamp has one, its path)."""
    cdef dict out = PyDict_Copy(meta)
    for k in mutable:
        out[k] = copied(meta[k])
    return out


cdef tuple mutable_keys(dict meta):
    """The keys of *meta* whose values are lists or maps (`copied_meta`)."""
    return tuple([k for k, v in meta.items() if type(v) is dict or type(v) is list])


cdef inline int within(Buf* b, Py_ssize_t max_values) except -1:
    """`_Other` as soon as a frame of more than *max_values* bytes has more than that many
    items counted so far (the reference refuses it in steps): one frame of 16 MiB of tiny or
    nested events is not built whole, in one uninterrupted call, only to be refused after."""
    if b.end > max_values and b.items > max_values:
        raise _Other()
    return 0


def read(bytes payload, Py_ssize_t head, Py_ssize_t max_values, list cache, trusted, valid_map,
         unpack, Py_ssize_t max_id):
    """The items of the delivery frame *payload* (its bytes after the frame's length; the
    first *head* bytes are the deliver map's start, checked by the caller) as
    `deliver_items` makes them, or None when the reference path is to read it.

    *max_values*: most items in all its lists and maps (counted as the codec counts them for
    a frame of more bytes than that); *cache*: ``[meta bytes, meta]``, the last meta read,
    kept by the caller per connection; *trusted*: `Event.trusted`; *valid_map*: the value
    model's check of a map; *unpack*: msgpack's decoding as the codec does it, for a meta or
    values map the flat reader does not build; *max_id*: the longest event id."""
    cdef Buf b
    b.p = <const unsigned char*>PyBytes_AS_STRING(payload)
    b.end = PyBytes_GET_SIZE(payload)
    b.pos = head
    b.items = 2  # the frame's map: kind and items
    b.odd = False  # not looked at
    cdef Py_ssize_t n, i, k, j, start, size
    cdef list out
    cdef dict values
    cdef bytes last_raw = cache[0]
    last_meta = cache[1]
    cdef tuple last_mutable = mutable_keys(last_meta) if type(last_meta) is dict else ()
    cdef list key_slots = [None] * SLOTS
    cdef list text_slots = [None] * SLOTS
    last_sids = None  # the sub ids of the item before, and its byte if it was one fixint
    cdef int last_sid = -1
    try:
        n = array_len(&b)
        b.items += n
        within(&b, max_values)
        out = []
        for i in range(n):
            need(&b, 1)
            if b.p[b.pos] != 0x92:  # [sub_ids, event]
                raise _Other()
            b.pos += 1
            start = b.pos
            k = array_len(&b)
            b.items += 2 + k + 4
            within(&b, max_values)
            if k == 1 and b.pos < b.end and b.p[b.pos] == last_sid:
                b.pos += 1  # the same one sub id (a fixint) as the item before: its tuple again
            else:
                sids = []
                for j in range(k):
                    sid = read_scalar(&b, text_slots, SLOTS)
                    if type(sid) is not int:
                        raise _Other()
                    sids.append(sid)
                last_sids = tuple(sids)
                last_sid = b.p[start + 1] if k == 1 and b.pos == start + 2 else -1
            need(&b, 1)
            if b.p[b.pos] != 0x94:  # [id, type, values, meta]
                raise _Other()
            b.pos += 1
            eid = read_id(&b, max_id)
            need(&b, 1)
            if b.p[b.pos] == 0xc0:
                b.pos += 1
                etype = None
            else:
                etype = read_key(&b, text_slots, SLOTS - 1)
            start = b.pos
            k = map_len(&b)
            b.items += k
            within(&b, max_values)
            values = {}
            for j in range(k):
                key = read_key(&b, key_slots, j)
                value = read_scalar(&b, text_slots, j)
                if value is NESTED:
                    break
                values[key] = value
            else:
                value = None
            if value is NESTED:
                b.pos = start
                b.items -= k
                skip(&b, 0)
                within(&b, max_values)
                values_any = unpack(payload[start : b.pos])
                if type(values_any) is not dict or not valid_map(values_any, 0):
                    raise _Other()
                values = values_any
            start = b.pos
            skip(&b, 0)
            within(&b, max_values)
            size = b.pos - start
            if (
                last_raw is not None
                and PyBytes_GET_SIZE(last_raw) == size
                and memcmp(PyBytes_AS_STRING(last_raw), b.p + start, size) == 0
            ):
                meta = copied_meta(last_meta, last_mutable)
            else:
                last_raw = payload[start : b.pos]
                meta = unpack(last_raw)
                if type(meta) is not dict or meta and not valid_map(meta, 0):
                    raise _Other()
                last_meta = copied(meta)
                last_mutable = mutable_keys(last_meta)
            out.append((last_sids, trusted(values, etype, meta, eid)))
        if b.pos != b.end or b.end > max_values and b.items > max_values:
            raise _Other()
    except Exception:  # _Other, or msgpack's or the ext hook's error: the reference says
        return None
    cache[0] = last_raw
    cache[1] = last_meta
    return tuple(out)


cdef inline bint _holds(held, sid) except -1:
    """Whether *held*, what a generation of `DeliveredIds` maps an event id to (a sub id, a
    tuple of them, or a set of them), holds *sid*."""
    if type(held) is tuple:
        return sid in <tuple>held
    if type(held) is set:
        return sid in <set>held
    return held == sid


cdef class DeliveredIds:
    """The (sub id, event id) pairs a client delivered lately: `aa.mesh.SeenIds` of those
    pairs, the same window and the same answers (`check`), without a tuple made, hashed and
    kept per pair. Each generation maps an event id to its sub id (or a tuple of them, for
    an event of a few subscriptions, a set for one of many: a bound on each check's time
    whatever sub ids a router sends), and counts its pairs as `SeenIds` counts its ids:
    at most *max_ids* pairs kept, none longer than *max_age* seconds.

    Beside each generation, one bit per event id's hash (a Bloom filter of one hash, eight
    bits or more per pair it may hold): an id whose bit is clear is in no pair of that
    generation, and its map is not looked into. Nearly every delivered event is new, and
    the maps of 100,000 pairs are mostly out of the processor's caches; the bits fit. They
    are allocated at the first check: a client that is never delivered an event (one that
    only publishes) does not carry them."""

    cdef readonly Py_ssize_t max_ids
    cdef readonly double max_age
    cdef Py_ssize_t half_ids, n_current, n_previous
    cdef double half_age, started, previous_started, deadline
    cdef dict current, previous
    cdef uint64_t* marks_current
    cdef uint64_t* marks_previous
    cdef uint64_t mask  # a hash's bit: its low bits, under this mask
    cdef size_t words

    def __cinit__(self, *, Py_ssize_t max_ids, double max_age):
        if max_ids < 2 or not max_age > 0:
            raise ValueError("max_ids must be at least 2 and max_age positive")
        cdef uint64_t bits = 64
        while bits < 8 * <uint64_t>(max_ids // 2):
            bits <<= 1
        self.mask = bits - 1
        self.words = bits // 64

    cdef int _allocate(self) except -1:
        self.marks_current = <uint64_t*>PyMem_Calloc(self.words, sizeof(uint64_t))
        self.marks_previous = <uint64_t*>PyMem_Calloc(self.words, sizeof(uint64_t))
        if self.marks_current == NULL or self.marks_previous == NULL:
            PyMem_Free(self.marks_current)
            PyMem_Free(self.marks_previous)
            self.marks_current = self.marks_previous = NULL
            raise MemoryError()
        return 0

    def __dealloc__(self):
        PyMem_Free(self.marks_current)
        PyMem_Free(self.marks_previous)

    def __init__(self, *, Py_ssize_t max_ids, double max_age):
        self.max_ids = max_ids
        self.max_age = max_age
        self.half_ids = max_ids // 2
        self.half_age = max_age / 2
        self.current = {}
        self.previous = {}
        self.n_current = self.n_previous = 0
        self.started = self.previous_started = self.deadline = -INFINITY

    cpdef bint check(self, object sid, object eid, double now) except -1:
        """True if the pair (*sid*, *eid*) is new (and remember it from now on); False if
        delivered before. *now* is monotonic time in seconds."""
        if self.marks_current == NULL:
            self._allocate()
        if now >= self.deadline or self.n_current >= self.half_ids:
            self._age(now)
        cdef uint64_t bit = (<uint64_t>hash(eid)) & self.mask
        cdef size_t word = bit >> 6
        cdef uint64_t mark = (<uint64_t>1) << (bit & 63)
        held = self.current.get(eid) if self.marks_current[word] & mark else None
        if held is not None and _holds(held, sid):
            return False
        if self.marks_previous[word] & mark:
            was = self.previous.get(eid)
            if was is not None and _holds(was, sid):
                return False
        self.marks_current[word] |= mark
        if held is None:
            self.current[eid] = sid
        elif type(held) is set:
            (<set>held).add(sid)
        elif type(held) is tuple:
            if len(<tuple>held) < _TUPLE_SIDS:
                self.current[eid] = <tuple>held + (sid,)
            else:  # one event id of many subscriptions: a set, or each new one costs them all
                many = set(<tuple>held)
                many.add(sid)
                self.current[eid] = many
        else:
            self.current[eid] = (held, sid)
        self.n_current += 1
        return True

    cdef int _age(self, double now) except -1:
        if now - self.started >= self.half_age or self.n_current >= self.half_ids:
            self.previous, self.previous_started, self.n_previous = (
                self.current, self.started, self.n_current
            )
            self.current, self.started, self.n_current = {}, now, 0
            self.marks_previous, self.marks_current = self.marks_current, self.marks_previous
            memset(self.marks_current, 0, self.words * sizeof(uint64_t))
        if now - self.previous_started >= self.max_age:
            self.previous, self.previous_started, self.n_previous = {}, now, 0
            memset(self.marks_previous, 0, self.words * sizeof(uint64_t))
        self.deadline = min(self.started + self.half_age, self.previous_started + self.max_age)
        return 0

    def __len__(self):
        return self.n_current + self.n_previous


def hand_over(items, dict subs, DeliveredIds seen, double now):
    """`aa.client.deliveries.hand_over`'s loop, compiled, with *seen* for its `SeenIds`."""
    cdef bint fresh_only
    for sub_ids, event in items:
        eid = event.id
        fresh_only = eid is not None and not event.meta.get("historical")
        for sid in sub_ids:
            if fresh_only and not seen.check(sid, eid, now):
                continue
            sub = subs.get(sid)
            if sub is not None:
                sub.deliver(event)
