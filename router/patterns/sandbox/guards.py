"""Run-time guards the rewritten pattern code calls: operators that can allocate without
bound, augmented assignment, f-string fields, calls into pattern-defined functions and
`except` clauses.

The rule every guard follows: work out the size of the result *before* CPython builds it in
C (where no tick can interrupt it), refuse it with a `pattern-memory` stop if one operation
would exceed `max_sequence` elements (or `MAX_INT_BITS` for ints), and charge large results
to the evaluation's allocation total. Numbers take a fast path: `a + b` on two floats costs
one call and two type checks.

Shared references are the subtle amplifier: `[s] * 1000` is a cheap list, but `str()` of it
is a thousand copies of `s`. Converting containers to text therefore goes through
`text_size`, which counts what the text would hold, references included, and stops counting
as soon as the cap is passed (so the estimate itself is bounded).
"""

from __future__ import annotations

import operator
import re
from collections import deque
from collections.abc import Callable, ItemsView, KeysView, Mapping, ValuesView
from datetime import date, datetime, time, timedelta
from functools import partial
from typing import Any

from .budget import MEMORY, Budget, SandboxStop
from .limits import CHARGE_THRESHOLD, MAX_CALL_DEPTH, MAX_FORMAT_WIDTH, MAX_INT_BITS, SandboxLimits

__all__ = ["Guards", "text_size"]

_NUMBERS = (int, float, complex)
_SIZED_SCALARS = (str, bytes, bytearray)
_FIXED = (bool, float, complex, type(None), date, datetime, time, timedelta)
_CONTAINERS = (list, tuple, set, frozenset, dict, deque)
_VIEWS = (KeysView, ValuesView, ItemsView)
# What follows a printf-style conversion's '%' (and its "(key)"): flags, width, precision.
# Only width and precision make text. Every part is optional and no two adjacent parts can
# match the same characters but flags and width ('0'), where the greedy flags win at once:
# so a match never backtracks, and `check_printf` scans in linear time whatever the format
# (a part such as `\([^)]*\)` would rescan to the end for every unclosed "%(").
_PRINTF_SPEC = re.compile(r"[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")
_SPEC_NUMBERS = re.compile(r"\d+")


def text_size(obj: Any, cap: int) -> int:
    """Upper estimate of len(str(obj)) / len(repr(obj)), counting shared references once per
    use; stops early (returning a value > cap) once the estimate passes *cap*."""
    total = 0
    stack = [obj]
    pop, push = stack.pop, stack.extend
    while stack:
        o = pop()
        t = type(o)
        if t is str:
            total += 2 + len(o) * 2  # quotes, and escapes in a repr
        elif t is int:
            total += 2 + o.bit_length() // 3
        elif t is bytes or t is bytearray:
            total += 3 + len(o) * 4
        elif isinstance(o, _FIXED):
            total += 40
        elif isinstance(o, dict):
            total += 2 + 4 * len(o)
            push(o.keys())
            push(o.values())
        elif isinstance(o, _CONTAINERS):
            total += 2 + 2 * len(o)
            push(o)
        elif isinstance(o, Mapping):  # mappingproxy (event.values), ChainMap
            total += 2 + 4 * len(o)
            push(o.keys())
            push(o.values())
        elif isinstance(o, _VIEWS):  # dict_values(...) prints its items
            total += 16 + 2 * len(o)
            push(o)
        elif isinstance(o, partial):
            total += 16
            push((o.func, o.args, o.keywords))
        elif isinstance(o, BaseException):
            total += 16
            push(o.args)
        elif isinstance(o, slice):
            total += 8
            push((o.start, o.stop, o.step))
        else:
            total += 80  # repr of an opaque object: "<re.Pattern ...>", "<function ...>"
        if total > cap:
            return total
    return total


