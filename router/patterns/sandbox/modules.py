"""The modules a pattern may import, as read-only proxies with an explicit list of members.

Why proxies and explicit lists rather than the real modules: a module's public attributes
include the modules it imported itself (`statistics.sys`, `datetime.sys`,
`re.enum.sys.modules["os"]`), so handing a pattern the real `statistics` hands it `sys`. A
proxy exposes only the members named here and has no `__name__`, which matters: when
`from X import y` fails, CPython looks up `sys.modules[X.__name__ + "." + y]` (bpo-17636),
and a proxy that had a `__name__` would let `from json import decoder` fetch the real
submodule. Members that can allocate without bound in C get a guarded wrapper; iterators
that can run forever (`count`, `cycle`, `repeat`) or explode combinatorially (`product`,
`permutations`, ...) tick on every item, so a C consumer like `list()` or `sum()` over them
is still stopped by the time budget.

`random` is backed by a `RandomSwitch`: its functions call the switch's current
`random.Random`, which is the engine's own unless the host sets one per pattern instance
(the worker tier does, before every evaluation), so one pattern's `seed()` fixes neither
the router's random numbers nor another pattern's.
"""

from __future__ import annotations

import collections
import datetime
import functools
import itertools
import json
import math
import operator
import random
import re
import statistics
import string
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .budget import MEMORY
from .guards import Guards, text_size
from .limits import MAX_INT_BITS

__all__ = ["ModuleProxy", "MODULE_NAMES", "RandomSwitch", "make_modules"]

_MATH_PLAIN = [
    "acos",
    "acosh",
    "asin",
    "asinh",
    "atan",
    "atan2",
    "atanh",
    "cbrt",
    "ceil",
    "copysign",
    "cos",
    "cosh",
    "degrees",
    "dist",
    "e",
    "erf",
    "erfc",
    "exp",
    "exp2",
    "expm1",
    "fabs",
    "floor",
    "fmod",
    "frexp",
    "fsum",
    "gamma",
    "gcd",
    "hypot",
    "inf",
    "isclose",
    "isfinite",
    "isinf",
    "isnan",
    "isqrt",
    "ldexp",
    "lgamma",
    "log",
    "log10",
    "log1p",
    "log2",
    "modf",
    "nan",
    "nextafter",
    "pi",
    "pow",
    "radians",
    "remainder",
    "sin",
    "sinh",
    "sqrt",
    "tan",
    "tanh",
    "tau",
    "trunc",
    "ulp",
]
_RE_PLAIN = [
    "compile",
    "search",
    "match",
    "fullmatch",
    "split",
    "findall",
    "finditer",
    "escape",
    "error",
    "IGNORECASE",
    "I",
    "MULTILINE",
    "M",
    "DOTALL",
    "S",
    "VERBOSE",
    "X",
    "ASCII",
    "A",
    "UNICODE",
    "U",
    "NOFLAG",
]
_STATISTICS_PLAIN = [
    "mean",
    "fmean",
    "geometric_mean",
    "harmonic_mean",
    "median",
    "median_low",
    "median_high",
    "median_grouped",
    "mode",
    "multimode",
    "pstdev",
    "pvariance",
    "stdev",
    "variance",
    "correlation",
    "covariance",
    "linear_regression",
    "StatisticsError",
]
_RANDOM_METHODS = [
    "random",
    "uniform",
    "randint",
    "randrange",
    "choice",
    "sample",
    "shuffle",
    "gauss",
    "normalvariate",
    "lognormvariate",
    "expovariate",
    "vonmisesvariate",
    "gammavariate",
    "betavariate",
    "paretovariate",
    "weibullvariate",
    "triangular",
    "seed",
]
_STRING_PLAIN = [
    "ascii_letters",
    "ascii_lowercase",
    "ascii_uppercase",
    "digits",
    "hexdigits",
    "octdigits",
    "punctuation",
    "printable",
    "whitespace",
    "capwords",
]
_OPERATOR_PLAIN = [
    "lt",
    "le",
    "eq",
    "ne",
    "ge",
    "gt",
    "not_",
    "truth",
    "is_",
    "is_not",
    "abs",
    "and_",
    "floordiv",
    "index",
    "inv",
    "invert",
    "matmul",
    "neg",
    "or_",
    "pos",
    "rshift",
    "sub",
    "truediv",
    "xor",
    "contains",
    "countOf",
    "indexOf",
    "getitem",
    "itemgetter",
    "length_hint",
]
_ITERTOOLS_PLAIN = [
    "chain",
    "compress",
    "dropwhile",
    "filterfalse",
    "groupby",
    "islice",
    "pairwise",
    "starmap",
    "takewhile",
    "zip_longest",
]
_ITERTOOLS_TICKING = [
    "count",
    "cycle",
    "repeat",
    "product",
    "permutations",
    "combinations",
    "combinations_with_replacement",
]
#: Most copies `itertools.tee` may make.
_MAX_TEE = 64
#: Widest JSON indent; deeper indents multiply the text by the nesting depth.
_MAX_JSON_INDENT = 8
#: Longest JSON separator.
_MAX_JSON_SEPARATOR = 8


