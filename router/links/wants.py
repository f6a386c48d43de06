"""What this router wants from the mesh (its `aa.mesh.Interest`): its subscribers' patterns,
its store, its mesh cache, its client caches.

- A predicate-tier pattern: per conjunction of its plan, the access predicate the index
  files it under — necessary for the conjunction to hold, since the index finds a
  conjunction only through it (`aa.router.patterns.index`): an equality on the type or a
  value gives that type or equality (``in`` gives one filter per constant), any other
  access on a value the presence of its name; a conjunction with no access, or an access on
  ``meta``, wants anything. Names the event may shadow (read as ``event[...]`` when present)
  make the pattern also want any event carrying them.
- Any other pattern (scripts, XPath, expressions outside the grammar): the names it declares
  it needs (``# needs:``, `aa.mesh.protocol.declared_needs`) must be present; without a
  declaration it wants anything. A declaration is a promise: a pattern that also matches
  events lacking a declared name misses those published on other routers.
- A store wants every persisted event; a mesh cache, when `MeshConfig.cache_interest`, every
  event not opted out of it; a client cache what its pattern wants, summarised like a
  subscription's (every router holds every client cache, for a client that roams, so every
  router wants what the caches want: a cache's events still reach every router).
"""

from __future__ import annotations

import logging
from typing import Any

from aa.mesh import CACHE_INTEREST, STORE_INTEREST, Interest, InterestFilter, PatternSpec
from aa.mesh.protocol import declared_needs

__all__ = ["cache_filters", "listening_filters", "pattern_filters", "Wants"]

log = logging.getLogger("aa.router.links")

_ANY = InterestFilter()
#: How a plan's access names its field and kind (`aa.router.patterns.predicates.plans`: VALUE, TYPE,
#: EQ; not part of the patterns room's face, so held here, and checked against it by
#: tests/test_mesh_interest_router.py).
VALUE, TYPE, EQ = 0, 1, "eq"


def _no_posting(kind: str, src: Any, keys: Any) -> int:
    return 0  # the selectivity estimate: any access is a necessary condition


def pattern_filters(bucket: Any) -> list[InterestFilter]:
    """The filters of one params bucket of the engine (`PatternEngine.bucket_of`)."""
    instance = bucket.instance
    kernel, format, source = instance.spec_key[:3]
    program = instance.program
    if getattr(program, "tier", None) == "predicate" and not getattr(instance, "remote", False):
        try:
            plan = program.plan(bucket.params, _no_posting)
        except Exception:  # never let routing break a subscribe: want anything
            log.debug("no plan for pattern %r", source, exc_info=True)
            return [_ANY]
        if plan.scan:
            return [_ANY]
        out = [InterestFilter.make(has=[name]) for name in plan.shadow]
        for conj in plan.conjs:
            access = conj.access
            if access is None:
                return [_ANY]
            where, key = access.src
            if where == TYPE and access.kind == EQ:
                out.extend(
                    InterestFilter.make(type=k) if type(k) is str else _ANY for k in access.keys
                )
            elif where == VALUE and access.kind == EQ:
                out.extend(InterestFilter.make(eq=[(key, k)], has=[key]) for k in access.keys)
            elif where == VALUE:
                out.append(InterestFilter.make(has=[key]))
            else:
                return [_ANY]
        return out
    needs = declared_needs(PatternSpec(kernel=kernel, format=format, source=source))
    return [InterestFilter.make(has=needs)] if needs else [_ANY]


def cache_filters(spec: PatternSpec, matcher: Any) -> list[InterestFilter]:
    """The filters of a client cache's pattern: its matcher's own params bucket when it
    runs here (`PatternEngine.matcher`), else (a worker's) its declared needs, else anything."""
    bucket = getattr(matcher, "bucket", None)
    if bucket is not None:
        return pattern_filters(bucket)
    needs = declared_needs(spec)
    return [InterestFilter.make(has=needs)] if needs else [_ANY]


def listening_filters(bucket: Any, filters: list[InterestFilter]) -> list[InterestFilter]:
    """What one params bucket's subscribers count for in quenching: its routing *filters*,
    plus the names its pattern declares it needs (`declared_needs`), since a prototype that
    carries them matches the pattern in quenching (`aa.router.quench`) whatever their values."""
    kernel, format, source = bucket.instance.spec_key[:3]
    needs = declared_needs(PatternSpec(kernel=kernel, format=format, source=source))
    return [*filters, InterestFilter.make(has=needs)] if needs else filters


class Wants:
    """Makes a router's interest, remembering each params bucket's filters (planning a
    pattern again for every summary would cost a parse per distinct pattern). Also makes
    what its subscriptions alone want (`listening`), which quenching answers from: no store,
    mesh cache or client cache there, since those are nobody listening."""

    def __init__(self, router: Any) -> None:
        self._router = router
        self._filters: dict[Any, list[InterestFilter]] = {}
        self._listening: dict[Any, list[InterestFilter]] = {}
        self._listened: list[InterestFilter] = []

    def __call__(self) -> Interest:
        """The router's interest now."""
        router = self._router
        filters: list[InterestFilter] = []
        if router.storage.store is not None:
            filters.append(STORE_INTEREST)
        if router.mesh_cache is not None and router.config.mesh.cache_interest:
            filters.append(CACHE_INTEREST)
        engine = router.engine
        known = self._filters
        fresh: dict[Any, list[InterestFilter]] = {}
        heard = self._listening
        listening: dict[Any, list[InterestFilter]] = {}
        for key in engine.keys():  # noqa: SIM118 (a PatternEngine, not a mapping)
            bucket = engine.bucket_of(key)
            if bucket is None:
                continue
            k = (bucket.instance.spec_key, bucket.params_key)
            if k in fresh:
                continue
            got = known.get(k)
            fresh[k] = got if got is not None else pattern_filters(bucket)
            got = heard.get(k)
            listening[k] = got if got is not None else listening_filters(bucket, fresh[k])
        # Unchanged tables keep the objects made before: new ones, made just after thousands
        # of client caches went, would live on among their freed blocks and keep Python's
        # allocator from giving those arenas back.
        if listening != heard:
            self._listening = listening
            self._listened = [f for got in listening.values() for f in got]
        for spec, matcher in router.caches.patterns():
            ck = ("cache", spec.kernel, spec.format, spec.source)
            got = known.get(ck)
            fresh[ck] = got if got is not None else cache_filters(spec, matcher)
        if fresh != known:
            self._filters = fresh
        for got in fresh.values():
            filters.extend(got)
        return Interest.of(filters)

    def listening(self) -> Interest:
        """What the router's subscriptions want, as of the last call of this object."""
        return Interest.of(self._listened)