class Guards:
    """The guard functions for one engine, bound to its budget and limits."""

    def __init__(self, budget: Budget, limits: SandboxLimits) -> None:
        self.budget = budget
        self.max_sequence = limits.max_sequence
        self.tick = budget.make_tick()
        #: The size checks of augmented assignments, by operator.
        self.aug_checks: dict[str, Callable[[Any, Any], None]] = {
            "+=": self.check_add,
            "*=": self.check_mul,
            "**=": self.check_pow,
            "<<=": self.check_lshift,
            "%=": self.check_mod,
        }

    # -- helpers ---------------------------------------------------------------------------

    def refuse(self, what: str) -> None:
        self.budget.stop(MEMORY, f"pattern stopped: {what}")

    def sized(self, n: int, what: str) -> None:
        """Refuse a result of *n* elements over the per-operation cap; charge a large one."""
        if n > self.max_sequence:
            self.refuse(f"{what} would have {n:,} elements (limit {self.max_sequence:,})")
        if n >= CHARGE_THRESHOLD:
            self.budget.charge(n)

    def int_bits(self, bits: int, what: str) -> None:
        if bits > MAX_INT_BITS:
            self.refuse(f"{what} would have about {bits:,} bits (limit {MAX_INT_BITS:,})")

    def text_of(self, obj: Any, what: str) -> None:
        """Refuse converting *obj* to text when the text would be too long."""
        if type(obj) in _FIXED_FAST:
            return
        n = text_size(obj, self.max_sequence)
        if n > self.max_sequence:
            self.refuse(f"{what} would be longer than {self.max_sequence:,} characters")
        if n >= CHARGE_THRESHOLD:
            self.budget.charge(n)

    # -- binary operators ------------------------------------------------------------------

    def check_mul(self, a: Any, b: Any) -> None:
        ta, tb = type(a), type(b)
        if ta is int and tb is int:
            if a and b:
                self.int_bits(a.bit_length() + b.bit_length(), "this product")
            return
        if ta is float or tb is float:
            return
        if isinstance(b, int):
            n, seq = b, a
        elif isinstance(a, int):
            n, seq = a, b
        else:
            return  # not a repetition; the operands' own __mul__ decides
        if isinstance(seq, _NUMBERS):
            return  # not a repetition either
        if n > 0 and hasattr(seq, "__len__"):
            self.sized(len(seq) * n, "this repetition")

    def mul(self, a: Any, b: Any) -> Any:
        if type(a) is not float or type(b) is not float:
            self.check_mul(a, b)
        return a * b

    def check_add(self, a: Any, b: Any) -> None:
        if isinstance(a, _NUMBERS) or isinstance(b, _NUMBERS):
            return
        if hasattr(a, "__len__") and hasattr(b, "__len__"):
            self.sized(len(a) + len(b), "this concatenation")

    def add(self, a: Any, b: Any) -> Any:
        ta = type(a)
        if (ta is int or ta is float) and type(b) in _INT_FLOAT:
            return a + b
        self.check_add(a, b)
        return a + b

    def check_pow(self, a: Any, b: Any, mod: Any = None) -> None:
        if type(b) is bool or not isinstance(b, int) or b <= 1 or mod is not None:
            return  # float powers overflow with an error; modular powers stay small
        if isinstance(a, int) and not isinstance(a, bool) and a not in (0, 1, -1):
            self.int_bits(a.bit_length() * b, "this power")

    def pow(self, a: Any, b: Any) -> Any:
        self.check_pow(a, b)
        return a**b

    def check_lshift(self, a: Any, b: Any) -> None:
        if isinstance(a, int) and isinstance(b, int) and a and b > 0:
            self.int_bits(a.bit_length() + b, "this shift")

    def lshift(self, a: Any, b: Any) -> Any:
        self.check_lshift(a, b)
        return a << b

    def check_mod(self, a: Any, b: Any) -> None:
        if isinstance(a, (str, bytes)):
            self.check_printf(a, b)

    def mod(self, a: Any, b: Any) -> Any:
        if type(a) is str or type(a) is bytes:
            self.check_printf(a, b)
        return a % b

    def check_printf(self, fmt: str | bytes, args: Any) -> None:
        text = fmt.decode("latin-1") if isinstance(fmt, bytes) else fmt
        widths = 0
        find, spec = text.find, _PRINTF_SPEC.match
        pos = find("%")
        while pos >= 0:
            pos += 1
            if text.startswith("(", pos):
                close = find(")", pos)
                if close < 0:
                    break  # "incomplete format key": the formatting itself fails
                pos = close + 1
            m = spec(text, pos)
            assert m is not None  # every part is optional
            pos = find("%", m.end() + 1)
            for part in m.groups():
                if part == "*":
                    self.refuse("'*' widths in % formatting are not supported")
                if part:
                    if int(part) > MAX_FORMAT_WIDTH:
                        self.refuse(f"a % format width of {part} (limit {MAX_FORMAT_WIDTH:,})")
                    widths += int(part)
        self.sized(len(text) + widths + text_size(args, self.max_sequence), "this % formatting")

    # -- augmented assignment --------------------------------------------------------------

    def inplacevar(self, op: str, x: Any, y: Any) -> Any:
        """`x op= y` for a name target (RestrictedPython's `_inplacevar_` protocol)."""
        check = self.aug_checks.get(op)
        if check is not None:
            check(x, y)
        return _INPLACE[op](x, y)

    def aug_item(self, target: Any, key: Any, op: str, value: Any) -> None:
        """`target[key] op= value`, e.g. `state["n"] += 1`."""
        target[key] = self.inplacevar(op, target[key], value)

    # -- formatting ------------------------------------------------------------------------

    def check_spec(self, spec: str) -> None:
        for n in _SPEC_NUMBERS.findall(spec):
            if int(n) > MAX_FORMAT_WIDTH:
                self.refuse(f"a format width of {n} (limit {MAX_FORMAT_WIDTH:,})")

    def fstring_field(self, value: Any, conversion: int, spec: str | None) -> str:
        """One `{value!conversion:spec}` field of an f-string."""
        self.text_of(value, "this f-string field")
        if conversion == 114:  # !r
            value = repr(value)
        elif conversion == 115:  # !s
            value = str(value)
        elif conversion == 97:  # !a
            value = ascii(value)
        if spec:
            self.check_spec(spec)
            return format(value, spec)
        return value if type(value) is str else format(value)

    # -- functions and exceptions ----------------------------------------------------------

    def guard_function(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Decorates every def and lambda of a pattern: a tick per call, and a depth cap."""
        budget, tick = self.budget, self.tick

        def call(*args: Any, **kwargs: Any) -> Any:
            if budget.depth >= MAX_CALL_DEPTH:
                budget.stop(
                    MEMORY,
                    f"pattern stopped: its functions recursed deeper than {MAX_CALL_DEPTH} calls",
                )
            tick()
            budget.depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                budget.depth -= 1

        return call

    @staticmethod
    def except_filter(spec: Any) -> Any:
        """The type(s) an `except` clause of a pattern catches, minus `SandboxStop`."""
        if spec is None:
            return Exception
        if isinstance(spec, tuple):
            return tuple(Exception if _catches_stop(s) else s for s in spec)
        return Exception if _catches_stop(spec) else spec


def _catches_stop(t: Any) -> bool:
    return isinstance(t, type) and issubclass(SandboxStop, t)


_INT_FLOAT = frozenset({int, float})
_FIXED_FAST = frozenset({int, float, bool, str, type(None), datetime, date, time, timedelta})
_INPLACE: dict[str, Callable[[Any, Any], Any]] = {
    "+=": operator.iadd,
    "-=": operator.isub,
    "*=": operator.imul,
    "/=": operator.itruediv,
    "//=": operator.ifloordiv,
    "%=": operator.imod,
    "**=": operator.ipow,
    "<<=": operator.ilshift,
    ">>=": operator.irshift,
    "|=": operator.ior,
    "&=": operator.iand,
    "^=": operator.ixor,
    "@=": operator.imatmul,
}
