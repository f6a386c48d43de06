"""Compiling Python patterns: RestrictedPython's checks plus the rewrites the sandbox relies on.

`RestrictingNodeTransformer` refuses names and attributes starting with `_`, the frame and
code attributes of `inspect`, `exec`/`eval`, `nonlocal`, async code and `try/except*`, and
rewrites iteration and unpacking through guards. On top of it, `_Policy`:

- **refuses at compile time** (code `pattern-refused`): imports outside the whitelist,
  `open`, `exec`, `globals`... (`calls.FORBIDDEN_NAMES`), class definitions, generators
  (`yield`: a generator left in `state` would run its `finally` at garbage collection, outside
  any budget), attribute assignment (stdlib classes are mutable: `Counter.most_common = f`
  would patch the router too), `getattr(x, "__class__")` with a literal private name,
  rebinding `state`; and in expressions `:=` (it would write into the event's own values)
  and mutating methods (`Readings.append(1)` would change the event for every subscriber);
- **inserts a tick** (`_tick_()`, see `budget.py`) at the top of every `for` and `while`
  body and as the first condition of every comprehension, and decorates every `def` and
  `lambda` with `_guard_function_` (a tick per call and a depth cap: recursion bombs);
- **routes every `except` clause** through `_exc_filter_`, so no clause can catch the
  sandbox's stop (a bare `except:` becomes `except Exception:`);
- **routes allocating operators** `+ * ** << %`, augmented assignments, f-string fields and
  the calls `str(x)`/`bytes(n)` through the size guards of `guards.py`;
- keeps attribute loads and subscripts native (no `_getattr_`/`_getitem_` calls) except for
  the few names in `calls.ROUTED_ATTRIBUTES`: this is what keeps a simple expression near
  the cost of plain `eval`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from types import CodeType
from typing import Any, ClassVar, cast

from RestrictedPython.compile import compile_restricted_eval, compile_restricted_exec
from RestrictedPython.transformer import (
    INSPECT_ATTRIBUTES,
    IOPERATOR_TO_STR,
    RestrictingNodeTransformer,
    copy_locations,
)

from aa.mesh import PatternError

from .calls import FORBIDDEN_NAMES, MUTATING_METHODS, ROUTED_ATTRIBUTES

__all__ = ["CompiledPython", "compile_python", "compile_tests", "Logic", "COMPILE_ERROR", "REFUSED"]

#: The pattern is not valid Python (or too deeply nested to compile).
COMPILE_ERROR = "pattern-compile"
#: The pattern is valid Python but breaks a sandbox rule.
REFUSED = "pattern-refused"

_BINOP_GUARDS: dict[type[ast.operator], str] = {
    ast.Add: "_add_",
    ast.Mult: "_mul_",
    ast.Pow: "_pow_",
    ast.LShift: "_lshift_",
    ast.Mod: "_mod_",
}
_LOOPS = (ast.For, ast.While, ast.comprehension, ast.Lambda, ast.FunctionDef)


@dataclass(frozen=True, slots=True)
class CompiledPython:
    """A compiled Python pattern."""

    code: CodeType
    #: Names the source reads (before rewriting): tells which views an evaluation must build.
    names: frozenset[str]
    #: Names, attribute names and string constants in the source: what it may be "about".
    mentions: frozenset[str]
    #: True if the code can loop or call its own functions, so evaluations must be timed.
    loops: bool


def _where(exc: SyntaxError) -> str:
    """Where a syntax error is, as a user counts: Python says column 0 for the end."""
    if not exc.lineno:
        return "in the source"
    return (
        f"line {exc.lineno}, col {exc.offset}" if exc.offset else f"line {exc.lineno}, at its end"
    )


def _is_script(source: str) -> bool:
    """Does *source*, refused as an expression, parse as statements (`import os`, `x = 1`)?"""
    try:
        ast.parse(source, "<pattern>", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def compile_python(
    source: str, *, expression: bool, modules: dict[str, frozenset[str]]
) -> CompiledPython:
    """Compile *source* as a pattern expression (or script). Raises `PatternError` with code
    `pattern-compile` or `pattern-refused` and a message naming line and column."""
    try:
        tree: ast.Expression | ast.Module = (
            ast.parse(source, "<pattern>", "eval")
            if expression
            else ast.parse(source, "<pattern>", "exec")
        )
    except SyntaxError as exc:
        hint = ""
        if expression and _is_script(source):
            hint = (
                ' (it is statements: a script pattern, format "script" or `aa subscribe --script '
                "FILE`, runs them)"
            )
        raise PatternError(
            f"pattern does not compile: {_where(exc)}: {exc.msg}{hint}", code=COMPILE_ERROR
        ) from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise PatternError(f"pattern does not compile: {_short(exc)}", code=COMPILE_ERROR) from None

    names = frozenset(n.id for n in ast.walk(tree) if isinstance(n, ast.Name))
    mentions = names.union(
        n.attr if isinstance(n, ast.Attribute) else str(n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute)
        or (isinstance(n, ast.Constant) and isinstance(n.value, str))
    )
    loops = any(isinstance(n, _LOOPS) for n in ast.walk(tree))
    base = _ExprPolicy if expression else _ScriptPolicy
    policy = type(
        base.__name__, (base,), {"modules": modules}
    )  # per call: engines may live in threads
    compiler = compile_restricted_eval if expression else compile_restricted_exec
    try:
        result = compiler(tree, filename="<pattern>", policy=policy)
    except SyntaxError as exc:  # found by CPython's compiler, e.g. 'return' outside function
        raise PatternError(
            f"pattern does not compile: {_where(exc)}: {exc.msg}", code=COMPILE_ERROR
        ) from None
    except (RecursionError, MemoryError):
        raise PatternError(
            "pattern does not compile: it is nested too deeply", code=COMPILE_ERROR
        ) from None
    if result.errors:
        raise PatternError(
            "pattern refused: " + "; ".join(dict.fromkeys(result.errors)), code=REFUSED
        )
    assert result.code is not None
    return CompiledPython(code=result.code, names=names, mentions=mentions, loops=loops)


#: An expression's logic where only its truth counts: ``("and", parts)``, ``("or", parts)``,
#: ``("not", part)``, or ``("leaf", code)`` for an operand that is none of these.
Logic = tuple[str, Any]


def compile_tests(source: str, *, modules: dict[str, frozenset[str]]) -> Logic | None:
    """The `and`/`or`/`not` of the expression *source* (already compiled whole by
    `compile_python`), each other operand compiled on its own, so that the kernel can give
    an operand that raises the value "unknown" (`python_kernel`) rather than lose the whole
    pattern to it; None when the expression is none of the three. Raises `PatternError`."""
    tree = ast.parse(source, "<pattern>", "eval")
    if not _is_logic(tree.body):
        return None
    policy = type(_ExprPolicy.__name__, (_ExprPolicy,), {"modules": modules})

    def build(node: ast.expr) -> Logic:
        if isinstance(node, ast.BoolOp):
            kind = "and" if isinstance(node.op, ast.And) else "or"
            return (kind, tuple(build(v) for v in node.values))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return ("not", build(node.operand))
        leaf = ast.Expression(body=node)
        result = compile_restricted_eval(leaf, filename="<pattern>", policy=policy)
        if result.errors or result.code is None:  # the whole compiled: its parts do too
            raise PatternError(
                "pattern refused: " + "; ".join(dict.fromkeys(result.errors)), code=REFUSED
            )
        return ("leaf", result.code)

    try:
        return build(tree.body)
    except (SyntaxError, RecursionError, MemoryError) as exc:
        raise PatternError(f"pattern does not compile: {_short(exc)}", code=COMPILE_ERROR) from None


def _is_logic(node: ast.expr) -> bool:
    return isinstance(node, ast.BoolOp) or (
        isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)
    )


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "..."


class _Policy(RestrictingNodeTransformer):
    expression: ClassVar[bool] = False
    #: Importable modules and their members (set by compile_python).
    modules: ClassVar[dict[str, frozenset[str]]] = {}

    def error(self, node: ast.AST, info: str) -> None:
        line, col = getattr(node, "lineno", None), getattr(node, "col_offset", None)
        where = (
            f"line {line}, col {col + 1}"
            if line is not None and col is not None
            else f"line {line}"
        )
        self.errors.append(f"{where}: {info}")

    def _call(self, name: str, args: list[ast.expr], where: Any) -> ast.Call:
        call = ast.Call(func=ast.Name(name, ast.Load()), args=args, keywords=[])
        copy_locations(call, where)
        return call

    # -- names and attributes --------------------------------------------------------------

    def visit_Name(self, node: ast.Name) -> Any:
        reason = FORBIDDEN_NAMES.get(node.id)
        if reason is not None:
            self.error(node, f"{node.id!r} is not available in patterns ({reason})")
            return node
        if node.id == "state" and not isinstance(node.ctx, ast.Load):
            self.error(
                node, "'state' cannot be rebound; change it in place, e.g. state['high'] = True"
            )
        return super().visit_Name(node)

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        attr = node.attr
        problem = None
        if attr.startswith("_"):
            problem = f"private attribute {attr!r} is not accessible in patterns"
        elif attr in INSPECT_ATTRIBUTES:
            problem = f"attribute {attr!r} is not accessible in patterns"
        elif not isinstance(node.ctx, ast.Load):
            problem = f"attributes cannot be assigned or deleted in patterns (.{attr})"
        elif self.expression and attr in MUTATING_METHODS:
            problem = f"expressions may not change what they read (.{attr}); use a script"
        node = self.node_contents_visit(node)  # report problems inside, too
        if problem is not None:
            self.error(node, problem)
            return node
        if attr in ROUTED_ATTRIBUTES:
            return self._call("_getattr_", [node.value, ast.Constant(attr)], node)
        return node

    def visit_Subscript(self, node: ast.Subscript) -> Any:
        return self.node_contents_visit(node)  # native: every reachable container is safe to index

    def visit_Call(self, node: ast.Call) -> Any:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("getattr", "hasattr") and len(node.args) >= 2:
            name = node.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                if name.value.startswith("_") or name.value in INSPECT_ATTRIBUTES:
                    self.error(
                        node,
                        f"{func.id}(x, {name.value!r}): private attributes are not accessible in "
                        "patterns",
                    )
        node = self.node_contents_visit(node)
        if any(isinstance(a, ast.Starred) for a in node.args) or any(
            k.arg is None for k in node.keywords
        ):
            node.args.insert(0, node.func)
            node.func = ast.Name("_apply_", ast.Load())
            copy_locations(node.func, node.args[0])
            func = node.args[0]
        else:
            func = node.func
        if isinstance(func, ast.Name) and func.id in ("str", "bytes"):
            func.id = f"_{func.id}_"
        return node

    # -- operators -------------------------------------------------------------------------

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        node = self.node_contents_visit(node)
        guard = _BINOP_GUARDS.get(type(node.op))
        if guard is None:
            return node
        return self._call(guard, [node.left, node.right], node)

    def visit_AugAssign(self, node: ast.AugAssign) -> Any:
        node = self.node_contents_visit(node)
        op = IOPERATOR_TO_STR[type(node.op)]
        target = node.target
        new: ast.stmt
        if isinstance(target, ast.Name):
            args = [ast.Constant(op), ast.Name(target.id, ast.Load()), node.value]
            new = ast.Assign(
                targets=[ast.Name(target.id, ast.Store())],
                value=self._call("_inplacevar_", args, node),
            )
        elif isinstance(target, ast.Subscript) and not isinstance(target.slice, ast.Slice):
            args = [target.value, target.slice, ast.Constant(op), node.value]
            new = ast.Expr(self._call("_aug_item_", args, node))
        else:
            if not isinstance(target, ast.Attribute):  # attributes were reported already
                self.error(node, "augmented assignment to a slice is not supported in patterns")
            return node
        copy_locations(new, node)
        return new

    def visit_FormattedValue(self, node: ast.FormattedValue) -> Any:
        node = self.node_contents_visit(node)
        spec: ast.expr = node.format_spec if node.format_spec is not None else ast.Constant(None)
        call = self._call(
            "_fstring_field_", [node.value, ast.Constant(node.conversion), spec], node
        )
        new = ast.FormattedValue(value=call, conversion=-1, format_spec=None)
        copy_locations(new, node)
        return new

    def visit_NamedExpr(self, node: ast.NamedExpr) -> Any:
        if self.expression:
            self.error(node, "assignment expressions (:=) are not allowed in pattern expressions")
            return node
        return super().visit_NamedExpr(node)

    # -- loops, functions, exceptions ------------------------------------------------------

    def _tick_stmt(self, where: Any) -> ast.stmt:
        stmt = ast.Expr(self._call("_tick_", [], where))
        copy_locations(stmt, where)
        return stmt

    def visit_For(self, node: ast.For) -> Any:
        node = cast(ast.For, super().visit_For(node))  # the node, its children visited
        node.body.insert(0, self._tick_stmt(node))
        return node

    def visit_While(self, node: ast.While) -> Any:
        node = cast(ast.While, super().visit_While(node))
        node.body.insert(0, self._tick_stmt(node))
        return node

    def visit_comprehension(self, node: ast.comprehension) -> Any:
        node = cast(ast.comprehension, super().visit_comprehension(node))
        node.ifs.insert(0, self._call("_tick_", [], node.target))
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> Any:
        node = cast(ast.FunctionDef, super().visit_FunctionDef(node))
        guard = ast.Name("_guard_function_", ast.Load())
        copy_locations(guard, node)
        node.decorator_list.append(
            guard
        )  # last = innermost: user decorators wrap the guarded function
        return node

    def visit_Lambda(self, node: ast.Lambda) -> Any:
        node = cast(ast.Lambda, super().visit_Lambda(node))
        return self._call("_guard_function_", [node], node)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> Any:
        node = cast(ast.ExceptHandler, super().visit_ExceptHandler(node))
        node.type = self._call("_exc_filter_", [node.type or ast.Constant(None)], node)
        return node

    def visit_ClassDef(self, node: ast.ClassDef) -> Any:
        self.error(node, "class definitions are not supported in patterns; use dicts")

    def visit_Yield(self, node: ast.Yield) -> Any:
        self.error(node, "generators (yield) are not supported in patterns")

    def visit_YieldFrom(self, node: ast.YieldFrom) -> Any:
        self.error(node, "generators (yield) are not supported in patterns")

    # -- imports ---------------------------------------------------------------------------

    def _allowed(self) -> str:
        return ", ".join(sorted(self.modules))

    def visit_Import(self, node: ast.Import) -> Any:
        for alias in node.names:
            if alias.name not in self.modules:
                self.error(
                    node,
                    f"import of {alias.name!r} is not allowed (patterns may import: "
                    f"{self._allowed()})",
                )
        return super().visit_Import(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> Any:
        members = self.modules.get(node.module or "")
        if node.level or members is None:
            self.error(
                node,
                f"import from {node.module!r} is not allowed (patterns may import: "
                f"{self._allowed()})",
            )
        else:
            for alias in node.names:
                if alias.name != "*" and alias.name not in members:
                    self.error(
                        node, f"module {node.module!r} has no member {alias.name!r} in patterns"
                    )
        return super().visit_ImportFrom(node)


class _ExprPolicy(_Policy):
    expression = True


class _ScriptPolicy(_Policy):
    expression = False
