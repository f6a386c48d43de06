"""The builtins a pattern sees, and the guarded attribute access for the few method names
that can allocate without bound or read private attributes.

Attribute access in patterns is native (`Sensor.startswith` costs what it costs in plain
Python) because the names are known at compile time: `compiler.py` refuses names starting with
`_` and the frame/code attributes of `inspect`, and routes only the names in
`ROUTED_ATTRIBUTES` through `getattr_routed` here. That is as strict as RestrictedPython's
`safer_getattr`, whose checks are by name too, and keeps the hot path free of calls. The
dynamic forms (`getattr(x, name)`, `hasattr`) apply the same rules at run time, and breaking
them is a `pattern-forbidden` stop, not a mere error: probing for `__class__` is an attack.

Expressions are filters and must not change what they look at: the event's values and meta
are the router's own objects, shared with every other pattern. So in expressions the
mutating method names (`append`, `update`, `shuffle`, ...) are refused as well. Scripts get
private copies of everything they can reach (see `views.py`) and may mutate them freely.
"""

from __future__ import annotations

import builtins
from collections import Counter
from collections.abc import Callable
from typing import Any

from RestrictedPython.transformer import INSPECT_ATTRIBUTES

from .budget import FORBIDDEN
from .guards import Guards
from .modules import ModuleProxy, guarded_expand, guarded_method, guarded_sub

__all__ = [
    "FORBIDDEN_NAMES",
    "MUTATING_METHODS",
    "ROUTED_ATTRIBUTES",
    "make_builtins",
]

#: Method names that go through `getattr_routed` (see the handlers below).
ROUTED_ATTRIBUTES = frozenset(
    {
        "format",
        "format_map",
        "join",
        "ljust",
        "rjust",
        "center",
        "zfill",
        "expandtabs",
        "replace",
        "translate",
        "to_bytes",
        "elements",
        "sub",
        "subn",
        "expand",
        "choices",
        "randbytes",
        "getrandbits",
        "strftime",
    }
)

#: Methods that change their object in place: refused in expressions.
MUTATING_METHODS = frozenset(
    {
        "append",
        "extend",
        "insert",
        "pop",
        "popitem",
        "remove",
        "clear",
        "update",
        "setdefault",
        "sort",
        "reverse",
        "add",
        "discard",
        "difference_update",
        "intersection_update",
        "symmetric_difference_update",
        "shuffle",
        "rotate",
        "appendleft",
        "extendleft",
        "popleft",
        "move_to_end",
        "subtract",
        "seed",
        "setstate",
    }
)

#: Names refused at compile time, with the reason shown to the subscriber.
FORBIDDEN_NAMES = {
    **dict.fromkeys(
        ("open", "input", "breakpoint", "help", "exit", "quit"), "no file or console access"
    ),
    **dict.fromkeys(("exec", "eval", "compile"), "patterns cannot run other code"),
    **dict.fromkeys(
        ("globals", "locals", "vars", "dir", "memoryview", "super", "object"), "no introspection"
    ),
    **dict.fromkeys(("setattr", "delattr"), "objects have no writable attributes in patterns"),
    "print": "there is no console; forward an event instead",
    "printed": "there is no console; forward an event instead",
}

_SCALAR_TEXT = (str, bytes)


