"""The flat plan: where the common conjunction goes in the index, planned in one pass.

Most of what a million subscribers send is a conjunction of comparisons of event values with
constants or params: `a18 == 6 and 45 <= a2 <= 49`, `Symbol == sym and Price < limit`.

- `flat_plan` plans such a conjunction from its atoms as `PredicateProgram._plan` would (the
  same access, the same checks left), without the general planner's `Access`
  per atom and its resolution of every reference: subscribes and parametric updates.
- `plan_spaced` goes one step further for a subscribe without params whose source is
  single-spaced names, operators and integers (the BE-Tree workload of the benchmark): it reads
  the tokens and plans in the same pass, building no `Atom` and no `Grammar` — the pattern's
  program is built without them and parses its source again only if it ever needs to (a
  second bucket, its closures, quenching's mentions). It answers what
  `fastpath.parse_conjunction` then `flat_plan` answer, or None where either would.

Both return None for anything else (two names, a builtin, two constants, `!=` only, ...),
which then takes the general path; the property tests compare each with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .fastpath import COMPARE_OPS, CONSTANT_WORDS, MAX_FAST_SOURCE, NOT_OPERANDS
from .grammar import OPS, Atom
from .plans import (
    EQ,
    FLIP,
    INTERVAL,
    MAX_BOUNDS_PAIRED,
    NO_NAMES,
    PARAM,
    RANGE,
    VALUE,
    Access,
    Check,
    Conj,
    Plan,
    bounded,
    hashable,
    intern_names,
)

__all__ = ["flat_plan", "plan_spaced"]

#: A candidate access, its Access not built yet: (kind, src, keys, the atoms it covers).
Option = tuple[str, Any, Any, tuple[int, ...]]

_SRCS: dict[str, tuple[int, str]] = {}
#: Distinct event names whose (VALUE, name) field reference is shared; past this, not shared.
_MAX_SHARED_SRCS = 100_000


def _src(name: str) -> tuple[int, str]:
    """One (VALUE, name) tuple per value name: a million checks then share a few dozen."""
    got = _SRCS.get(name)
    if got is None:
        got = (VALUE, name)
        if len(_SRCS) < _MAX_SHARED_SRCS:
            _SRCS[name] = got
    return got


def flat_plan(
    atoms: list[Atom], params: Mapping[str, Any], builtins: Mapping[str, Any], posting: Any
) -> Plan | None:
    """The plan of `_plan` for *atoms*, each a comparison of an event value with a constant
    or a param, one side each, at least one of them indexable (checks that compare with a
    param read it when verifying: `PARAM`); None for anything else."""
    reads_params = False
    pnames: list[str | None] = []
    checks: list[Check] = []
    eqs: list[Option] = []
    ranges: list[Option] = []
    for i, atom in enumerate(atoms):
        op = atom.op
        if atom.negated or op not in COMPARE_OPS:
            return None
        (lk, lx), (rk, rx) = atom.left, atom.right
        if lk == "name" and lx not in params:  # the event's value on the left
            name, other, x = lx, rk, rx
        elif rk == "name" and rx not in params:  # on the right
            name, other, x, op = rx, lk, lx, FLIP.get(op, op)
        else:
            return None  # two constants (folded by `_plan`) or something else
        if name in builtins:
            return None
        if other == "const":
            c, pname = x, None
        elif other == "name" and x in params:
            reads_params = True
            c, pname = params[x], x
        else:
            return None  # two event values, or something else
        src = _src(name)
        name = src[1]  # the shared string: a million checks keep one per distinct name
        checks.append((VALUE, name, OPS[op], c) if pname is None else (PARAM, name, OPS[op], pname))
        pnames.append(pname)
        if op == "==":
            if type(c) is int or type(c) is str or hashable(c):
                eqs.append((EQ, src, (c,), (i,)))
        elif op != "!=" and (isinstance(c, str) or isinstance(c, (int, float)) and c == c):
            ranges.append((RANGE, src, (op, c), (i,)))
    return _choose(checks, eqs, ranges, posting, pnames if reads_params else None)


def plan_spaced(source: str, builtins: Mapping[str, Any], posting: Any) -> Plan | None:
    """The plan of a params-free subscribe of *source*, read and planned in one pass: what
    `flat_plan(parse_conjunction(source).dnf[0], {}, builtins, posting)` gives for a
    source of single-spaced names, operators and decimal integers (`fastpath._parse_spaced`'s
    reading), else None."""
    if len(source) > MAX_FAST_SOURCE or not source or source[0].isspace():
        return None
    checks: list[Check] = []
    eqs: list[Option] = []
    ranges: list[Option] = []
    left: Any = None  # the operand before the pending operator: a name, or a constant
    left_named = False
    x: Any  # the operand just read
    op: str | None = None
    chained = False
    want_operand = True
    for tok in source.split(" "):
        if tok in COMPARE_OPS:
            if want_operand:
                return None
            op, chained, want_operand = tok, True, True
            continue
        if not tok.isascii():
            return None
        if tok.isidentifier():
            if tok[0] == "_":
                return None
            if not want_operand:
                if tok == "and" and chained:
                    chained, want_operand = False, True
                    continue
                return None
            if tok in CONSTANT_WORDS:
                named, x = False, CONSTANT_WORDS[tok]
            elif tok in NOT_OPERANDS or tok in builtins:
                return None
            else:
                named, x = True, tok
        else:
            digits = tok[1:] if tok[:1] == "-" else tok
            if not digits.isdigit() or digits[0] == "0" and digits != "0" or not want_operand:
                return None
            named, x = False, int(tok)
        if op is not None:  # a comparison of `left` and `x`
            if named == left_named:
                return None  # two names, or two constants
            if named:
                name, c, op = x, left, FLIP.get(op, op)
            else:
                name, c = left, x
            src = _src(name)
            # c is an int, a bool or None: an equality's key always; a bound unless None
            if op == "==":
                eqs.append((EQ, src, (c,), (len(checks),)))
            elif op != "!=" and c is not None:
                ranges.append((RANGE, src, (op, c), (len(checks),)))
            checks.append((VALUE, src[1], OPS[op], c))  # the shared name: not this source's copy
        left, left_named, op, want_operand = x, named, None, False
    if want_operand or not chained:
        return None
    return _choose(checks, eqs, ranges, posting, None)


def _choose(
    checks: list[Check],
    eqs: list[Option],
    ranges: list[Option],
    posting: Any,
    pnames: list[str | None] | None,
) -> Plan | None:
    """The best kind (EQ, else INTERVAL, else RANGE), then the shortest posting, then the
    first atoms: `_plan`'s choice, with an Access built for the chosen one only. *pnames*:
    the param each check reads (None: no check reads one)."""
    if eqs:
        options = eqs
    elif not ranges:
        return None
    else:
        options = _intervals(ranges) or ranges
    kind, src, keys, covered = options[0]
    if len(options) > 1:  # the shortest posting; the first of equals (options are in atom order)
        least = posting(kind, src, keys)
        for other in options[1:]:
            if not least:  # none shorter than empty
                break
            if (size := posting(other[0], other[1], other[2])) < least:
                kind, src, keys, covered = other
                least = size
    rest: list[Any] = []
    for j, check in enumerate(checks):
        if j not in covered:
            rest += check
    conjs = [Conj(Access(kind, src, keys, True), tuple(rest))]
    if pnames is None:  # no params read: nothing pinned
        return Plan(conjs, True, NO_NAMES, False, NO_NAMES)
    pinned = intern_names({n for j in covered if (n := pnames[j]) is not None})
    return Plan(conjs, True, NO_NAMES, False, pinned)


def _intervals(ranges: list[Option]) -> list[Option]:
    """`predicates._intervals` over range options (kind, src, (op, bound), covered)."""
    lows = [r for r in ranges if r[2][0][0] == ">" and bounded(r[2][1])][:MAX_BOUNDS_PAIRED]
    if not lows:
        return []
    highs = [r for r in ranges if r[2][0][0] == "<" and bounded(r[2][1])][:MAX_BOUNDS_PAIRED]
    return [
        (INTERVAL, lo[1], lo[2] + hi[2], lo[3] + hi[3])
        for lo in lows
        for hi in highs
        if lo[1] == hi[1] and hi[2][1] >= lo[2][1]
    ]
