"""The predicate tier's program, and its *plan*: how one params bucket is found in the index.

`PredicateProgram` has the interface of the kernels' programs (`kind`, `prepare`, `run`,
`mentions`) so shared instances, buckets, `matcher()` and quench dry runs work unchanged; its
`run` evaluates the grammar's closures (no pattern code, no RestrictedPython compile).

`plan(params)` resolves the pattern's atoms for one bucket: a bare name that is one of the
bucket's params becomes a constant, `type`/`meta["k"]` become event fields, and each
conjunction gets its *access*: the most selective indexable atom (equality, `in` over
constants, prefix, range, presence; see `index/`) plus the checks left to verify. A
comparison of two constants (a param against a literal) is decided right there: true drops
the atom, false drops the conjunction.

Names. `type`, `meta`, `event`, `params` and the subscriber's params mean what they say
whatever values an event carries (a publisher cannot change a subscriber's `limit` by
sending a value named `limit`; `event["limit"]` reads such a value). A builtin's name
(`len`, `max`) is the event's value when the event has one of that name, as in Python: the
plan lists such names in `shadow`, and the index evaluates the whole pattern for events that
carry one of them, so that case stays exact.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aa.mesh import Event

from ..sandbox import SandboxStop
from .fastpath import parse_conjunction
from .flatplan import flat_plan
from .grammar import OPS, Atom, Grammar, parse_predicate
from .plans import (
    CLOSURE,
    EQ,
    FLIP,
    INTERVAL,
    MAX_BOUNDS_PAIRED,
    META,
    PARAM,
    PREFIX,
    PRESENT,
    RANGE,
    RANK,
    SUFFIX,
    TYPE,
    VALUE,
    Access,
    Check,
    Conj,
    Plan,
    bounded,
    hashable,
    intern_names,
)
from .shapes import Ref

if TYPE_CHECKING:
    from ..index import Bucket
    from ..sandbox import Sandbox

__all__ = [
    "PredicateProgram",
    "Plan",
    "Conj",
    "Access",
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
]


class _NeedClosures(Exception):
    """A plan needs an atom's closure: parse again with closures."""


_DEAD = object()
_PASS_THROUGH = (KeyboardInterrupt, SystemExit)


def _NO_CALLS() -> frozenset[str]:  # the grammar calls no bare name but its builtins
    return frozenset()


