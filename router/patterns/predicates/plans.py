"""What a plan is made of: where a check reads its operand, the kinds of access to the
index, `Access`, `Conj` and `Plan` (one params bucket's place in the index), and the small
helpers both planners use — the general one (`predicates.PredicateProgram`) and the flat one
(`flatplan`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Access",
    "Conj",
    "Plan",
    "Check",
    "VALUE",
    "TYPE",
    "META",
    "CLOSURE",
    "PARAM",
    "EQ",
    "INTERVAL",
    "PREFIX",
    "SUFFIX",
    "RANGE",
    "PRESENT",
    "MAX_INTERVAL_BOUND",
    "MAX_BOUNDS_PAIRED",
    "RANK",
    "FLIP",
    "NO_NAMES",
    "intern_names",
    "bounded",
    "hashable",
]

#: Where a flat check reads its operand: an event value, the event type, a meta field; or
#: CLOSURE: the check is `fn(values, event, params)` itself.
VALUE, TYPE, META, CLOSURE = 0, 1, 2, 3
#: A flat check of an event value against the bucket's param named in the constant's slot,
#: read when verifying: a parametric update of a param the access does not use then changes
#: nothing in the index (`Plan.pinned`).
PARAM = 4
#: A check: (where, key, fn, constant). Flat: `fn(operand, constant)` must be true.
Check = tuple[int, Any, Any, Any]
#: Access kinds, best first (for equal kinds, the shorter posting list wins).
EQ, INTERVAL, PREFIX, SUFFIX, RANGE, PRESENT = (
    "eq",
    "interval",
    "prefix",
    "suffix",
    "range",
    "present",
)
RANK = {EQ: 0, INTERVAL: 1, PREFIX: 2, SUFFIX: 3, RANGE: 4, PRESENT: 5}
#: Interval bounds are indexed only below this magnitude, where ints are exact as floats
#: (the interval index probes `v - 2 * width` in floating point).
MAX_INTERVAL_BOUND = 2**52
#: Lower and upper bounds considered for pairing into intervals, per conjunction: pairing is
#: quadratic, and a conjunction of hundreds of bounds is an attack, not a subscription.
MAX_BOUNDS_PAIRED = 8

#: A comparison with its sides swapped (`3 < x` is `x > 3`).
FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}


class Access:
    """How a conjunction is found: `kind` on field `src` ((VALUE, name), (TYPE, None) or
    (META, key)) with `keys` (eq: constants; prefix/suffix: strings; range: (op, bound);
    interval: (op, lo, op, hi); present: ()). `exact`: a hit means the atom holds.
    (A plain slotted class: one is built per atom per subscribe.)"""

    __slots__ = ("kind", "src", "keys", "exact")

    def __init__(self, kind: str, src: tuple[int, Any], keys: tuple[Any, ...], exact: bool) -> None:
        self.kind = kind
        self.src = src
        self.keys = keys
        self.exact = exact

    def __repr__(self) -> str:
        return f"Access({self.kind!r}, {self.src!r}, {self.keys!r}, exact={self.exact})"


@dataclass(slots=True)
class Conj:
    access: Access | None  # None: no indexable atom (the bucket is scanned)
    #: Exact plans: the checks left after the access, flat (where, key, fn, constant, ...).
    rest: tuple[Any, ...]


@dataclass(slots=True)
class Plan:
    """One bucket's place in the index."""

    conjs: list[Conj]
    #: True: a conjunction's checks decide the match; False: evaluate the whole pattern.
    exact: bool
    shadow: frozenset[str]
    #: The bucket is a candidate for every event (some conjunction has no access).
    scan: bool
    #: The params the accesses read (an update of any other param needs no new plan: its
    #: checks read it when verifying); None: every update plans again.
    pinned: frozenset[str] | None = None


NO_NAMES: frozenset[str] = frozenset()
_SHADOWS: dict[frozenset[str], frozenset[str]] = {}
#: Distinct shadow sets kept for sharing; past this, new ones are simply not shared.
_MAX_SHARED_SHADOWS = 10_000


def intern_names(names: set[str]) -> frozenset[str]:
    """One frozenset per distinct set of names (every bucket keeps its own otherwise)."""
    if not names:
        return NO_NAMES
    key = frozenset(names)
    got = _SHADOWS.get(key)
    if got is None:
        got = key
        if len(_SHADOWS) < _MAX_SHARED_SHADOWS:
            _SHADOWS[key] = key
    return got


def bounded(c: Any) -> bool:
    return (
        isinstance(c, (int, float))
        and not isinstance(c, str)
        and -MAX_INTERVAL_BOUND < c < MAX_INTERVAL_BOUND
    )


def hashable(c: Any) -> bool:
    try:
        hash(c)
    except TypeError:
        return False
    return not (isinstance(c, float) and math.isnan(c))
