"""`PatternSet`: patterns that are no subscribers (client caches, HTTP-registered patterns,
history queries), matched against an event all at once through the predicate index.

    >>> # caches = PatternSet(router.engine)
    >>> # caches.add("phone-7", PatternSpec(source='Device == "phone-7"'))   -> "predicate"
    >>> # caches.match(event)                                               -> ["phone-7", ...]

Client caches use it (`aa.router.caches.CacheIndex`): every predicate-tier pattern is found
through its access predicate (equality, `in`, ranges, intervals, prefixes, presence; see
`index/predicate_index.py`), any other pattern is evaluated per event by its standalone matcher
(`PatternEngine.matcher`). Same answers as calling each matcher. A pattern the sandbox stops
answers no more and is listed in `stopped`.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any

from aa.mesh import Event, PatternSpec, UsageError

from .index import PredicateIndex
from .predicates import PredicateProgram

if TYPE_CHECKING:
    from .engine import PatternEngine
    from .index import Bucket, Matcher

__all__ = ["PatternSet"]


class PatternSet:
    """Patterns under keys of the caller's choice; `match(event)` → the keys that accept it."""

    def __init__(self, engine: PatternEngine) -> None:
        self._engine = engine
        budget = engine.sandbox.budget
        self._index = PredicateIndex(lambda: setattr(budget, "allocated", 0))
        self._matchers: dict[Hashable, Matcher] = {}
        self._scan: dict[Hashable, Matcher] = {}
        self._keys: dict[Bucket, Hashable] = {}
        self._order: dict[Hashable, int] = {}
        self._seq = 0
        self._stamp = 0
        #: Key → why the sandbox stopped its pattern (it then accepts nothing).
        self.stopped: dict[Hashable, str] = {}

    def add(self, key: Hashable, spec: PatternSpec, params: Mapping[str, Any] | None = None) -> str:
        """Add pattern *spec* under *key*; returns its tier ("predicate" or "sandbox").
        Raises `UsageError` if *key* is taken, and `PatternError`/`InvalidValue` like
        `PatternEngine.subscribe`."""
        if key in self._matchers:
            raise UsageError(f"pattern {key!r} is already in the set")
        return self.add_matcher(key, self._engine.matcher(spec, params))

    def add_matcher(self, key: Hashable, matcher: Matcher) -> str:
        """Add a standalone matcher the caller already holds (`PatternEngine.matcher` of this
        set's engine) under *key*: the set places its bucket, so the matcher must be in no
        other set. Returns its tier; raises `UsageError` if *key* is taken."""
        if key in self._matchers:
            raise UsageError(f"pattern {key!r} is already in the set")
        self._matchers[key] = matcher
        self._seq += 1
        self._order[key] = self._seq
        self._place(key, matcher)
        return (
            "predicate"
            if isinstance(matcher.bucket.instance.program, PredicateProgram)
            else "sandbox"
        )

    def update(self, key: Hashable, params: Mapping[str, Any]) -> None:
        """Merge *params* into *key*'s params: the pattern moves in the index."""
        m = self._matchers.get(key)
        if m is None:
            raise UsageError(f"no pattern {key!r} to update")
        bucket = m.bucket
        self._unplace(key, m)
        bucket.params = {**bucket.params, **params}
        bucket.instance.program.prepare(bucket)
        self._place(key, m)

    def remove(self, key: Hashable) -> None:
        """Remove *key* (no-op if absent)."""
        m = self._matchers.pop(key, None)
        if m is not None:
            self._unplace(key, m)
            del self._order[key]
            self.stopped.pop(key, None)

    def match(self, event: Event) -> list[Hashable]:
        """The keys whose pattern accepts *event*, in the order they were added."""
        self._stamp += 1
        buckets, stops = self._index.match(event, self._stamp)
        keys = [self._keys[b] for b in buckets]
        for b, stop in stops:
            key = self._keys[b]
            self._engine.sandbox.budget.violation = None
            self.stopped[key] = stop.message
            self._unplace(key, self._matchers[key])
        for key, m in self._scan.items():
            if m(event):
                keys.append(key)
            elif m.stopped is not None:
                self.stopped[key] = m.stopped
        if len(keys) > 1:
            keys.sort(key=self._order.__getitem__)
        return keys

    def __len__(self) -> int:
        return len(self._matchers)

    @property
    def candidates(self) -> int:
        """Indexed patterns offered for verification by `match` so far, in all: those the
        index could not rule out from the event's fields alone."""
        return self._index.candidates

    def __contains__(self, key: object) -> bool:
        return key in self._matchers

    def _place(self, key: Hashable, m: Matcher) -> None:
        bucket = m.bucket
        program = bucket.instance.program
        if isinstance(program, PredicateProgram):
            self._index.add(bucket, program.plan(bucket.params, self._index.posting))
            self._keys[bucket] = key
        else:
            self._scan[key] = m

    def _unplace(self, key: Hashable, m: Matcher) -> None:
        self._index.remove(m.bucket)
        self._keys.pop(m.bucket, None)
        self._scan.pop(key, None)
