"""The data of the pattern engine: a pattern's compiled instance, its buckets of subscribers
with equal params (and a script's state), each subscriber's membership, and a standalone
matcher; plus the hashable form of params. `engine.py` holds the logic."""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Hashable, Iterator
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from aa.mesh import Event

from ..sandbox import SandboxStop

if TYPE_CHECKING:
    from ..engine import PatternEngine, Program

__all__ = [
    "Member",
    "Instance",
    "Bucket",
    "Matcher",
    "freeze",
    "copy_state",
    "first",
    "nothing",
    "add_member",
    "drop_member",
    "add_bucket",
    "drop_bucket",
    "rekey_bucket",
    "shared_strings",
]


class _Alone:
    """A one-entry, read-only mapping `{key: self}`.

    Memory (at most 1 KB per subscription at a million subscriptions): a dict of one entry costs
    224 bytes, and most buckets of a million narrow subscriptions hold one member, most
    instances one bucket. So a bucket's `members` is the `Member` itself while it is alone,
    and an instance's `buckets` the `Bucket` itself; a dict once there are two. Reading works
    as on a dict (`len`, `in`, iteration, `keys/values/items/get`, `[key]`); changes go
    through `add_member`/`drop_member` and `add_bucket`/`drop_bucket`, which switch forms.
    """

    __slots__ = ()

    def _key(self) -> Any:
        raise NotImplementedError

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Iterator[Any]:
        return iter((self._key(),))

    def __contains__(self, key: object) -> bool:
        return bool(key == self._key())

    def __getitem__(self, key: Any) -> Any:
        if key == self._key():
            return self
        raise KeyError(key)

    def get(self, key: Any, default: Any = None) -> Any:
        return self if key == self._key() else default

    def keys(self) -> tuple[Any, ...]:
        return (self._key(),)

    def values(self) -> tuple[Any, ...]:
        return (self,)

    def items(self) -> tuple[tuple[Any, Any], ...]:
        return ((self._key(), self),)


class Member(_Alone):
    __slots__ = ("key", "params", "bucket", "seq")

    bucket: Bucket

    def __init__(
        self, key: Hashable, params: dict[str, Any], bucket: Bucket | None, seq: int
    ) -> None:
        self.key = key
        self.params = params
        if bucket is not None:  # else the engine sets it as the member joins one
            self.bucket = bucket
        self.seq = seq

    def _key(self) -> Any:
        return self.key


#: A bucket's members: the Member alone, or a dict (see `_Alone`).
Members = Member | dict[Hashable, Member]


class Instance:
    __slots__ = ("spec_key", "program", "buckets", "remote", "run", "receives", "cpu_ns")

    def __init__(
        self,
        spec_key: tuple[Any, ...],
        program: Program,
        remote: bool = False,
        receives: Callable[[str | None], bool] | None = None,
    ) -> None:
        self.spec_key = spec_key
        self.program = program
        #: The event types pattern code of this instance may see (its subscribers' scope,
        #: `scope.py`); None: any. Events of other types never reach it.
        self.receives = receives
        #: params key → bucket: the Bucket alone, or a dict (see `_Alone`).
        self.buckets: Bucket | dict[Any, Bucket] = {}
        #: Matched in a worker process (`workers`): `match` skips it here.
        self.remote = remote
        #: The program's `run`, bound once, that every bucket shares (a predicate program's
        #: `shared_run` is one function for all instances: a bound method costs 64 bytes).
        self.run: Any = nothing if remote else getattr(program, "shared_run", None) or program.run
        #: CPU time its evaluations in this process took, in ns (sampled: `engine.match`).
        self.cpu_ns = 0


class Bucket(_Alone):
    """The subscribers of one instance with equal params (and, for scripts, their state)."""

    __slots__ = (
        "instance",
        "params",
        "params_key",
        "members",
        "state",
        "context",
        "state_countdown",
        "stamp",
        "run",
        "placed",
    )

    def __init__(
        self,
        instance: Instance,
        params: dict[str, Any],
        params_key: Any,
        state: dict[str, Any] | None = None,
    ) -> None:
        self.instance = instance
        self.params = params
        self.params_key = params_key
        #: Subscriber key → subscription, in joining order (the Member alone: `_Alone`).
        self.members: Members = {}
        #: A script's state; expressions have none (an empty dict costs 64 bytes each).
        self.state: dict[str, Any] = (
            state if state is not None else {} if instance.program.kind == "script" else _NO_STATE
        )
        self.context: Any = None
        self.state_countdown = 1
        self.stamp = 0
        self.run = instance.run
        #: The bucket's entries in the predicate index (`index.py`), or None.
        self.placed: Any = None

    def _key(self) -> Any:
        return self.params_key


_NO_STATE: dict[str, Any] = MappingProxyType({})  # type: ignore[assignment]  # never written


def add_member(bucket: Bucket, sub: Member) -> None:
    members = bucket.members
    if isinstance(members, Member):
        bucket.members = {members.key: members, sub.key: sub}
    elif members:
        members[sub.key] = sub
    else:
        bucket.members = sub


