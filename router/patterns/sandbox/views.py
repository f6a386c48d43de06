"""The objects a pattern sees besides the event's values: the event itself, the group's
subscribers and the host router. All read-only; a script changes an event by deriving a new
one (`event.copy(values=...)`, `event.with_values(X=1)`, `new_event(values)`).

Copy-on-write, concretely: the router's `Event` is shared by every pattern and every
subscriber, so a script never gets its containers. `private_values` copies the lists and
maps among an event's values (scalars are immutable and shared) once per script run; the
bare names, `event["X"]`, `event.X` and `event.values` all read that private copy, so a
script may sort or append to what it read without anybody else seeing it. Expressions get
the router's own objects (no copy: they are the hot path), which is why `compiler.py` refuses
mutating methods in expressions.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from aa.mesh import Event

from .guards import text_size
from .limits import HostFacts

__all__ = [
    "EventView",
    "SubscriberView",
    "RouterView",
    "private_values",
    "private_copy",
    "event_size",
]

_CONTAINERS = (list, dict)
_KEEP: Any = object()
_READ_ONLY = "events are read-only in patterns; derive one with event.copy(values=...)"


def private_copy(value: Any) -> Any:
    """A deep copy of a value-model value (lists and maps copied, scalars shared)."""
    t = type(value)
    if t is list or t is tuple:
        return [private_copy(v) if type(v) in _CONTAINER_TYPES else v for v in value]
    if t is dict:
        return {k: private_copy(v) if type(v) in _CONTAINER_TYPES else v for k, v in value.items()}
    return value


_CONTAINER_TYPES = frozenset({list, dict, tuple})


def private_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """The values of an event as a script may own them."""
    for v in values.values():
        if type(v) in _CONTAINER_TYPES:
            return {k: private_copy(v) for k, v in values.items()}
    return dict(values)


class EventView:
    """An event as a pattern sees it: `event.values`, `.type`, `.meta`, `.id`; the values
    also by `event["Temperature"]`, `event.get("Temperature", 0)` and `event.Temperature`
    (when no attribute of the view has that name)."""

    __slots__ = ("_event", "_values", "_meta", "_check")
    _event: Event
    _values: Mapping[str, Any]
    _meta: Mapping[str, Any] | None
    _check: Callable[[Event], None] | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # `type(event)` hands a pattern this class: it must not be able to build a view of
        # an event it chose (or of no event), so only `_make` builds them.
        raise TypeError(
            "events cannot be built in patterns; derive one with event.copy(...) or new_event(...)"
        )

    @classmethod
    def _make(
        cls, event: Event, values: Mapping[str, Any], check: Callable[[Event], None] | None = None
    ) -> EventView:
        view = object.__new__(cls)
        object.__setattr__(view, "_event", event)
        object.__setattr__(view, "_values", values)
        object.__setattr__(view, "_meta", None)
        #: Called with each derived event (size check); None in expressions (no deriving).
        object.__setattr__(view, "_check", check)
        return view

    @property
    def values(self) -> Mapping[str, Any]:
        return MappingProxyType(self._values)

    @property
    def type(self) -> str | None:
        return self._event.type

    @property
    def id(self) -> str | None:
        return self._event.id

    @property
    def meta(self) -> Mapping[str, Any]:
        meta = self._meta
        if meta is None:
            meta = self._event.meta if self._check is None else private_values(self._event.meta)
            object.__setattr__(self, "_meta", meta)
        return MappingProxyType(meta)

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def get(self, name: str, default: Any = None) -> Any:
        return self._values.get(name, default)

    def keys(self) -> Any:
        return self._values.keys()

    def items(self) -> Any:
        return self._values.items()

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"event has no value {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(_READ_ONLY)

    def __delattr__(self, name: str) -> None:
        raise AttributeError(_READ_ONLY)

    def __repr__(self) -> str:
        return f"<event type={self.type!r} with {len(self._values)} values>"

    # -- deriving (scripts only) -----------------------------------------------------------

    def copy(
        self,
        values: Mapping[str, Any] | None = None,
        type: Any = _KEEP,
        meta: Mapping[str, Any] | None = None,
    ) -> EventView:
        """A new event: these values (default: the same), type and extra meta."""
        new_values = dict(self._values if values is None else values)
        new_type = self._event.type if type is _KEEP else type
        return self._derive(new_values, new_type, meta)

    def with_values(self, **changes: Any) -> EventView:
        """A new event with *changes* merged into the values: `event.with_values(Alarm=True)`."""
        return self._derive({**self._values, **changes}, self._event.type, None)

    def _derive(
        self, values: dict[str, Any], type: Any, meta: Mapping[str, Any] | None
    ) -> EventView:
        check = self._check
        if check is None:
            raise TypeError("expressions cannot derive events")
        base = dict(self._event.meta)
        if meta:
            base.update(meta)
        event = Event(
            values=private_values(values), type=type, meta=base
        )  # validates: InvalidValue
        check(event)
        return EventView._make(event, event.values, check)


class SubscriberView:
    """One subscriber of this pattern group, as a script sees it: `.id` and `.params`."""

    __slots__ = ("_key", "id", "params")
    _key: Hashable
    id: str
    params: Mapping[str, Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("subscribers cannot be built in patterns; use `subscribers`")

    @classmethod
    def _make(cls, key: Hashable, params: Mapping[str, Any]) -> SubscriberView:
        view = object.__new__(cls)
        object.__setattr__(view, "_key", key)
        object.__setattr__(view, "id", str(key))
        object.__setattr__(view, "params", MappingProxyType(private_values(params)))
        return view

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("subscribers are read-only in patterns")

    def __repr__(self) -> str:
        return f"<subscriber {self.id!r}>"


class RouterView:
    """The host router, read-only: `.id`, `.name`, `.time` (aware UTC now), `.peer_count`."""

    __slots__ = ("_host",)
    _host: HostFacts

    def __init__(self, host: HostFacts) -> None:
        object.__setattr__(self, "_host", host)

    @property
    def id(self) -> str:
        return self._host.router_id

    @property
    def name(self) -> str:
        return self._host.router_name

    @property
    def time(self) -> Any:
        return self._host.clock()

    @property
    def peer_count(self) -> int:
        return self._host.peer_count()

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("the router is read-only in patterns")

    def __repr__(self) -> str:
        return f"<router {self.name!r}>"


def event_size(event: Event, cap: int) -> int:
    """Estimated serialised size of an event's values and type, in bytes (stops past *cap*)."""
    return text_size(event.values, cap) + len(event.type or "")
