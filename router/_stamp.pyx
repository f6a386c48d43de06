# cython: language_level=3, boundscheck=False, wraparound=False
"""Stamping a client's publish, compiled (no I/O): `Dispatcher.accept`'s loop over the events.

`stamp` does what the loop in `aa.router.dispatch.Dispatcher._stamp` does, the reference,
for the same arguments: the same ids, the same duplicates dropped, the same meta maps with
their keys in the same order, the same events. It is chosen by `aa.router.dispatch` when it
was built from this file as it is now and ``AA_PURE_PYTHON`` is not set;
`tests/test_compiled_golden.py` holds the two equal.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.string cimport memcpy

__all__ = ["stamp"]


def stamp(
    events,
    dict shared,
    own,
    new_id,
    scoped_id,
    seen_check,
    double now,
    ttl,
    router_id,
    trusted,
    router_meta_keys,
    ttl_key,
    path_key,
    pack=None,
    set_packed=None,
    seen=None,
):
    """(stamped, alike, duplicates) for *events*: the stamped events in order (the retried
    ones left out), those of them whose meta is the stamp *shared* alone, and how many were
    retries. *seen_check* is the flood rules' seen-id check (`SeenIds.check`): an id it has
    seen is a retry, the rest get *ttl* and a path of *router_id* (`FloodRules.originate`).

    With *pack* (the codec's `pack`) and *set_packed* (the setter of `Event.packed`), a
    stamped event whose meta is the stamp alone and whose source kept its bytes, in the
    packer's form with an empty meta at their end (the router's publish reader keeps them),
    gets those bytes with the stamp's packed in place of the empty meta, and is left out of
    *alike*: what `aa.mesh.protocol.pack_with_meta` gives it, without a second loop.

    With *seen*, the plain `SeenIds` whose `check` *seen_check* is, the ids of a batch that
    moves none of its generations (`SeenIds.check_many`'s condition) are looked up and kept
    in its dicts here, without a call per event: what its `check` of each would do."""
    cdef list out = []
    cdef list alike = []
    cdef Py_ssize_t duplicates = 0, size, stamp_size = 0
    cdef bytes joined
    cdef char* into
    cdef dict meta
    cdef bint packing = pack is not None and set_packed is not None
    cdef object stamp_bytes = None
    cdef dict current = None
    cdef dict previous = None
    if seen is not None:
        current = seen._current
        previous = seen._previous
        # a generation holds a key of its own besides the ids (`aa.mesh.flood._KEYED`)
        if not (now < seen._deadline and len(current) - 1 + len(events) <= seen._half_ids):
            current = None  # a generation moves on the way: `check` of each
    for ev in events:
        eid = ev.id
        if eid is None:
            eid = new_id()
        elif own is not None:
            if not (type(eid) is str and (<str>eid).startswith(own)):
                eid = scoped_id(own, eid)
        if current is not None:
            if eid in current or eid in previous:
                duplicates += 1  # a retried publish: already in the mesh
                continue
            current[eid] = None
        elif not seen_check(eid, now):
            duplicates += 1
            continue
        own_meta = ev.meta
        if own_meta:
            meta = {k: v for k, v in own_meta.items() if k not in router_meta_keys}
            meta.update(shared)  # a publisher's own "user" went with the router's keys
            meta[ttl_key] = ttl
            meta[path_key] = [router_id]
            out.append(trusted(ev.values, ev.type, meta, eid))
            continue
        meta = shared.copy()
        meta[ttl_key] = ttl
        meta[path_key] = [router_id]
        stamped = trusted(ev.values, ev.type, meta, eid)
        out.append(stamped)
        if packing:
            data = ev.packed
            if type(data) is bytes and eid == ev.id:
                size = len(<bytes>data)
                if size and (<bytes>data)[size - 1] == 0x80:
                    if stamp_bytes is None:
                        try:
                            stamp_bytes = bytes(pack(meta))
                            stamp_size = len(<bytes>stamp_bytes)
                        except (TypeError, ValueError, OverflowError):
                            packing = False  # never for a stamp: left to pack_with_meta
                    if packing:  # the source's bytes but their empty meta, then the stamp's
                        joined = PyBytes_FromStringAndSize(NULL, size - 1 + stamp_size)
                        into = PyBytes_AS_STRING(joined)
                        memcpy(into, PyBytes_AS_STRING(<bytes>data), size - 1)
                        memcpy(into + size - 1, PyBytes_AS_STRING(<bytes>stamp_bytes), stamp_size)
                        set_packed(stamped, joined)
                        continue
        alike.append(stamped)
    return out, alike, duplicates
