"""The closed grammar of the predicate tier: Python expressions the router evaluates itself.

`parse_predicate(source, builtins)` returns a `Grammar` (closures over the event, plus the
atoms the index uses) or None when the source is outside the grammar; the engine then hands
it to the python kernel, whose answer is the same (see below) but which runs pattern code.

What is inside
--------------
- constants (int, float, str, bytes, True/False/None) and tuples, lists and sets of them;
- bare names (a param, else an event value, as in the python kernel), `type`, `meta["k"]`,
  `params["k"]`, `event["X"]`, and subscripts `X[0]`, `X["k"]` of any of these;
- comparisons `== != < <= > >=`, chained; `is`/`is not` None/True/False; `in`/`not in`
  (over constant collections, strings, lists; `"X" in event`, `"k" in meta` test presence);
- `and`, `or`, `not`; arithmetic `+ - * / // % **` and unary `-`/`+`;
- `len(x)`, and the methods `startswith`, `endswith` (one argument), `lower()`, `upper()`.

Same answers as the python kernel
---------------------------------
Each closure is `fn(values, event, params)` and does what CPython does for that node, with the
same name resolution (`type`/`meta`/`event`/`params`, then the subscriber's params, then the
event's value, then the sandbox builtins: a publisher's values cannot change what a subscriber's
params or the language's names mean, `patterns/__init__.py`) and the same short-circuits, except
where only truth counts (the pattern and the operands of its `and`, `or`, `not`:
`_Compiler.test`): there an operand that raises is *unknown*, `and`/`or` go on past it (`_all`,
`_any`), `not` keeps it unknown, and a pattern that ends unknown does not match, as in the
kernel (`python_kernel._decide`). `+ * ** %` go through the sandbox's own size guards (so an
oversized repetition stops the pattern in both tiers). The one difference: integers in
arithmetic stay under `MAX_PREDICATE_INT_BITS`; past that the kernel would compute (up to
`MAX_INT_BITS`), this tier answers "no match" — long division of huge integers is the one
operation here whose cost a subscriber could otherwise choose. Likewise a string or list built
by `+`/`*` stays under `MAX_PREDICATE_SEQUENCE` (checked before it is built); `+`/`*`/`%` with a
literal string or collection operand (`"a" * 9999`, `[x] * n`) are outside the grammar (the
worker tier runs them, under its deadline); at most `MAX_PREDICATE_CALLS` calls. With these, one
evaluation costs at most (nodes × the event's size): no source can make this tier, which has no
deadline, slow (an attacker's `["aa"]*999999 in [...]` once froze a router for hours).

Atoms
-----
The index needs the pattern as conditions on event fields. `Grammar.exact` is True when the
pattern is a conjunction (`and`, chains split) of *atoms*; then "every atom true" is exactly
"match", atom by atom. Otherwise `Grammar.dnf` is a disjunction of conjunctions of atoms that
is *implied* by a match (an over-approximation: `not` pushed through `and`/`or`, negated
atoms kept only for the names they read, factors dropped past `MAX_DNF_TERMS`), and a
candidate found through it is verified by evaluating the whole pattern.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..sandbox import FORBIDDEN_NAMES, Guards
from .shapes import (
    _CONTEXT,
    MAX_DNF_TERMS,
    Ref,
    _and_leaves,
    _method_call,
    _product,
    _reads,
    _ref,
    _ref_names,
    _test_reads,
    _union,
)

__all__ = [
    "Atom",
    "Grammar",
    "Ref",
    "OPS",
    "parse_predicate",
    "MAX_PREDICATE_SOURCE",
    "MAX_PREDICATE_NODES",
    "MAX_DNF_TERMS",
    "MAX_PREDICATE_INT_BITS",
    "MAX_PREDICATE_SEQUENCE",
    "MAX_PREDICATE_CALLS",
]

#: Longest source (characters) considered for the predicate tier. Real predicates are a line;
#: a longer source goes to the python kernel, whose compilation is budgeted.
MAX_PREDICATE_SOURCE = 4096
#: Most AST nodes in a predicate: bounds compile time and the depth of the closures.
MAX_PREDICATE_NODES = 600
#: Deepest nesting of a predicate's AST (the compiler and the closures recurse).
MAX_PREDICATE_DEPTH = 40
#: Largest integer (bits) arithmetic may produce in this tier. Division of two 4,096-bit
#: integers takes microseconds; 65,536-bit ones (the kernel's cap) take milliseconds.
MAX_PREDICATE_INT_BITS = 4096
#: Longest string, bytes, list or tuple arithmetic (`+`, `*`) may produce in this tier. This
#: tier runs in the router with no deadline, so every operation's cost must be bounded by the
#: source and the event: a repetition is checked *before* it is built, and past this length
#: the answer is "no match" (the kernel would build up to `max_sequence`, 1,000,000). Comparing
#: or searching a 4,096-element result costs microseconds; a million-element one, milliseconds
#: per event, times every element of an `in`.
MAX_PREDICATE_SEQUENCE = 4096
#: Most calls of `len`/`startswith`/`endswith`/`lower`/`upper` in one predicate: each is
#: linear in its argument, which an event may make large, so this bounds the amplification.
MAX_PREDICATE_CALLS = 16

Fn = Callable[[Mapping[str, Any], Any, Mapping[str, Any]], Any]
_MISSING: Any = object()
_CMP = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Is: "is",
    ast.IsNot: "is not",
}
OPS: dict[str, Callable[[Any, Any], Any]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "is": operator.is_,
    "is not": operator.is_not,
    "in": lambda a, b: a in b,
    "not in": lambda a, b: a not in b,
}
_METHODS = {"startswith": 1, "endswith": 1, "lower": 0, "upper": 0}
_SCALARS = (int, float, str, bytes, bool, type(None))


class _Outside(Exception):
    """The source is outside the grammar (internal: parse_predicate returns None)."""


class _TooBig(ArithmeticError):
    """An integer past MAX_PREDICATE_INT_BITS: no match."""


@dataclass(slots=True)
class Atom:
    """One condition of a conjunction.

    `op` is a comparison operator, "startswith"/"endswith", "truthy" or "other"; `left` and
    `right` are `Ref`s (right is ("const", None) for "truthy"/"other"); `negated` flips it.
    `fn` evaluates the atom exactly; `reads` are the bare names it necessarily reads.
    """

    op: str
    left: Ref
    right: Ref
    negated: bool
    fn: Fn | None
    reads: frozenset[str]


@dataclass(slots=True)
class Grammar:
    """A source inside the grammar."""

    fn: Fn | None
    exact: bool
    #: exact: one conjunction, the pattern itself; else an over-approximation (may be [[]]).
    dnf: list[list[Atom]]
    #: Bare names read (event values or params), for warnings and quenching.
    names: frozenset[str]
    mentions: frozenset[str]
    arithmetic: bool = False


def parse_predicate(
    source: str, builtins: Mapping[str, Any], guards: Guards, closures: bool = True
) -> Grammar | None:
    """The predicate form of *source*, or None if it is outside the grammar (or invalid).

    Without *closures*, `fn` and the atoms' `fn` are None: that is all the index needs for
    a pattern whose atoms are all flat checks, and closures cost memory (the program builds
    them when first needed)."""
    if len(source) > MAX_PREDICATE_SOURCE:
        return None
    try:
        tree = ast.parse(source, "<pattern>", "eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None  # the python kernel reports it
    try:
        return _Compiler(builtins, guards, closures).grammar(tree.body)
    except (_Outside, RecursionError):
        return None


class _Compiler:
    def __init__(self, builtins: Mapping[str, Any], guards: Guards, closures: bool) -> None:
        self.closures = closures
        self.builtins = builtins
        self.guards = guards
        self.nodes = 0
        self.names: set[str] = set()
        self.mentions: set[str] = set()
        self.arithmetic = False
        self.calls = 0

    def grammar(self, body: ast.expr) -> Grammar:
        fn: Any = self.test(body, 0) if self.closures else None
        leaves = _and_leaves(body)
        if leaves is not None:
            dnf = [[a for leaf in leaves for a in self.atoms(leaf)]]
        else:
            dnf = self.dnf(body, False)
        return Grammar(
            fn,
            leaves is not None,
            dnf,
            frozenset(self.names),
            frozenset(self.mentions),
            self.arithmetic,
        )

    # -- closures --------------------------------------------------------------------------

    def test(self, node: ast.expr, depth: int) -> Fn:
        """*node* where only its truth counts (the pattern, the operands of its `and`, `or`
        and `not`): a comparison that raises there is unknown (`_all`, `_any`)."""
        if isinstance(node, ast.BoolOp) or (
            isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)
        ):
            self.nodes += 1
            if self.nodes > MAX_PREDICATE_NODES or depth > MAX_PREDICATE_DEPTH:
                raise _Outside
            d = depth + 1
            if isinstance(node, ast.UnaryOp):
                f = self.test(node.operand, d)
                return lambda values, event, params: not f(values, event, params)
            parts = [self.test(v, d) for v in node.values]
            return _all(parts) if isinstance(node.op, ast.And) else _any(parts)
        return self.expr(node, depth)

    def expr(self, node: ast.expr, depth: int) -> Fn:
        self.nodes += 1
        if self.nodes > MAX_PREDICATE_NODES or depth > MAX_PREDICATE_DEPTH:
            raise _Outside
        d = depth + 1
        if isinstance(node, ast.Constant):
            c = _constant(node.value)
            self.mentions.add(c) if isinstance(c, str) else None
            return lambda values, event, params: c
        if isinstance(node, ast.Name):
            return self.name(node.id, bare=True)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = [self.expr(e, d) for e in node.elts]
            if any(isinstance(e, ast.Starred) for e in node.elts):
                raise _Outside
            make: Callable[[Any], Any] = {ast.Tuple: tuple, ast.List: list, ast.Set: set}[
                type(node)
            ]
            return lambda values, event, params: make([f(values, event, params) for f in items])
        if isinstance(node, ast.BoolOp):
            parts = [self.expr(v, d) for v in node.values]
            return _and(parts) if isinstance(node.op, ast.And) else _or(parts)
        if isinstance(node, ast.UnaryOp):
            return self.unary(node, d)
        if isinstance(node, ast.Compare):
            return self.compare(node, d)
        if isinstance(node, ast.BinOp):
            return self.binop(node, d)
        if isinstance(node, ast.Subscript):
            return self.subscript(node, d)
        if isinstance(node, ast.Call):
            return self.call(node, d)
        raise _Outside

    def name(self, name: str, bare: bool) -> Fn:
        if name.startswith("_") or name in FORBIDDEN_NAMES:
            raise _Outside  # refused by the kernel's policy, with its message
        if name in _CONTEXT:
            if bare and name != "type":
                raise _Outside  # meta/event/params only as `x[k]` or `k in x`
            return _context(name)
        self.names.add(name)
        self.mentions.add(name)
        builtins = self.builtins

        def resolve(values: Mapping[str, Any], event: Any, params: Mapping[str, Any]) -> Any:
            v = params.get(name, _MISSING) if params else _MISSING  # (most buckets have none)
            if v is _MISSING:
                v = values.get(name, _MISSING)
                if v is _MISSING:
                    return builtins[name]  # KeyError: NameError in the kernel, no match
            return v

        return resolve

    def unary(self, node: ast.UnaryOp, d: int) -> Fn:
        if (
            isinstance(node.op, ast.USub)
            and isinstance(node.operand, ast.Constant)
            and isinstance(node.operand.value, (int, float))
            and type(node.operand.value) is not bool
        ):
            c: Any = -node.operand.value
            return lambda values, event, params: c
        f = self.expr(node.operand, d)
        if isinstance(node.op, ast.Not):
            return lambda values, event, params: not f(values, event, params)
        if isinstance(node.op, ast.USub):
            return lambda values, event, params: -f(values, event, params)
        if isinstance(node.op, ast.UAdd):
            return lambda values, event, params: +f(values, event, params)
        raise _Outside  # ~ (bitwise)

    def compare(self, node: ast.Compare, d: int) -> Fn:
        ops = [OPS[_op(o)] for o in node.ops]
        for o, right in zip(node.ops, node.comparators):
            if isinstance(o, (ast.Is, ast.IsNot)) and not (
                isinstance(right, ast.Constant) and right.value in (None, True, False)
            ):
                raise _Outside  # identity is defined only against the singletons
        operands = [
            self.operand_of_in(n, d, i > 0 and isinstance(node.ops[i - 1], (ast.In, ast.NotIn)))
            for i, n in enumerate([node.left, *node.comparators])
        ]
        if len(ops) == 1:
            op, lf, rf = ops[0], operands[0], operands[1]
            return lambda values, event, params: op(
                lf(values, event, params), rf(values, event, params)
            )

        def chain(values: Mapping[str, Any], event: Any, params: Mapping[str, Any]) -> Any:
            left = operands[0](values, event, params)
            for op, f in zip(ops, operands[1:]):
                right = f(values, event, params)
                if not op(left, right):
                    return False
                left = right
            return True

        return chain

    def operand_of_in(self, node: ast.expr, d: int, in_right: bool) -> Fn:
        if in_right and isinstance(node, ast.Name) and node.id in ("meta", "event", "params"):
            return _context(node.id)
        return self.expr(node, d)

    def binop(self, node: ast.BinOp, d: int) -> Fn:
        g = self.guards
        ops: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
            ast.Add: _capped_add(g),
            ast.Sub: operator.sub,
            ast.Mult: _capped_mul(g),
            ast.Div: operator.truediv,
            ast.FloorDiv: operator.floordiv,
            ast.Mod: g.mod,
            ast.Pow: _capped_pow(g),
        }
        op = ops.get(type(node.op))
        if op is None:
            raise _Outside  # bit operations, @
        if isinstance(node.op, (ast.Add, ast.Mult, ast.Mod)) and (
            _literal_sequence(node.left) or _literal_sequence(node.right)
        ):
            raise _Outside  # building strings or lists from literals: the worker tier's job
        if isinstance(node.op, ast.Mod):
            op = _numbers_only(op)  # "%" formatting of an event's string: the worker tier's job
        self.arithmetic = True
        lf, rf = self.expr(node.left, d), self.expr(node.right, d)

        def arith(values: Mapping[str, Any], event: Any, params: Mapping[str, Any]) -> Any:
            r = op(lf(values, event, params), rf(values, event, params))
            if type(r) is int and r.bit_length() > MAX_PREDICATE_INT_BITS:
                raise _TooBig
            return r

        return arith

    def subscript(self, node: ast.Subscript, d: int) -> Fn:
        if isinstance(node.slice, ast.Slice):
            raise _Outside
        base = node.value
        obj = (
            _context(base.id)
            if isinstance(base, ast.Name) and base.id in ("meta", "event", "params")
            else self.expr(base, d)
        )
        key = self.expr(node.slice, d)
        return lambda values, event, params: obj(values, event, params)[key(values, event, params)]

    def call(self, node: ast.Call, d: int) -> Fn:
        if node.keywords:
            raise _Outside
        func = node.func
        self.calls += 1
        if self.calls > MAX_PREDICATE_CALLS:
            raise _Outside
        if isinstance(func, ast.Name) and func.id == "len" and len(node.args) == 1:
            f, arg = self.name("len", bare=True), self.expr(node.args[0], d)
            self.names.discard("len")
            return lambda values, event, params: f(values, event, params)(
                arg(values, event, params)
            )
        if isinstance(func, ast.Attribute) and _METHODS.get(func.attr) == len(node.args):
            method = func.attr
            self.mentions.add(method)
            obj = self.expr(func.value, d)
            args = [self.expr(a, d) for a in node.args]
            if not args:
                return lambda values, event, params: getattr(obj(values, event, params), method)()
            a0 = args[0]
            return lambda values, event, params: getattr(obj(values, event, params), method)(
                a0(values, event, params)
            )
        raise _Outside

    # -- atoms -----------------------------------------------------------------------------

    def atoms(self, node: ast.expr, negated: bool = False) -> list[Atom]:
        """The atoms of one leaf of a conjunction (a chain gives one atom per link)."""
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            inner = node.operand
            if (
                isinstance(inner, ast.Compare)
                and len(inner.ops) == 1
                or _method_call(inner)
                or _ref(inner)[0] != "other"
            ):
                return self.atoms(inner, not negated)
        if isinstance(node, ast.Compare) and (len(node.ops) == 1 or not negated):
            out = []
            operands = [node.left, *node.comparators]
            for i, o in enumerate(node.ops):
                left, right = operands[i], operands[i + 1]
                link = ast.Compare(left=left, ops=[o], comparators=[right])
                fn = self.compare(link, 0)
                lr, rr = _ref(left), _ref(right, _op(o) in ("in", "not in"))
                reads = (
                    _ref_names(lr, rr) if lr[0] != "other" and rr[0] != "other" else _reads(link)
                )
                out.append(Atom(_op(o), lr, rr, negated, self._keep(fn, negated), reads))
            return out
        fn = self.test(node, 0)
        call = _method_call(node)
        if call is not None and call[0] in ("startswith", "endswith"):
            return [
                Atom(
                    call[0],
                    _ref(call[1]),
                    _ref(call[2]),
                    negated,
                    self._keep(fn, negated),
                    _reads(node),
                )
            ]
        ref = _ref(node)
        if ref[0] != "other":
            return [
                Atom(
                    "truthy",
                    ref,
                    ("const", None),
                    negated,
                    self._keep(fn, negated),
                    _ref_names(ref),
                )
            ]
        return [
            Atom(
                "other",
                ("other", None),
                ("const", None),
                negated,
                self._keep(fn, negated),
                _test_reads(node),
            )
        ]

    def _keep(self, fn: Fn, negated: bool) -> Any:
        return _negate(fn, negated) if self.closures else None

    def dnf(self, node: ast.expr, negated: bool) -> list[list[Atom]]:
        """A disjunction of conjunctions implied by *node* being true (false if *negated*)."""
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return self.dnf(node.operand, not negated)
        if isinstance(node, ast.BoolOp):
            conjunctive = isinstance(node.op, ast.And) != negated
            parts = [self.dnf(v, negated) for v in node.values]
            return _product(parts) if conjunctive else _union(parts)
        if isinstance(node, ast.Compare) and len(node.ops) > 1 and negated:
            links = [
                ast.Compare(left=left, ops=[op], comparators=[right])
                for left, op, right in zip(
                    [node.left, *node.comparators], node.ops, node.comparators
                )
            ]
            return _union([self.dnf(link, True) for link in links])
        return [self.atoms(node, negated)]


# -- helpers -------------------------------------------------------------------------------


def _constant(value: Any) -> Any:
    if type(value) not in _SCALARS:
        raise _Outside  # complex, Ellipsis
    return value


def _context(name: str) -> Fn:
    """`type`, `meta`, `event` (as its values) or `params`, whatever values the event has."""
    if name == "type":
        return lambda values, event, params: event.type
    if name == "meta":
        return lambda values, event, params: event.meta
    if name == "event":
        return lambda values, event, params: values
    return lambda values, event, params: params


def _op(o: ast.cmpop) -> str:
    name = _CMP.get(type(o))
    if name is None:
        raise _Outside
    return name


def _and(parts: list[Fn]) -> Fn:
    def conj(values: Mapping[str, Any], event: Any, params: Mapping[str, Any]) -> Any:
        v = None
        for f in parts:
            v = f(values, event, params)
            if not v:
                return v
        return v

    return conj


def _or(parts: list[Fn]) -> Fn:
    def disj(values: Mapping[str, Any], event: Any, params: Mapping[str, Any]) -> Any:
        v = None
        for f in parts:
            v = f(values, event, params)
            if v:
                return v
        return v

    return disj


def _all(parts: list[Fn]) -> Fn:
    """`and` where only truth counts, in three values: false if one operand is false, else
    unknown (the first error raised again) if one raised, else the last value."""

    def conj(values: Mapping[str, Any], event: Any, params: Mapping[str, Any]) -> Any:
        v, err = None, None
        for f in parts:
            try:
                v = f(values, event, params)
            except MemoryError:
                raise
            except Exception as exc:  # unknown: a later false operand still decides
                err = err or exc
                continue
            if not v:
                return v
        if err is not None:
            raise err
        return v

    return conj


def _any(parts: list[Fn]) -> Fn:
    """`or` where only truth counts, in three values: true if one operand is true, else
    unknown (the first error raised again) if one raised, else the last value."""

    def disj(values: Mapping[str, Any], event: Any, params: Mapping[str, Any]) -> Any:
        v, err = None, None
        for f in parts:
            try:
                v = f(values, event, params)
            except MemoryError:
                raise
            except Exception as exc:  # unknown: a later true operand still decides
                err = err or exc
                continue
            if v:
                return v
        if err is not None:
            raise err
        return v

    return disj


def _negate(fn: Fn, negated: bool) -> Fn:
    return (lambda values, event, params: not fn(values, event, params)) if negated else fn


def _literal_sequence(node: ast.expr) -> bool:
    """A string/bytes literal or a collection display (whose size the source chooses)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (str, bytes))
    return isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.JoinedStr))