class PredicateProgram:
    """A `python`/`expr` pattern inside the predicate grammar."""

    kind = "expr"
    tier = "predicate"
    __slots__ = ("sandbox", "source", "builtins", "arithmetic", "_grammar", "_fn", "_mentions")

    def __init__(self, sandbox: Sandbox, source: str, grammar: Grammar | None) -> None:
        """*grammar*: the source parsed; None when it was planned without
        (`flatplan.plan_spaced`)."""
        self.sandbox = sandbox
        self.source = source
        self.builtins: Mapping[str, Any] = sandbox.expr_builtins
        self.arithmetic = grammar is not None and grammar.arithmetic
        #: The atoms (without closures unless needed); None once planned for the only
        #: bucket a pattern without params can have (parsed again if ever needed).
        self._grammar: Grammar | None = (
            grammar if grammar is not None and grammar.fn is None else None
        )
        self._fn = None if grammar is None else grammar.fn
        self._mentions: frozenset[str] | None = None

    def _parse(self, closures: bool) -> Grammar:
        g = None if closures else parse_conjunction(self.source)
        g = g or parse_predicate(self.source, self.builtins, self.sandbox.guards, closures)
        assert g is not None  # it parsed before
        return g

    @property
    def mentions(self) -> frozenset[str]:
        """Names, method names and string constants in the source (quenching)."""
        if self._mentions is None:
            self._mentions = self._parse(False).mentions
        return self._mentions

    def prepare(self, bucket: Bucket) -> None:
        bucket.context = True  # closures take the params at run time: nothing to build

    def run(self, bucket: Bucket, event: Event) -> bool:
        fn = self._fn
        if fn is None:
            fn = self._fn = self._parse(True).fn
            assert fn is not None
        if self.arithmetic:
            self.sandbox.budget.allocated = 0
        try:
            return bool(fn(event.values, event, bucket.params))
        except SandboxStop:
            raise
        except _PASS_THROUGH:
            raise
        except BaseException as exc:
            self.sandbox.errors.failed(
                bucket, exc, self.source, _NO_CALLS, expression=True, streak=False
            )
            return False

    @staticmethod
    def shared_run(bucket: Bucket, event: Event) -> bool:
        """`run` for `Bucket.run`, one function for every instance (see `Instance.run`)."""
        program: PredicateProgram = bucket.instance.program  # type: ignore[assignment]  # per event: no cast call
        return program.run(bucket, event)

    # -- plans -----------------------------------------------------------------------------

    def plan(self, params: Mapping[str, Any], posting: Any) -> Plan:
        """Where a bucket with *params* goes. *posting(kind, src, keys)* tells how many
        entries an access would share its posting list with (the selectivity estimate)."""
        g = self._grammar or self._parse(False)
        try:
            plan = (
                flat_plan(g.dnf[0], params, self.builtins, posting) if g.exact else None
            ) or self._plan(g, params, posting)
        except _NeedClosures:
            g = self._parse(True)
            plan = self._plan(g, params, posting)
        self._grammar = g if params else None
        return plan

    def _plan(self, g: Grammar, params: Mapping[str, Any], posting: Any) -> Plan:
        shadow: set[str] = set()
        conjs: list[Conj] = []
        scan = False
        for conj in g.dnf:
            checks: list[tuple[Check, list[Access]]] = []
            dead = False
            for atom in conj:
                got = self._resolve_atom(atom, params, shadow)
                if got is _DEAD:
                    dead = True
                    break
                if got is not None:
                    checks.append(got)
            if dead:
                continue
            options: list[tuple[Access, tuple[int, ...]]] = [
                (acc, (i,)) for i, (_, accesses) in enumerate(checks) for acc in accesses
            ]
            ranges = [o for o in options if o[0].kind == RANGE]
            if len(ranges) > 1:
                options += _intervals(ranges)
            if not options:
                scan = True
                conjs.append(Conj(None, tuple(x for c, _ in checks for x in c)))
                continue
            top = min(RANK[o[0].kind] for o in options)
            options = [o for o in options if RANK[o[0].kind] == top]
            access, covered = (
                options[0]
                if len(options) == 1
                else min(options, key=lambda o: (posting(o[0].kind, o[0].src, o[0].keys), o[1]))
            )
            rest = tuple(
                x
                for j, (c, _) in enumerate(checks)
                if not (j in covered and access.exact)
                for x in c
            )
            conjs.append(Conj(access, rest))
        return Plan(conjs, g.exact, intern_names(shadow), scan)

    def _resolve_atom(self, atom: Atom, params: Mapping[str, Any], shadow: set[str]) -> Any:
        """(check, accesses) for *atom* in this bucket; None if it always holds; _DEAD if it
        never does."""
        op, neg = atom.op, atom.negated
        left = self._resolve(atom.left, params, shadow)
        right = (
            self._resolve(atom.right, params, shadow)
            if op not in ("truthy", "other")
            else ("const", None)
        )
        lk, rk = left[0], right[0]
        if op == "other" or lk == "other" or rk == "other" or (lk == "src" and rk == "src"):
            return self._closure(atom, params, shadow)
        if rk == "ctx":  # `"X" in event`, `"k" in meta`, `"k" in params`
            if lk != "const" or not isinstance(left[1], str):
                return self._closure(atom, params, shadow)
            if right[1] == "params":
                return self._fold(atom, left[1], params)
            if neg or op != "in":
                return self._closure(atom, params, shadow)
            field: tuple[int, Any] = (VALUE, left[1]) if right[1] == "event" else (META, left[1])
            return (field[0], field[1], _true, None), self._presence(field, exact=True)
        if lk == "const" and (rk == "const" or op == "truthy"):
            return self._fold(atom, left[1], right[1])
        fn: Any
        src: Any
        if op == "truthy":
            fn = _falsy if neg else _truthy
            return (left[1][0], left[1][1], fn, None), self._presence(left[1], exact=False)
        reversed_in = False
        if lk == "src":
            src, c = left[1], right[1]
            fn = _METHOD_FNS[op] if op in _METHOD_FNS else OPS[op]
        else:  # constant on the left, event field on the right
            if op in ("startswith", "endswith"):
                return self._closure(atom, params, shadow)
            src, c = right[1], left[1]
            reversed_in = op in _REVERSED
            op = FLIP.get(op, op)
            fn = _REVERSED.get(op) or OPS[op]
        accesses = [] if neg or reversed_in else _accesses(op, src, c)
        if neg:
            fn = _negated(fn)
        return (src[0], src[1], fn, c), accesses + self._presence(src, exact=False)

    def _resolve(self, ref: Ref, params: Mapping[str, Any], shadow: set[str]) -> tuple[str, Any]:
        kind, x = ref
        if kind == "const":
            return ("const", x)
        if kind == "name":
            if x in params:  # a param is the subscriber's: no event value changes it
                return ("const", params[x])
            if x in self.builtins:
                shadow.add(x)  # an event value of that name would be read instead
                return ("other", None)
            return ("src", (VALUE, x))
        if kind == "type":
            return ("src", (TYPE, None))
        if kind == "meta":
            return ("src", (META, x))
        if kind == "event":
            return ("src", (VALUE, x))
        if kind == "params":
            return ("const", params[x]) if x in params else ("other", None)
        if kind == "ctx":
            return ("ctx", x)
        if kind == "consts":
            make, refs = x
            items = [self._resolve(r, params, shadow) for r in refs]
            if all(i[0] == "const" for i in items):
                try:
                    return (
                        "const",
                        {"Tuple": tuple, "List": list, "Set": set}[make](i[1] for i in items),
                    )
                except TypeError:  # a set of unhashable params: an error every time
                    return ("other", None)
        return ("other", None)

    def _closure(
        self, atom: Atom, params: Mapping[str, Any], shadow: set[str]
    ) -> tuple[Check, list[Access]]:
        # A closure resolves names itself, exactly: only the accesses derived here rely on
        # the resolution (a read name that is no param or builtin must be in the event).
        if atom.fn is None:
            raise _NeedClosures
        values = [n for n in atom.reads if n not in params and n not in self.builtins]
        return (CLOSURE, None, atom.fn, None), [
            a for n in sorted(values) for a in self._presence((VALUE, n), exact=False)
        ]

    def _fold(self, atom: Atom, left: Any, right: Any) -> Any:
        """An atom of constants: decided now (params can shadow: see the module docstring)."""
        try:
            if atom.op == "truthy":
                value = bool(left)
            elif atom.op in _METHOD_FNS:
                value = bool(_METHOD_FNS[atom.op](left, right))
            else:
                value = bool(OPS[atom.op](left, right))
        except Exception:
            return _DEAD
        return None if value != atom.negated else _DEAD

    @staticmethod
    def _presence(src: tuple[int, Any], exact: bool) -> list[Access]:
        return [] if src[0] == TYPE else [Access(PRESENT, src, (), exact)]