def drop_member(bucket: Bucket, key: Hashable) -> None:
    """Remove *key* from *bucket*'s members (KeyError if absent)."""
    members = bucket.members
    if isinstance(members, Member):
        if members.key != key:
            raise KeyError(key)
        bucket.members = {}
        return
    del members[key]
    if len(members) == 1:
        bucket.members = next(iter(members.values()))


def add_bucket(instance: Instance, bucket: Bucket) -> None:
    buckets = instance.buckets
    if isinstance(buckets, Bucket):
        instance.buckets = {buckets.params_key: buckets, bucket.params_key: bucket}
    elif buckets:
        buckets[bucket.params_key] = bucket
    else:
        instance.buckets = bucket


def rekey_bucket(
    bucket: Bucket, params: dict[str, Any], params_key: Any, placed: bool = False
) -> None:
    """Give *bucket* new *params* (and their *params_key*) and file it in its instance under
    them (*placed*: it was filed under the old key, which goes)."""
    if placed:
        drop_bucket(bucket.instance, bucket.params_key)
    bucket.params, bucket.params_key = params, params_key
    add_bucket(bucket.instance, bucket)


def drop_bucket(instance: Instance, params_key: Any) -> None:
    """Remove the bucket of *params_key* from *instance* (KeyError if absent)."""
    buckets = instance.buckets
    if isinstance(buckets, Bucket):
        if buckets.params_key != params_key:
            raise KeyError(params_key)
        instance.buckets = {}
        return
    del buckets[params_key]
    if len(buckets) == 1:
        instance.buckets = next(iter(buckets.values()))


class Matcher:
    """A standalone predicate over events for one pattern (`PatternEngine.matcher`)."""

    __slots__ = ("_engine", "_bucket", "spec_key", "stopped", "__weakref__")

    def __init__(self, engine: PatternEngine, bucket: Bucket) -> None:
        self._engine = engine
        self._bucket = bucket
        #: (kernel, format, source): equal for equal patterns.
        self.spec_key = bucket.instance.spec_key
        #: Why the sandbox stopped the pattern (it then accepts nothing), or None.
        self.stopped: str | None = None

    @property
    def bucket(self) -> Bucket:
        """Its own params bucket (detached from the engine's subscribers)."""
        return self._bucket

    @property
    def engine(self) -> PatternEngine:
        """The engine that compiled it (a `PatternSet` over it needs that engine)."""
        return self._engine

    @property
    def indexable(self) -> bool:
        """True for a predicate-tier pattern (a `PatternSet` finds it through its index)."""
        return getattr(self._bucket.instance.program, "tier", None) == "predicate"

    def __call__(self, event: Event) -> bool:
        if self.stopped is not None:
            return False
        bucket = self._bucket
        receives = bucket.instance.receives
        if receives is not None and not receives(event.type):
            return False  # outside its owner's scope: the pattern never sees it
        try:
            return bool(bucket.run(bucket, event))
        except SandboxStop as stop:
            self._engine.sandbox.budget.violation = None
            self.stopped = stop.message
            return False

    def close(self) -> None:
        """Let it go: its member refers back to it (scripts forward to members), a cycle
        that only the collector would free, and a router's collector runs rarely; a closed
        matcher accepts nothing from a script (expressions still answer)."""
        self._bucket.members = {}

    def __repr__(self) -> str:
        return f"<Matcher {self.spec_key[0]}/{self.spec_key[1]} {self.spec_key[2][:40]!r}>"


def first(hit: tuple[int, Hashable, Event]) -> int:
    return hit[0]


#: Longest param string shared between subscribers (`sys.intern`): symbols, device ids.
MAX_SHARED_PARAM_STRING = 64


def shared_strings(params: dict[str, Any]) -> dict[str, Any]:
    """*params* with its short strings interned: a million traders of 200 symbols keep 200
    strings, not a million (~50 bytes each). Interned strings go with their last user."""
    for k, v in params.items():
        if type(v) is str and len(v) <= MAX_SHARED_PARAM_STRING:
            params[k] = sys.intern(v)
    return params


def freeze(params: dict[str, Any]) -> tuple[Any, ...]:
    """A hashable form of params that tells 1, 1.0 and True apart: one flat tuple (name,
    type, value, ...) — a million parametric subscribers keep one each. The type is the
    class itself, compared by identity: `type.__name__` makes a new string per call for a
    built-in type, ~100 bytes a bucket kept, and a third of the time of this function."""
    out: list[Any] = []
    for k in sorted(params):
        v = params[k]
        t = type(v)
        out += (k, "c", freeze_value(v)) if t is dict or t is list or t is tuple else (k, t, v)
    return tuple(out)


def freeze_value(value: Any) -> Any:
    t = type(value)
    if t is dict:
        return ("map", tuple(sorted((k, freeze_value(v)) for k, v in value.items())))
    if t is list or t is tuple:
        return ("list", tuple(freeze_value(v) for v in value))
    return (t, value)


def copy_state(state: dict[str, Any]) -> dict[str, Any] | None:
    if not state:
        return None  # nothing to copy (an expression's shared `_NO_STATE`, an empty state)
    try:
        return copy.deepcopy(state)
    except Exception:  # e.g. a generator expression kept in state
        return dict(state)


def nothing(bucket: Bucket, event: Event) -> None:
    return None
