"""Which tier a pattern runs in: in the router (a closed grammar of comparisons that cannot
loop, allocate without bound or call into C for long) or in a worker (everything else).

This is the conservative stand-in until the predicate tier (`aa.router.patterns`'s
predicates) decides it: an expression stays in the router only if its syntax tree holds
nothing but names, constants, constant collections, comparisons, `and`/`or`/`not`, unary
minus, the arithmetic `+ - * / // %` (no `**`, no shifts: on the value model's 64-bit ints and
the source's own constants it stays small, and the sandbox's guards still size every
repetition and % formatting), and the calls `len(x)`, `x.startswith(c)`, `x.endswith(c)`, `x.lower()`,
`x.upper()`. Nothing there can take more than linear time in the event's own size, which
the frame cap bounds.
"""

from __future__ import annotations

import ast

from aa.mesh import PatternSpec

__all__ = ["runs_in_router"]

_NODES = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd,
    ast.Compare, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn,
    ast.Is, ast.IsNot, ast.Name, ast.Load, ast.Constant, ast.Tuple, ast.List, ast.Set,
    ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Call, ast.Attribute,
)  # fmt: skip
_ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod)
_METHODS = frozenset({"startswith", "endswith", "lower", "upper"})
#: Longer expressions go to a worker: parsing them is itself work.
_MAX_SOURCE = 2048


def runs_in_router(spec: PatternSpec) -> bool:
    """True if *spec* is a `python`/`expr` pattern inside the closed grammar."""
    if spec.kernel != "python" or spec.format != "expr" or len(spec.source) > _MAX_SOURCE:
        return False
    try:
        tree = ast.parse(spec.source, "<pattern>", "eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return True  # refused at subscribe by the router's own compile, with its reason
    for node in ast.walk(tree):
        if not isinstance(node, _NODES):
            return False
        if isinstance(node, ast.Call):
            f = node.func
            if node.keywords or len(node.args) > 1:
                return False
            if isinstance(f, ast.Name) and f.id == "len":
                continue
            if not (isinstance(f, ast.Attribute) and f.attr in _METHODS):
                return False
        elif isinstance(node, ast.Attribute) and node.attr not in _METHODS:
            return False
        elif isinstance(node, ast.BinOp) and not isinstance(node.op, _ARITHMETIC):
            return False
    return True