def _accesses(op: str, src: tuple[int, Any], c: Any) -> list[Access]:
    if op == "==" or op == "is" and c is None:
        return [Access(EQ, src, (c,), True)] if hashable(c) else []
    if op == "in" and type(c) in (tuple, list, set, frozenset):
        keys = tuple(dict.fromkeys(c)) if all(hashable(k) for k in c) else None
        return [Access(EQ, src, keys, True)] if keys is not None and len(keys) <= 64 else []
    if op in ("<", "<=", ">", ">="):
        if (
            isinstance(c, str)
            or isinstance(c, (int, float))
            and not (isinstance(c, float) and math.isnan(c))
        ):
            return [Access(RANGE, src, (op, c), True)]
        return []
    if op in ("startswith", "endswith"):
        keys = (
            (c,)
            if isinstance(c, str)
            else c
            if type(c) is tuple and all(isinstance(k, str) for k in c)
            else None
        )
        if keys and type(keys[0]) is str and all(type(k) is str for k in keys):
            return [
                Access(
                    PREFIX if op == "startswith" else SUFFIX, src, tuple(dict.fromkeys(keys)), True
                )
            ]
    return []


def _intervals(
    options: list[tuple[Access, tuple[int, ...]]],
) -> list[tuple[Access, tuple[int, ...]]]:
    """A lower and an upper numeric bound on one field, as one INTERVAL access."""
    lows = [
        (a, i) for a, i in options if a.kind == RANGE and a.keys[0][0] == ">" and bounded(a.keys[1])
    ][:MAX_BOUNDS_PAIRED]
    highs = [
        (a, i) for a, i in options if a.kind == RANGE and a.keys[0][0] == "<" and bounded(a.keys[1])
    ][:MAX_BOUNDS_PAIRED]
    out = []
    for lo, i in lows:
        for hi, j in highs:
            if lo.src == hi.src and hi.keys[1] >= lo.keys[1]:
                out.append((Access(INTERVAL, lo.src, lo.keys + hi.keys, True), i + j))
    return out


def _truthy(v: Any, c: Any) -> Any:
    return v


def _falsy(v: Any, c: Any) -> bool:
    return not v


def _true(v: Any, c: Any) -> bool:
    return True


def _negated(fn: Any) -> Any:
    return lambda v, c: not fn(v, c)


_METHOD_FNS = {
    "startswith": lambda v, c: v.startswith(c),
    "endswith": lambda v, c: v.endswith(c),
}
#: `c in X` and `c not in X` with the event field X as the first argument.
_REVERSED = {"in": operator.contains, "not in": lambda v, c: c not in v}
