"""Which client-cache patterns accept an event, without evaluating each (pure: no I/O).

Every dispatched event is offered to the client caches, and evaluating each distinct pattern
costs about half a microsecond: ten distinct patterns would take half a router's budget at
50,000 events/s. So the router's matchers (`PatternEngine.matcher`) of predicate-tier
patterns go into a `PatternSet`: the predicate index (equality and `in` by hash,
ranges and intervals by bisection, prefixes, presence; Fabret et al. 2001, BE-Tree), found
through each pattern's access predicate and verified on its other checks — ``Device ==
"phone-7"``, ``Temperature > 30 and Room == "A"`` and ``10 <= Price < 20`` alike. Patterns
outside the predicate grammar are evaluated one by one.

A plain callable (no engine's matcher: tests, embedders) keeps the original special case: a
pattern that is one name compared for equality with one constant is a dictionary lookup,
every other one is called.

Same answers as evaluating: `==` between an event value and a constant holds exactly when a
dictionary lookup finds the constant (hash and `==`, so ``1``, ``1.0`` and ``True`` agree as
they do in the expression); an unhashable value (a list, a map) equals no constant; a missing
name is "no match" in both. Names an expression resolves elsewhere when the event lacks them
(builtins, ``type``, ``meta``, ``event``, ``params``) are never indexed.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Callable, Hashable
from typing import Any, Final

from aa.mesh import Event, PatternSpec

from ..patterns import Matcher, PatternSet
from .compact import shrunk

__all__ = ["CacheIndex", "equality_of"]

#: Names an expression pattern may resolve without the event: never indexed.
_NOT_VALUES: Final = frozenset(dir(builtins)) | {"type", "meta", "event", "params"}
_MISSING: Final = object()
#: A `PatternSet` holding at least this many patterns at its most is rebuilt when it holds
#: less than its most divided by `SET_REBUILD_FRACTION` (see `CacheIndex._set_shrunk`).
SET_REBUILD_MIN: Final = 1024
SET_REBUILD_FRACTION: Final = 8


def equality_of(spec: PatternSpec) -> tuple[str, Hashable] | None:
    """(name, constant) when *spec* is ``name == constant`` (either way round), else None."""
    if spec.kernel != "python" or spec.format != "expr":
        return None
    try:
        tree = ast.parse(spec.source.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return None
    node = tree.body
    if not (
        isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq)
    ):
        return None
    left, right = node.left, node.comparators[0]
    if isinstance(right, ast.Name) and isinstance(left, ast.Constant):
        left, right = right, left
    if not (isinstance(left, ast.Name) and isinstance(right, ast.Constant)):
        return None
    name, value = left.id, right.value
    if name in _NOT_VALUES or name.startswith("_") or value is Ellipsis:
        return None
    try:
        hash(value)
    except TypeError:
        return None
    if isinstance(value, float) and value != value:
        return None
    return name, value


class CacheIndex:
    """The distinct patterns of the client caches: equality ones in tables, the rest listed."""

    __slots__ = ("_tables", "_general", "_where", "_set", "_set_peak")

    def __init__(self) -> None:
        self._tables: dict[str, dict[Hashable, list[Hashable]]] = {}  # name → constant → keys
        self._general: dict[Hashable, Callable[[Event], bool]] = {}  # key → matcher
        #: key → (name, constant) of an equality pattern, its `Matcher` when it is in the
        #: `PatternSet`, None when it is evaluated.
        self._where: dict[Hashable, tuple[str, Hashable] | Matcher | None] = {}
        #: The predicate-tier matchers, indexed (made with the first one: it needs their engine).
        self._set: PatternSet | None = None
        self._set_peak = 0  # most patterns the set held since it was made

    def add(self, key: Hashable, spec: PatternSpec, matcher: Callable[[Event], bool]) -> None:
        """Index pattern *key* (once per key). *matcher* is placed in this index's own
        `PatternSet` when it is an engine's predicate-tier `Matcher` (so it must be in no other
        set); it keeps answering when called directly."""
        if key in self._where:
            return
        if isinstance(matcher, Matcher) and matcher.indexable and matcher.stopped is None:
            if self._set is None:
                self._set = PatternSet(matcher.engine)
            self._set.add_matcher(key, matcher)
            self._set_peak = max(self._set_peak, len(self._set))
            self._where[key] = matcher
            return
        eq = equality_of(spec)
        self._where[key] = eq
        if eq is None:
            self._general[key] = matcher
        else:
            name, value = eq
            self._tables.setdefault(name, {}).setdefault(value, []).append(key)

    def remove(self, key: Hashable) -> None:
        if key not in self._where:
            return
        eq = self._where.pop(key)
        self._where = shrunk(self._where)
        if isinstance(eq, Matcher):
            assert self._set is not None
            self._set.remove(key)
            self._set_shrunk()
            return
        if eq is None:
            del self._general[key]
            self._general = shrunk(self._general)
            return
        name, value = eq
        table = self._tables[name]
        keys = table[value]
        keys.remove(key)
        if not keys:
            del table[value]
            if not table:
                del self._tables[name]
            else:
                self._tables[name] = shrunk(table)

    def _set_shrunk(self) -> None:
        """Let the `PatternSet` go when it is empty, or place what it holds in a new one when
        it kept a small part of what it held at most: its tables and the predicate index's
        were sized for that most and never shrink."""
        s = self._set
        assert s is not None
        if not s:
            self._set, self._set_peak = None, 0
            return
        if s.stopped or self._set_peak < SET_REBUILD_MIN:
            return
        if len(s) * SET_REBUILD_FRACTION > self._set_peak:
            return
        fresh: PatternSet | None = None
        for key, m in self._where.items():  # in the order they were added: `match`'s order
            if isinstance(m, Matcher):
                if fresh is None:
                    fresh = PatternSet(m.engine)
                fresh.add_matcher(key, m)
        self._set, self._set_peak = fresh, 0 if fresh is None else len(fresh)

    def match(self, event: Event) -> list[Hashable]:
        """Keys of the patterns that accept *event*. A matcher that raises is "no"."""
        out: list[Hashable] = self._set.match(event) if self._set else []
        values = event.values
        for name, table in self._tables.items():
            v: Any = values.get(name, _MISSING)
            if v is _MISSING:
                continue
            try:
                keys = table.get(v)
            except TypeError:  # unhashable: equal to no constant
                continue
            if keys:
                out.extend(keys)
        for key, matcher in self._general.items():
            try:
                if matcher(event):
                    out.append(key)
            except Exception:
                continue
        return out

    def __len__(self) -> int:
        return len(self._where)