def make_builtins(
    g: Guards, modules: dict[str, ModuleProxy], *, expression: bool
) -> dict[str, Any]:
    """The `__builtins__` of a pattern (one dict per engine and format)."""
    routed = make_routed_getattr(g)
    stop = g.budget.stop
    max_seq = g.max_sequence

    def check_name(name: Any, what: str) -> None:
        if type(name) is not str:
            raise TypeError(f"{what}(): attribute name must be str")
        if name.startswith("_") or name in INSPECT_ATTRIBUTES:
            stop(
                FORBIDDEN,
                f"pattern stopped: {what}(x, {name!r}): private attributes are not accessible in "
                "patterns",
            )
        if expression and name in MUTATING_METHODS:
            stop(
                FORBIDDEN,
                f"pattern stopped: {what}(x, {name!r}): expressions may not change what they read",
            )

    def getattr_(obj: Any, name: str, *default: Any) -> Any:
        check_name(name, "getattr")
        try:
            return routed(obj, name) if name in ROUTED_ATTRIBUTES else getattr(obj, name)
        except AttributeError:
            if default:
                return default[0]
            raise

    def hasattr_(obj: Any, name: str) -> bool:
        check_name(name, "hasattr")
        return hasattr(obj, name)

    def range_(*args: int) -> range:
        r = range(*args)
        try:
            n = len(r)
        except OverflowError:
            n = max_seq + 1
        if n > max_seq:
            g.refuse(f"range of {n:,} elements (limit {max_seq:,})")
        return r

    def pow_(base: Any, exp: Any, mod: Any = None) -> Any:
        g.check_pow(base, exp, mod)
        return pow(base, exp, mod)

    def round_(number: Any, ndigits: Any = None) -> Any:
        if isinstance(number, int) and isinstance(ndigits, int) and ndigits < 0:
            g.int_bits(-ndigits * 10 // 3, "this rounding")
        return round(number) if ndigits is None else round(number, ndigits)

    def sum_(iterable: Any, start: Any = 0) -> Any:
        if not isinstance(start, (int, float, complex)):
            raise TypeError(
                "sum() in patterns adds numbers; join text with ''.join() and lists with "
                "itertools.chain"
            )
        return sum(iterable, start)

    def type_(obj: Any) -> type:
        t = type(obj)
        if issubclass(t, type):
            stop(FORBIDDEN, "pattern stopped: type() of a class is not available in patterns")
        return t

    def iter_(obj: Any) -> Any:
        return iter(obj)

    def repr_(obj: Any) -> str:
        g.text_of(obj, "this repr()")
        return repr(obj)

    def ascii_(obj: Any) -> str:
        g.text_of(obj, "this ascii()")
        return ascii(obj)

    def format_(value: Any, spec: str = "") -> str:
        g.text_of(value, "this format()")
        if type(spec) is str:
            g.check_spec(spec)
        return format(value, spec)

    def str_(*args: Any, **kwargs: Any) -> str:
        if len(args) == 1 and not kwargs:
            g.text_of(args[0], "this str()")
        return str(*args, **kwargs)

    def bytes_(*args: Any, **kwargs: Any) -> bytes:
        if args and isinstance(args[0], int):
            g.sized(args[0], "these bytes")
        return bytes(*args, **kwargs)

    def import_(
        name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
    ) -> Any:
        if level or name not in modules:
            stop(FORBIDDEN, f"pattern stopped: import of {name!r} is not allowed in patterns")
        return modules[name]

    table: dict[str, Any] = {n: getattr(builtins, n) for n in _PLAIN_BUILTINS}
    table.update(modules)
    table.update(
        getattr=getattr_,
        hasattr=hasattr_,
        range=range_,
        pow=pow_,
        round=round_,
        sum=sum_,
        type=type_,
        iter=iter_,
        repr=repr_,
        ascii=ascii_,
        format=format_,
        __import__=import_,
        # The calls `str(x)` and `bytes(n)` are rewritten to these (the names themselves stay
        # the real classes, so `isinstance(x, str)` works).
        _str_=str_,
        _bytes_=bytes_,
    )
    return table


def make_routed_getattr(g: Guards) -> Callable[[Any, str], Any]:
    """`obj.name` for a name in ROUTED_ATTRIBUTES: the method, wrapped in a size check when
    *obj* is of a type whose method of that name can allocate without bound."""
    stop = g.budget.stop
    sub = guarded_sub(g)

    def padded(obj: Any, method: Callable[..., Any]) -> Callable[..., Any]:
        def pad(width: Any, *args: Any) -> Any:
            if isinstance(width, int):
                g.sized(max(width, len(obj)), "this padded text")
            return method(width, *args)

        return pad

    def expandtabs(obj: Any, method: Callable[..., Any]) -> Callable[..., Any]:
        def expand(tabsize: Any = 8) -> Any:
            tabs = obj.count(b"\t" if isinstance(obj, bytes) else "\t")
            if isinstance(tabsize, int):
                g.sized(len(obj) + tabs * max(tabsize, 0), "this text")
            return method(tabsize)

        return expand

    def to_bytes(method: Callable[..., Any]) -> Callable[..., Any]:
        def convert(length: Any = 1, byteorder: Any = "big", **kwargs: Any) -> Any:
            if isinstance(length, int):
                g.sized(length, "these bytes")
            return method(length, byteorder, **kwargs)

        return convert

    def strftime(method: Callable[..., Any]) -> Callable[..., Any]:
        def render(fmt: Any) -> Any:
            if isinstance(fmt, str):
                g.sized(len(fmt) * 16, "this strftime text")  # "%c" is 24 characters
            return method(fmt)

        return render

    def routed(obj: Any, name: str) -> Any:
        if isinstance(obj, type):
            # The unbound method would take the value as an argument and skip the checks
            # below (`Counter.elements(c)`, `type(p).sub(p, ...)`, `str.format(...)`).
            stop(
                FORBIDDEN,
                f"pattern stopped: {obj.__name__}.{name} is not available in patterns; call it on "
                "a value",
            )
        method = getattr(obj, name)
        if isinstance(obj, _SCALAR_TEXT):
            if name in ("format", "format_map"):
                stop(
                    FORBIDDEN,
                    "pattern stopped: str.format can read private attributes and is not available "
                    "in patterns; use an f-string",
                )
            if name == "join":
                return lambda items: _join(g, obj, items)
            if name in ("ljust", "rjust", "center", "zfill"):
                return padded(obj, method)
            if name == "expandtabs":
                return expandtabs(obj, method)
            if name == "replace":
                return lambda old, new, count=-1: _replace(g, obj, old, new, count)
            if name == "translate" and isinstance(obj, str):
                return lambda table: _translate(g, obj, table)
            return method
        if name == "to_bytes" and isinstance(obj, int):
            return to_bytes(method)
        if name == "elements" and isinstance(obj, Counter):
            return lambda: _elements(g, obj)
        if name in ("sub", "subn") and hasattr(obj, "groupindex"):  # a compiled re.Pattern
            return lambda repl, string, count=0: sub(
                obj, repl, string, count, with_count=name == "subn"
            )
        if name == "expand" and hasattr(obj, "groupdict"):  # an re.Match
            return lambda template: guarded_expand(g, obj, template)
        if name == "strftime" and hasattr(obj, "isoformat"):
            return strftime(method)
        if name in ("choices", "randbytes", "getrandbits") and hasattr(obj, "getstate"):
            return guarded_method(g, name, method)
        return method

    return routed


def _join(g: Guards, sep: Any, items: Any) -> Any:
    items = list(items)
    total = len(sep) * max(len(items) - 1, 0)
    for item in items:
        total += len(item) if isinstance(item, _SCALAR_TEXT) else 0
    g.sized(total, "this join")
    return sep.join(items)


def _replace(g: Guards, s: Any, old: Any, new: Any, count: int) -> Any:
    n = s.count(old) if isinstance(old, type(s)) else 0
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    grow = len(new) - len(old) if isinstance(new, type(s)) and isinstance(old, type(s)) else 0
    g.sized(len(s) + n * max(grow, 0), "this replace()")
    return s.replace(old, new, count)


def _translate(g: Guards, s: str, table: Any) -> str:
    longest = 1
    if isinstance(table, dict):
        longest = max((len(v) for v in table.values() if isinstance(v, str)), default=1)
    g.sized(len(s) * max(longest, 1), "this translate()")
    return s.translate(table)


def _elements(g: Guards, counter: Counter[Any]) -> Any:
    g.sized(sum(c for c in counter.values() if isinstance(c, int) and c > 0), "these elements")
    return counter.elements()


_PLAIN_BUILTINS = [
    "None",
    "True",
    "False",
    "abs",
    "all",
    "any",
    "bin",
    "bool",
    "callable",
    "chr",
    "complex",
    "dict",
    "divmod",
    "enumerate",
    "filter",
    "float",
    "frozenset",
    "hash",
    "hex",
    "int",
    "isinstance",
    "issubclass",
    "len",
    "list",
    "map",
    "max",
    "min",
    "next",
    "oct",
    "ord",
    "reversed",
    "set",
    "slice",
    "sorted",
    "str",
    "tuple",
    "zip",
    "bytes",
    "ArithmeticError",
    "AssertionError",
    "AttributeError",
    "BaseException",
    "Exception",
    "IndexError",
    "KeyError",
    "LookupError",
    "NameError",
    "OverflowError",
    "RecursionError",
    "RuntimeError",
    "StopIteration",
    "TypeError",
    "UnicodeError",
    "ValueError",
    "ZeroDivisionError",
]
