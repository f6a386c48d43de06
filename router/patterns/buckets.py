"""The data of the pattern engine: a pattern's compiled instance, its buckets of subscribers
with equal params (and a script's state), each subscriber's membership, and a standalone
matcher; plus the hashable form of params. `engine.py` holds the logic."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Hashable

from aa.mesh import Event

from .budget import SandboxStop

if TYPE_CHECKING:
    from .engine import PatternEngine, Program

__all__ = ["Member", "Instance", "Bucket", "Matcher", "freeze", "copy_state", "first", "nothing"]


class Member:
    __slots__ = ("key", "params", "bucket", "seq")

    def __init__(self, key: Hashable, params: dict[str, Any], bucket: "Bucket", seq: int) -> None:
        self.key = key
        self.params = params
        self.bucket = bucket
        self.seq = seq


class Instance:
    __slots__ = ("spec_key", "program", "buckets", "remote")

    def __init__(self, spec_key: tuple[str, str, str], program: "Program", remote: bool = False) -> None:
        self.spec_key = spec_key
        self.program = program
        self.buckets: dict[Any, Bucket] = {}
        #: Matched in a worker process (`workers`): `match` skips it here.
        self.remote = remote


class Bucket:
    """The subscribers of one instance with equal params (and, for scripts, their state)."""

    __slots__ = ("instance", "params", "params_key", "members", "state", "context", "state_countdown", "stamp", "result", "run", "placed")

    def __init__(self, instance: Instance, params: dict[str, Any], params_key: Any, state: dict[str, Any] | None = None) -> None:
        self.instance = instance
        self.params = params
        self.params_key = params_key
        #: Subscriber key → subscription, in joining order.
        self.members: dict[Hashable, Member] = {}
        self.state: dict[str, Any] = {} if state is None else state
        self.context: Any = None
        self.state_countdown = 1
        self.stamp = 0
        self.result: Any = None
        self.run = nothing if instance.remote else instance.program.run
        #: The bucket's entries in the predicate index (`index.py`), or None.
        self.placed: Any = None


class Matcher:
    """A standalone predicate over events for one pattern (`PatternEngine.matcher`)."""

    __slots__ = ("_engine", "_bucket", "spec_key", "stopped", "__weakref__")

    def __init__(self, engine: "PatternEngine", bucket: Bucket) -> None:
        self._engine = engine
        self._bucket = bucket
        #: (kernel, format, source): equal for equal patterns.
        self.spec_key = bucket.instance.spec_key
        #: Why the sandbox stopped the pattern (it then accepts nothing), or None.
        self.stopped: str | None = None

    @property
    def bucket(self) -> "Bucket":
        """Its own params bucket (detached from the engine's subscribers)."""
        return self._bucket

    def __call__(self, event: Event) -> bool:
        if self.stopped is not None:
            return False
        bucket = self._bucket
        try:
            return bool(bucket.run(bucket, event))
        except SandboxStop as stop:
            self._engine.sandbox.budget.violation = None
            self.stopped = stop.message
            return False

    def __repr__(self) -> str:
        return f"<Matcher {self.spec_key[0]}/{self.spec_key[1]} {self.spec_key[2][:40]!r}>"


def first(hit: tuple[int, Hashable, Event]) -> int:
    return hit[0]


def freeze(params: dict[str, Any]) -> tuple[Any, ...]:
    """A hashable form of params that tells 1, 1.0 and True apart: one flat tuple (name,
    type, value, ...) — a million parametric subscribers keep one each."""
    out: list[Any] = []
    for k in sorted(params):
        v = params[k]
        t = type(v)
        out += (k, "c", freeze_value(v)) if t is dict or t is list or t is tuple else (k, t.__name__, v)
    return tuple(out)


def freeze_value(value: Any) -> Any:
    t = type(value)
    if t is dict:
        return ("map", tuple(sorted((k, freeze_value(v)) for k, v in value.items())))
    if t is list or t is tuple:
        return ("list", tuple(freeze_value(v) for v in value))
    return (t.__name__, value)


def copy_state(state: dict[str, Any]) -> dict[str, Any]:
    try:
        return copy.deepcopy(state)
    except Exception:  # e.g. a generator expression kept in state
        return dict(state)




def nothing(bucket: Bucket, event: Event) -> None:
    return None