class ModuleProxy:
    """A read-only module stand-in. Unknown members raise AttributeError with a hint."""

    __slots__ = ("_members", "_label")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # `type(math)` hands a pattern this class: it must not build modules of its own.
        raise TypeError("modules cannot be built in patterns")

    @classmethod
    def _make(cls, label: str, members: dict[str, Any]) -> ModuleProxy:
        proxy = object.__new__(cls)
        object.__setattr__(proxy, "_members", members)
        object.__setattr__(proxy, "_label", label)
        return proxy

    def __getattr__(self, name: str) -> Any:
        try:
            return self._members[name]
        except KeyError:
            raise AttributeError(
                f"module {self._label!r} has no member {name!r} in patterns"
            ) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"module {self._label!r} is read-only in patterns")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"module {self._label!r} is read-only in patterns")

    def __dir__(self) -> list[str]:
        return sorted(self._members)

    def __repr__(self) -> str:
        return f"<module {self._label!r} (pattern sandbox)>"


class RandomSwitch:
    """The `random.Random` the sandbox's `random` module uses right now (`current`)."""

    __slots__ = ("current",)

    def __init__(self) -> None:
        self.current = random.Random()


def _switched(switch: RandomSwitch, name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(switch.current, name)(*args, **kwargs)

    return call


def make_modules(g: Guards, switch: RandomSwitch | None = None) -> dict[str, ModuleProxy]:
    """The importable modules of one engine, by name."""
    switch = switch or RandomSwitch()
    tick = g.tick

    def ticking(factory: Callable[..., Iterable[Any]]) -> Callable[..., Iterator[Any]]:
        def make(*args: Any, **kwargs: Any) -> Iterator[Any]:
            for item in factory(*args, **kwargs):
                tick()
                yield item

        return make

    def bits_of(what: str, bits: float) -> None:
        if bits > MAX_INT_BITS:
            g.budget.stop(
                MEMORY,
                f"pattern stopped: {what} would have about {int(bits):,} bits (limit "
                f"{MAX_INT_BITS:,})",
            )

    # -- math ------------------------------------------------------------------------------
    def factorial(n: int) -> int:
        if isinstance(n, int) and n > 2:
            bits_of(f"factorial({n})", n * math.log2(n))
        return math.factorial(n)

    def comb(n: int, k: int) -> int:
        if isinstance(n, int) and isinstance(k, int) and n > 2 and 0 < k < n:
            bits_of(f"comb({n}, {k})", min(k, n - k) * math.log2(n))
        return math.comb(n, k)

    def perm(n: int, k: int | None = None) -> int:
        if isinstance(n, int) and n > 2:
            kk = n if k is None else k
            bits_of(f"perm({n}, {kk})", min(kk, n) * math.log2(n) if isinstance(kk, int) else 0)
        return math.perm(n, k)

    def prod(iterable: Iterable[Any], *, start: Any = 1) -> Any:
        total = start
        for item in iterable:
            tick()
            total = g.mul(total, item)
        return total

    def lcm(*ints: int) -> int:
        bits_of("this lcm", sum(i.bit_length() for i in ints if isinstance(i, int)))
        return math.lcm(*ints)

    math_members = {n: getattr(math, n) for n in _MATH_PLAIN if hasattr(math, n)}
    math_members.update(factorial=factorial, comb=comb, perm=perm, prod=prod, lcm=lcm)

    # -- re --------------------------------------------------------------------------------
    def sub(pattern: Any, repl: Any, string: Any, count: int = 0, flags: int = 0) -> Any:
        return g_sub(re.compile(pattern, flags), repl, string, count)

    def subn(pattern: Any, repl: Any, string: Any, count: int = 0, flags: int = 0) -> Any:
        return g_sub(re.compile(pattern, flags), repl, string, count, with_count=True)

    g_sub = guarded_sub(g)
    re_members = {n: getattr(re, n) for n in _RE_PLAIN if hasattr(re, n)}
    re_members.update(sub=sub, subn=subn)

    # -- statistics ------------------------------------------------------------------------
    def quantiles(data: Iterable[Any], *, n: int = 4, method: Any = "exclusive") -> list[float]:
        if isinstance(n, int):
            g.sized(n, "these quantiles")
        return statistics.quantiles(data, n=n, method=method)

    stats_members = {n: getattr(statistics, n) for n in _STATISTICS_PLAIN if hasattr(statistics, n)}
    stats_members["quantiles"] = quantiles

    # -- random ----------------------------------------------------------------------------
    random_members: dict[str, Any] = {n: _switched(switch, n) for n in _RANDOM_METHODS}
    random_members.update(
        choices=guarded_method(g, "choices", _switched(switch, "choices")),
        getrandbits=guarded_method(g, "getrandbits", _switched(switch, "getrandbits")),
        randbytes=guarded_method(g, "randbytes", _switched(switch, "randbytes")),
        Random=random.Random,
    )

    # -- json ------------------------------------------------------------------------------
    def dumps(
        obj: Any,
        *,
        sort_keys: bool = False,
        indent: int | str | None = None,
        separators: tuple[str, str] | None = None,
        ensure_ascii: bool = True,
        allow_nan: bool = True,
        skipkeys: bool = False,
        default: Callable[[Any], Any] | None = None,
    ) -> str:
        width = len(indent) if isinstance(indent, str) else (indent or 0)
        if not isinstance(width, int) or width > _MAX_JSON_INDENT:
            raise ValueError(f"json indent in patterns is at most {_MAX_JSON_INDENT}")
        if separators is not None and any(len(s) > _MAX_JSON_SEPARATOR for s in separators):
            raise ValueError(
                f"json separators in patterns are at most {_MAX_JSON_SEPARATOR} characters"
            )
        g.sized(
            g_text_size(obj)
            * (1 + 8 * width)
            * (2 if separators else 1)
            * (6 if ensure_ascii else 1),
            "this JSON text",
        )
        return json.dumps(
            obj,
            sort_keys=sort_keys,
            indent=indent,
            separators=separators,
            ensure_ascii=ensure_ascii,
            allow_nan=allow_nan,
            skipkeys=skipkeys,
            default=default,
        )

    def loads(
        s: str | bytes,
        *,
        object_hook: Callable[..., Any] | None = None,
        object_pairs_hook: Callable[..., Any] | None = None,
        parse_float: Callable[[str], Any] | None = None,
        parse_int: Callable[[str], Any] | None = None,
        parse_constant: Callable[[str], Any] | None = None,
    ) -> Any:
        return json.loads(
            s,
            object_hook=object_hook,
            object_pairs_hook=object_pairs_hook,
            parse_float=parse_float,
            parse_int=parse_int,
            parse_constant=parse_constant,
        )

    def g_text_size(obj: Any) -> int:
        return text_size(obj, g.max_sequence)

    # -- itertools -------------------------------------------------------------------------
    def accumulate(
        iterable: Iterable[Any],
        func: Callable[[Any, Any], Any] | None = None,
        *,
        initial: Any = None,
    ) -> Iterator[Any]:
        return ticking(itertools.accumulate)(iterable, func or g.add, initial=initial)

    def tee(iterable: Iterable[Any], n: int = 2) -> tuple[Iterator[Any], ...]:
        if not isinstance(n, int) or n > _MAX_TEE:
            raise ValueError(f"tee() in patterns makes at most {_MAX_TEE} copies")
        return itertools.tee(iterable, n)

    iter_members: dict[str, Any] = {
        n: getattr(itertools, n) for n in _ITERTOOLS_PLAIN if hasattr(itertools, n)
    }
    iter_members.update({n: ticking(getattr(itertools, n)) for n in _ITERTOOLS_TICKING})
    iter_members.update(accumulate=accumulate, tee=tee)

    # -- operator --------------------------------------------------------------------------
    op_members = {n: getattr(operator, n) for n in _OPERATOR_PLAIN}
    op_members.update(add=g.add, concat=g.add, mul=g.mul, pow=g.pow, lshift=g.lshift, mod=g.mod)

    modules = {
        "math": math_members,
        "re": re_members,
        "statistics": stats_members,
        "random": random_members,
        "json": {"dumps": dumps, "loads": loads, "JSONDecodeError": json.JSONDecodeError},
        "string": {n: getattr(string, n) for n in _STRING_PLAIN},
        "itertools": iter_members,
        "functools": {
            "reduce": functools.reduce,
            "partial": functools.partial,
            "cmp_to_key": functools.cmp_to_key,
        },
        "operator": op_members,
        "collections": {
            n: getattr(collections, n)
            for n in ("Counter", "OrderedDict", "defaultdict", "deque", "ChainMap")
        },
        "datetime": {
            "date": datetime.date,
            "datetime": datetime.datetime,
            "time": datetime.time,
            "timedelta": datetime.timedelta,
            "timezone": datetime.timezone,
            "MINYEAR": datetime.MINYEAR,
            "MAXYEAR": datetime.MAXYEAR,
            "UTC": datetime.UTC,
        },
    }
    return {name: ModuleProxy._make(name, members) for name, members in modules.items()}


def guarded_sub(g: Guards) -> Callable[..., Any]:
    """`Pattern.sub` with the output's size counted match by match (a replacement with group
    references can multiply a long input: `re.sub(".", "\\g<0>" * 1000, s)`)."""

    def sub(
        pattern: re.Pattern[Any], repl: Any, string: Any, count: int = 0, with_count: bool = False
    ) -> Any:
        total = len(string)
        literal = (isinstance(repl, str) and "\\" not in repl) or (
            isinstance(repl, bytes) and b"\\" not in repl
        )

        def each(m: re.Match[Any]) -> Any:
            nonlocal total
            g.tick()
            if literal:
                piece = repl
            else:
                piece = guarded_expand(g, m, repl) if not callable(repl) else repl(m)
            total += len(piece) - (m.end() - m.start())
            if total > g.max_sequence:
                g.refuse(f"this substitution would have more than {g.max_sequence:,} characters")
            return piece

        if with_count:
            return pattern.subn(each, string, count)
        return pattern.sub(each, string, count)

    return sub


def guarded_expand(g: Guards, m: re.Match[Any], template: Any) -> Any:
    """`Match.expand` after bounding its size: each group reference copies at most the
    longest group."""
    refs = template.count("\\" if isinstance(template, str) else b"\\")
    longest = max((len(x) for x in m.groups() if x is not None), default=0)
    g.sized(len(template) + refs * max(longest, m.end() - m.start()), "this expansion")
    return m.expand(template)


def guarded_method(g: Guards, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    """Size checks of the random methods that take a size."""
    if name == "choices":

        def choices(
            population: Any, weights: Any = None, *, cum_weights: Any = None, k: int = 1
        ) -> list[Any]:
            if isinstance(k, int):
                g.sized(k, "these choices")
            chosen: list[Any] = method(population, weights, cum_weights=cum_weights, k=k)
            return chosen

        return choices
    if name == "getrandbits":

        def getrandbits(k: int) -> int:
            if isinstance(k, int) and k > MAX_INT_BITS:
                g.refuse(f"getrandbits({k}) (limit {MAX_INT_BITS:,} bits)")
            bits: int = method(k)
            return bits

        return getrandbits

    def randbytes(n: int) -> bytes:
        if isinstance(n, int):
            g.sized(n, "these random bytes")
        made: bytes = method(n)
        return made

    return randbytes


#: Importable modules and their members (for checking imports at compile time).
MODULE_NAMES = frozenset(
    {
        "math",
        "re",
        "statistics",
        "random",
        "json",
        "string",
        "itertools",
        "functools",
        "operator",
        "collections",
        "datetime",
    }
)