def _numbers_only(op: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def numeric(a: Any, b: Any) -> Any:
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
            raise _TooBig
        return op(a, b)

    return numeric


def _seq_len(x: Any) -> int:
    return len(x) if isinstance(x, (str, bytes, list, tuple)) else -1


def _sequence_cap(g: Guards, n: int) -> None:
    """Past the kernel's own cap the guards stop the pattern, as the kernel would (they refuse
    before building); between this tier's cap and the kernel's, "no match"."""
    if n > g.max_sequence:
        g.sized(n, "this repetition")
    if n > MAX_PREDICATE_SEQUENCE:
        raise _TooBig


def _capped_add(g: Guards) -> Callable[[Any, Any], Any]:
    def add(a: Any, b: Any) -> Any:
        la, lb = _seq_len(a), _seq_len(b)
        if la >= 0 and lb >= 0:
            _sequence_cap(g, la + lb)
        return g.add(a, b)

    return add


def _capped_mul(g: Guards) -> Callable[[Any, Any], Any]:
    def mul(a: Any, b: Any) -> Any:
        if type(a) is int and type(b) is int:
            if a.bit_length() + b.bit_length() > MAX_PREDICATE_INT_BITS + 1:
                raise _TooBig
        elif isinstance(b, int):
            _sequence_cap(g, _seq_len(a) * max(b, 0))  # checked before the repetition is built
        elif isinstance(a, int):
            _sequence_cap(g, _seq_len(b) * max(a, 0))
        return g.mul(a, b)

    return mul


def _capped_pow(g: Guards) -> Callable[[Any, Any], Any]:
    def pow_(a: Any, b: Any) -> Any:
        if (
            isinstance(a, int)
            and type(b) is int
            and b > 1
            and a not in (0, 1, -1)
            and a.bit_length() * b > MAX_PREDICATE_INT_BITS + 1
        ):
            raise _TooBig
        return g.pow(a, b)

    return pow_
