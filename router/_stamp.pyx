# cython: language_level=3, boundscheck=False, wraparound=False
"""Stamping a client's publish, compiled (no I/O): `Dispatcher.accept`'s loop over the events.

`stamp` does what the loop in `aa.router.dispatch.Dispatcher._stamp` does, the reference,
for the same arguments: the same ids, the same duplicates dropped, the same meta maps with
their keys in the same order, the same events. It is chosen by `aa.router.dispatch` when it
was built from this file as it is now and ``AA_PURE_PYTHON`` is not set;
`tests/test_compiled_golden.py` holds the two equal.
"""

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
):
    """(stamped, alike, duplicates) for *events*: the stamped events in order (the retried
    ones left out), those of them whose meta is the stamp *shared* alone, and how many were
    retries. *seen_check* is the flood rules' seen-id check (`SeenIds.check`): an id it has
    seen is a retry, the rest get *ttl* and a path of *router_id* (`FloodRules.originate`)."""
    cdef list out = []
    cdef list alike = []
    cdef Py_ssize_t duplicates = 0
    cdef dict meta
    for ev in events:
        eid = ev.id
        if eid is None:
            eid = new_id()
        elif own is not None:
            eid = scoped_id(own, eid)
        if not seen_check(eid, now):
            duplicates += 1  # a retried publish: already in the mesh
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
        alike.append(stamped)
    return out, alike, duplicates
