"""One engine's sandbox: its budget, guards, module proxies and builtins, assembled once, plus
the size estimate of a script's `state`.

Everything a pattern can reach is listed here or in the modules this one assembles:
`__builtins__` (`calls.make_builtins`), the module proxies (`modules.make_modules`), the
underscore guard names that only rewritten code can name (`GUARD_NAMES` below), and the views
of `views.py`. The engine adds per-evaluation names (`event`, `state`, `forward`, ...).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from RestrictedPython.Guards import guarded_iter_unpack_sequence, guarded_unpack_sequence

from .budget import MEMORY, Budget
from .calls import make_builtins, make_routed_getattr
from .compiler import CompiledPython, Logic, compile_python, compile_tests
from .guards import Guards
from .limits import MAX_STATE_DEPTH, HostFacts, SandboxLimits
from .modules import RandomSwitch, make_modules
from .runerrors import RunErrors
from .views import RouterView

__all__ = ["Sandbox", "measure_state"]


def _apply(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`f(*a, **k)` in pattern code (RestrictedPython's `_apply_` protocol)."""
    return func(*args, **kwargs)


class Sandbox:
    """The sandbox of one engine (one router)."""

    def __init__(self, host: HostFacts, limits: SandboxLimits) -> None:
        self.limits = limits
        self.budget = Budget(limits.time_budget, limits.max_allocation)
        g = self.guards = Guards(self.budget, limits)
        #: Which `random.Random` the `random` module uses (one per pattern in workers).
        self.random = RandomSwitch()
        self.modules = make_modules(g, self.random)
        self.module_members = {name: frozenset(dir(proxy)) for name, proxy in self.modules.items()}
        self.router = RouterView(host)
        #: Run-time errors of pattern code, per bucket, until told (`runerrors.py`).
        self.errors = RunErrors()
        #: The names only rewritten code uses (user code cannot name anything starting with
        #: "_"); put last into every namespace so no event value or parameter shadows them.
        self.guard_names: dict[str, Any] = {
            "_tick_": g.tick,
            "_add_": g.add,
            "_mul_": g.mul,
            "_pow_": g.pow,
            "_lshift_": g.lshift,
            "_mod_": g.mod,
            "_inplacevar_": g.inplacevar,
            "_aug_item_": g.aug_item,
            "_fstring_field_": g.fstring_field,
            "_guard_function_": g.guard_function,
            "_exc_filter_": g.except_filter,
            "_getattr_": make_routed_getattr(g),
            "_getiter_": iter,
            "_iter_unpack_sequence_": guarded_iter_unpack_sequence,
            "_unpack_sequence_": guarded_unpack_sequence,
            "_apply_": _apply,
        }
        self.expr_builtins = make_builtins(g, self.modules, expression=True)
        self.script_builtins = make_builtins(g, self.modules, expression=False)

    def compile(self, source: str, *, expression: bool) -> CompiledPython:
        """Compile a Python pattern; raises `PatternError`."""
        return compile_python(source, expression=expression, modules=self.module_members)

    def compile_tests(self, source: str) -> Logic | None:
        """The `and`/`or`/`not` of an expression compiled operand by operand, or None
        (`compiler.compile_tests`); raises `PatternError`."""
        return compile_tests(source, modules=self.module_members)

    def check_state(self, state: Any) -> int:
        """Stop the running pattern if *state* is over its cap; returns its object count."""
        cap = self.limits.max_state_bytes
        size, objects, depth = measure_state(state, cap)
        if depth > MAX_STATE_DEPTH:
            self.budget.stop(
                MEMORY, f"pattern stopped: its state is nested deeper than {MAX_STATE_DEPTH} levels"
            )
        if size > cap:
            self.budget.stop(
                MEMORY,
                f"pattern stopped: its state grew past {cap:,} bytes (limit max_state_bytes)",
            )
        return objects


_ATOMS = frozenset({int, float, bool, str, bytes, type(None), complex})


def measure_state(state: Any, cap: int) -> tuple[int, int, int]:
    """(estimated bytes, objects visited, deepest nesting) of *state*; each object counted
    once (shared references are free in memory); stops early once *cap* is passed. Iterative,
    so a deeply nested state cannot exhaust the router's stack."""
    seen: set[int] = set()
    total = objects = deepest = 0
    stack: list[tuple[Any, int]] = [(state, 0)]
    getsize = sys.getsizeof
    while stack:
        obj, depth = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        objects += 1
        total += getsize(obj)
        if depth > deepest:
            deepest = depth
            if deepest > MAX_STATE_DEPTH:
                break
        if total > cap:
            break
        t = type(obj)
        if t in _ATOMS:
            continue
        if isinstance(obj, dict):
            for k, v in obj.items():
                stack.append((k, depth + 1))
                stack.append((v, depth + 1))
        elif isinstance(obj, (list, tuple, set, frozenset)) or hasattr(obj, "maxlen"):  # deque
            for v in obj:
                stack.append((v, depth + 1))
    return total, objects, deepest
