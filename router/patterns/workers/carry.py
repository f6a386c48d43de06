"""A script's `state`, carried from one worker process to another when its pattern leaves
probation (`pool.py`, "Probation"): written by the worker it leaves, read by the worker it
joins. The router passes the bytes on and never reads them.

Only plain data crosses, as a tree of tagged msgpack arrays: numbers, strings, bytes, None,
dates and times, and lists, tuples, dicts, sets, frozensets, deques (with their `maxlen`),
`Counter`, `OrderedDict` and `defaultdict` of a builtin factory, nested at most
`MAX_STATE_DEPTH` deep, `MAX_CARRIED_NODES` values in all (a state that shares one list a
thousand times is small in memory but a thousand lists written out: it would cost the worker
that reads it seconds). Anything else (an event view, a generator, a function kept in state)
raises `NotPortable` and the pattern stays where it is: a worker never unpickles, so a worker
broken into cannot pass code to the next one. Shared references arrive as copies.
"""

from __future__ import annotations

import collections
import datetime as dt
from collections.abc import Callable
from typing import Any, Final

from aa.mesh.protocol import pack, unpack

from ..sandbox import MAX_STATE_DEPTH

__all__ = ["MAX_CARRIED_NODES", "NotPortable", "dump_state", "load_state"]

#: Most values (containers and atoms) a carried state may hold, written or read: reading
#: 10,000 costs the regular worker at most ~12 ms (5,000 one-item lists), once, while its
#: other patterns wait. A bigger state keeps its pattern on probation.
MAX_CARRIED_NODES: Final = 10_000

_ATOMS: Final = frozenset({str, bytes, bool, float, type(None)})
_FACTORIES: Final[dict[str, Callable[[], Any]]] = {
    f.__name__: f for f in (int, float, str, list, dict, set, tuple)
}


class NotPortable(ValueError):
    """The state holds something that cannot be carried as plain data."""


def dump_state(state: dict[str, Any]) -> bytes:
    """*state* as bytes `load_state` rebuilds; raises `NotPortable`."""
    try:
        return pack(_out(state, 0, [MAX_CARRIED_NODES]))
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise NotPortable(str(exc)) from None


def load_state(blob: bytes) -> dict[str, Any]:
    """The state *blob* holds; raises `NotPortable` for bytes `dump_state` did not write."""
    try:
        state = _in(unpack(blob), 0, [MAX_CARRIED_NODES + 1])
    except Exception as exc:  # anything in bytes from another process: not a state
        raise NotPortable(f"{type(exc).__name__}: {exc}") from None
    if type(state) is not dict:
        raise NotPortable("a state is a dict")
    return state


def _out(obj: Any, depth: int, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise NotPortable(f"state holds more than {MAX_CARRIED_NODES:,} values")
    if depth > MAX_STATE_DEPTH:
        raise NotPortable("state nested too deep")
    t = type(obj)
    if t in _ATOMS:
        return obj
    if t is int:
        return obj if -(1 << 63) <= obj < (1 << 64) else ["I", str(obj)]
    d = depth + 1
    if t is list or t is tuple or t is set or t is frozenset:
        return [_TAG_OF[t], [_out(v, d, budget) for v in obj]]
    if t is dict or t is collections.OrderedDict or t is collections.Counter:
        return [_TAG_OF[t], [_out(x, d, budget) for kv in obj.items() for x in kv]]
    if t is collections.defaultdict:
        factory = obj.default_factory
        name: Any = getattr(factory, "__name__", None) if factory is not None else ""
        if name != "" and _FACTORIES.get(name) is not factory:
            raise NotPortable("a defaultdict of a factory that is not a builtin type")
        return ["D", name, [_out(x, d, budget) for kv in obj.items() for x in kv]]
    if t is collections.deque:
        return ["q", obj.maxlen, [_out(v, d, budget) for v in obj]]
    if t is complex:
        return ["c", obj.real, obj.imag]
    if t is dt.datetime or t is dt.date or t is dt.time:
        return [_TAG_OF[t], obj.isoformat()]
    if t is dt.timedelta:
        return ["td", obj.days, obj.seconds, obj.microseconds]
    raise NotPortable(f"cannot carry a {t.__name__} in state")


_TAG_OF: Final[dict[type, str]] = {
    list: "l",
    tuple: "t",
    set: "s",
    frozenset: "f",
    dict: "d",
    collections.OrderedDict: "o",
    collections.Counter: "C",
    dt.datetime: "dtm",
    dt.date: "dat",
    dt.time: "tim",
}


def _in(obj: Any, depth: int, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise NotPortable(f"state holds more than {MAX_CARRIED_NODES:,} values")
    if depth > MAX_STATE_DEPTH + 1:
        raise NotPortable("state nested too deep")
    if type(obj) is not list:
        if type(obj) is dict:  # `dump_state` writes no bare map
            raise NotPortable("a bare map")
        return obj
    tag, d = obj[0], depth + 1
    if tag in ("l", "t", "s", "f"):
        items = [_in(v, d, budget) for v in obj[1]]
        return (
            items
            if tag == "l"
            else tuple(items)
            if tag == "t"
            else set(items)
            if tag == "s"
            else frozenset(items)
        )
    if tag in ("d", "o", "C", "D"):
        flat = obj[1] if tag != "D" else obj[2]
        pairs = [
            (_in(flat[i], d, budget), _in(flat[i + 1], d, budget)) for i in range(0, len(flat), 2)
        ]
        if tag == "D":
            return collections.defaultdict(_FACTORIES[obj[1]] if obj[1] else None, pairs)
        return {"d": dict, "o": collections.OrderedDict, "C": collections.Counter}[tag](dict(pairs))
    if tag == "q":
        return collections.deque((_in(v, d, budget) for v in obj[2]), obj[1])
    if tag == "I":
        return int(obj[1])
    if tag == "c":
        return complex(obj[1], obj[2])
    if tag == "td":
        return dt.timedelta(obj[1], obj[2], obj[3])
    if tag == "dtm":
        return dt.datetime.fromisoformat(obj[1])
    if tag == "dat":
        return dt.date.fromisoformat(obj[1])
    if tag == "tim":
        return dt.time.fromisoformat(obj[1])
    raise NotPortable(f"unknown tag {tag!r}")
