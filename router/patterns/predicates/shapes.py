"""Shapes of a pattern's AST that the predicate tier reads: the leaves of its top-level
`and`, operands as index references, the names an atom necessarily reads, and the bounded
products and unions that build the over-approximating DNF (see `grammar.py`)."""

from __future__ import annotations

import ast
from typing import Any

__all__ = ["MAX_DNF_TERMS", "Ref"]

#: Most conjunctions kept for the index per pattern. A disjunction of more terms leaves the
#: pattern on the scan list: normalising must never stall a subscribe.
MAX_DNF_TERMS = 64
#: An operand as the index sees it: ("name", X), ("type", None), ("meta", k), ("event", X),
#: ("params", k), ("const", c), ("consts", (kind, refs)), ("ctx", name) or ("other", None).
Ref = tuple[str, Any]
_CONTEXT = frozenset({"type", "meta", "event", "params"})


def _and_leaves(node: ast.expr) -> list[ast.expr] | None:
    """The leaves of a top-level `and` tree, or None if a leaf is an `or` (not exact)."""
    if isinstance(node, ast.BoolOp):
        if not isinstance(node.op, ast.And):
            return None
        out: list[ast.expr] = []
        for v in node.values:
            sub = _and_leaves(v)
            if sub is None:
                return None
            out.extend(sub)
        return out
    return [node]


def _method_call(node: ast.expr) -> tuple[str, ast.expr, ast.expr] | None:
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and len(node.args) == 1
        and node.func.attr in ("startswith", "endswith")
    ):
        return node.func.attr, node.func.value, node.args[0]
    return None


def _ref(node: ast.expr, in_right: bool = False) -> Ref:
    """*node* as an operand the index can resolve per bucket, or ("other", None)."""
    if isinstance(node, ast.Constant):
        return ("const", node.value)
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and isinstance(node.operand, ast.Constant)
        and isinstance(node.operand.value, (int, float))
        and type(node.operand.value) is not bool
    ):
        return ("const", -node.operand.value)
    if isinstance(node, ast.Name):
        if node.id in ("meta", "event", "params"):
            return ("ctx", node.id) if in_right else ("other", None)
        return ("type", None) if node.id == "type" else ("name", node.id)
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and isinstance(node.slice, ast.Constant)
    ):
        base, key = node.value.id, node.slice.value
        if base in ("meta", "event", "params") and isinstance(key, str):
            return (base, key)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        refs = [_ref(e) for e in node.elts]
        if all(r[0] in ("const", "name", "params") for r in refs):
            return ("consts", (type(node).__name__, tuple(refs)))
    return ("other", None)


def _ref_names(*refs: Ref) -> frozenset[str]:
    out = set()
    for kind, x in refs:
        if kind == "name":
            out.add(x)
        elif kind == "consts":
            out.update(r[1] for r in x[1] if r[0] == "name")
    return frozenset(out)


def _reads(node: ast.expr) -> frozenset[str]:
    """Bare names that are read whenever *node* evaluates to a true value: everything but
    the operands after the first of an `and`/`or`."""
    out: set[str] = set()
    stack: list[ast.AST] = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Name):
            if n.id not in _CONTEXT:
                out.add(n.id)
        elif isinstance(n, ast.BoolOp):
            stack.append(n.values[0])
        elif isinstance(n, ast.Call):
            stack.extend(n.args)
            if isinstance(n.func, ast.Attribute):
                stack.append(n.func.value)
        else:
            stack.extend(ast.iter_child_nodes(n))
    out.discard("len")
    return frozenset(out)


def _test_reads(node: ast.expr) -> frozenset[str]:
    """`_reads` of *node* where only its truth counts, its `and`/`or`/`not` in three values
    (`grammar._all`, `_any`): names read whenever it is true. An `and` reads its operands',
    an `or` those every operand reads; the `not` of an `and`/`or`, none for sure."""
    if isinstance(node, ast.BoolOp):
        parts = [_test_reads(v) for v in node.values]
        if isinstance(node.op, ast.And):
            return frozenset().union(*parts)
        return frozenset.intersection(*parts)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = node.operand
        if isinstance(inner, ast.BoolOp) or (
            isinstance(inner, ast.UnaryOp) and isinstance(inner.op, ast.Not)
        ):
            return frozenset()
    return _reads(node)


def _product(parts: list[list[list[Any]]]) -> list[list[Any]]:
    """AND of disjunctions; factors that would push past MAX_DNF_TERMS are dropped (the result
    stays implied by the pattern, only less precise)."""
    out: list[list[Any]] = [[]]
    for dis in sorted(parts, key=len):
        if len(out) * len(dis) > MAX_DNF_TERMS:
            continue
        out = [c + d for c in out for d in dis]
    return out


def _union(parts: list[list[list[Any]]]) -> list[list[Any]]:
    out = [c for dis in parts for c in dis]
    return out if len(out) <= MAX_DNF_TERMS else [[]]  # [[]]: implies nothing: scan list
