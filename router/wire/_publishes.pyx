# cython: language_level=3, boundscheck=False, wraparound=False
"""Reading a client's publish frame, compiled (no I/O): the frame's bytes to its events.

`read` returns what the codec's reference path makes of the same payload
(`Connection.next_message` → `Publish.from_wire_steps` →
`aa.mesh.protocol.wire_events.events_from_wire_steps`): the frame's seq and the same events,
each checked against the value model. It reads the usual frame only and returns None for
anything else: a list, a map or an extension (a datetime) among an event's values or meta, a
nil meta, a key that is no str, an id of the wrong length, a list or map of more than
*max_items* items, more than *max_work* items in the whole frame, bytes that are not UTF-8 or
no msgpack, a frame that is wrong in any way. The reference path then reads that frame, in
its bounded steps, and says what is wrong: both paths give the same events and the same
errors. A flat value read from msgpack is always in the value model (its ints are 64-bit,
its keys here str), so the events it builds need no further check.

What it saves: msgpack's intermediate lists of the frame and of each event, the value
model's walk of each event's values, and a Python call per event.

`aa.router.wire.publishes` chooses it when it was built from this file as it is now and
``AA_PURE_PYTHON`` is not set; `tests/test_compiled_publishes.py` holds it to the reference.
Its msgpack primitives (`Buf` and its ``odd`` mark, `need`, the lengths, `read_scalar`) are
those of `mesh/_msgpack_read.pxi`, shared with the client's reader of delivery frames.
"""

from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.string cimport memcmp

include "../../mesh/_msgpack_read.pxi"

__all__ = ["new_cache", "read"]


cdef enum:
    SLOTS = 32  # places in a map whose key (and str value) is kept for the next event's
    KEPT_BYTES = 64  # longest str kept: a connection's cache holds a few kB at most


cdef object cached_str(Buf* b, Py_ssize_t n, list cache, Py_ssize_t slot):
    """The str of the next *n* bytes: the one kept at *slot* of *cache* when its UTF-8 is
    those bytes (str is immutable: events may share one), else a new one, kept there if it
    is short (the cache lives as long as the connection)."""
    cdef Py_ssize_t size
    cdef const char* data
    if n > KEPT_BYTES:
        return text(b, n)
    need(b, n)
    kept = cache[slot]
    if kept is not None:
        data = PyUnicode_AsUTF8AndSize(kept, &size)
        if size == n and memcmp(data, b.p + b.pos, n) == 0:
            b.pos += n
            return kept
    s = text(b, n)
    cache[slot] = s
    return s


cdef dict read_map(Buf* b, Py_ssize_t max_items, list cache):
    """A map of str keys and flat values; `_Other` for anything else. The usual events of a
    publish have the same keys in the same order, and often the same str values: those are
    read as the str kept in *cache* (`cached_str`, unless it is None) rather than made again."""
    cdef Py_ssize_t k = map_len(b)
    cdef Py_ssize_t j, n
    cdef unsigned char c
    cdef bint kept
    cdef dict out = {}
    if k > max_items:
        raise _Other()
    b.items += k
    for j in range(k):
        need(b, 1)
        c = b.p[b.pos]
        b.pos += 1
        n = str_len(b, c)
        if n < 0:
            raise _Other()
        kept = cache is not None and j < SLOTS
        key = cached_str(b, n, cache, 2 * j) if kept else text(b, n)
        need(b, 1)
        c = b.p[b.pos]
        if kept and 0xa0 <= c <= 0xbf:
            b.pos += 1
            out[key] = cached_str(b, c & 0x1f, cache, 2 * j + 1)
            continue
        value = read_scalar(b, None, 0)
        if value is NESTED:
            raise _Other()
        out[key] = value
    b.odd |= len(out) != k  # a key twice: the map packs shorter
    return out


def new_cache():
    """What `read` keeps between frames of one connection: the strs of its last event."""
    return [None] * (2 * SLOTS + 1)


def read(bytes payload, Py_ssize_t head, Py_ssize_t max_items, Py_ssize_t max_work, trusted,
         Py_ssize_t max_id, list cache, set_packed):
    """``(seq, events)`` of the publish frame *payload* (its bytes after the frame's length;
    the first *head* bytes are the publish map's start up to its ``seq`` key, checked by the
    caller) as `Publish.from_wire` makes them, or None when the reference path is to read it.

    *max_items*: most items in one list or map (the codec's ``max_items``); *max_work*: most
    items in all of the frame's lists and maps (more goes to the reference path, in steps);
    *trusted*: `Event.trusted`; *max_id*: the longest event id; *cache*: a `new_cache()`
    kept per connection; *set_packed*: the setter of `Event.packed`, given each event
    without a meta whose bytes in the frame are those `packed_event` would make of it (every
    part in the form msgpack's packer writes it), so that the router need not pack its
    values again."""
    if len(cache) != 2 * SLOTS + 1:  # indexed unchecked below
        raise ValueError("cache must be a list made by new_cache()")
    cdef Buf b
    b.p = <const unsigned char*>PyBytes_AS_STRING(payload)
    b.end = PyBytes_GET_SIZE(payload)
    b.pos = head
    b.items = 3  # the frame's map: kind, seq and events
    b.odd = False
    cdef Py_ssize_t n, i, start
    cdef unsigned char c
    cdef list out
    cdef dict values, meta
    try:
        seq = read_scalar(&b, None, 0)
        if type(seq) is not int:
            return None
        need(&b, 7)
        if b.p[b.pos] != 0xa6 or memcmp(b.p + b.pos + 1, b"events", 6) != 0:
            return None
        b.pos += 7
        n = array_len(&b)
        if n > max_items:
            return None
        b.items += n
        out = []
        for i in range(n):
            need(&b, 1)
            if b.p[b.pos] != 0x94:  # [id, type, values, meta]
                return None
            start = b.pos
            b.odd = False
            b.pos += 1
            b.items += 4
            eid = read_id(&b, max_id)
            need(&b, 1)
            if b.p[b.pos] == 0xc0:
                b.pos += 1
                etype = None
            else:
                c = b.p[b.pos]
                b.pos += 1
                n = str_len(&b, c)
                if n < 0:
                    return None
                etype = cached_str(&b, n, cache, 2 * SLOTS)
            values = read_map(&b, max_items, cache)
            need(&b, 1)
            if b.p[b.pos] == 0x80:  # no meta of the publisher's: the usual event
                b.pos += 1
                if b.items > max_work:
                    return None
                ev = trusted(values, etype, {}, eid)
                if not b.odd:
                    set_packed(ev, PyBytes_FromStringAndSize(<const char*>(b.p + start), b.pos - start))
                out.append(ev)
                continue
            meta = read_map(&b, max_items, None)
            if b.items > max_work:
                return None
            out.append(trusted(values, etype, meta, eid))
        if b.pos != b.end:
            return None
    except _Other:
        return None
    return seq, tuple(out)
