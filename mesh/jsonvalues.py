"""Event values in JSON, with their types kept (pure: no I/O).

JSON has no bytes, no datetime, and nothing to tell them from strings, so they are tagged:
``{"$bytes": "<base64>"}``, ``{"$datetime": "<ISO 8601>"}``. A map of the value model whose
only key starts with ``$`` is wrapped as ``{"$map": {...}}`` so it never reads as a tag.
Ints and floats need nothing: ``1`` and ``1.0`` stay apart through `json`.

>>> from datetime import datetime, timezone
>>> v = {"n": 3, "x": 2.0, "b": b"hi", "t": datetime(2026, 1, 1, tzinfo=timezone.utc)}
>>> from_json(to_json(v)) == v
True
"""

from __future__ import annotations

import base64
import binascii
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .errors import InvalidValue

if TYPE_CHECKING:
    from .event import Event

__all__ = ["to_json", "from_json", "event_to_json", "event_from_json"]


def to_json(value: Any) -> Any:
    """A JSON-ready form of *value* (see the module docstring)."""
    cls = type(value)
    if cls in (str, int, float, bool) or value is None:
        return value
    if cls is dict:
        out = {k: to_json(v) for k, v in value.items()}
        if len(out) == 1 and next(iter(out)).startswith("$"):
            return {"$map": out}
        return out
    if cls in (list, tuple):
        return [to_json(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(value).decode()}
    if isinstance(value, datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, (int, float, str)):
        return value
    raise InvalidValue(f"{cls.__name__} is not an event value")


def from_json(value: Any) -> Any:
    """The inverse of `to_json`; raises `InvalidValue` for a malformed tag."""
    cls = type(value)
    if cls is dict:
        if len(value) == 1:
            ((key, inner),) = value.items()
            if key == "$bytes":
                if type(inner) is not str:
                    raise InvalidValue("$bytes takes a base64 string")
                try:
                    return base64.b64decode(inner, validate=True)
                except (binascii.Error, ValueError):
                    raise InvalidValue("$bytes is not valid base64") from None
            if key == "$datetime":
                if type(inner) is not str:
                    raise InvalidValue("$datetime takes an ISO 8601 string")
                try:
                    return datetime.fromisoformat(inner)
                except ValueError:
                    raise InvalidValue(f"$datetime {inner!r} is not ISO 8601") from None
            if key == "$map":
                if type(inner) is not dict:
                    raise InvalidValue("$map takes an object")
                return {k: from_json(v) for k, v in inner.items()}
            if key.startswith("$"):
                raise InvalidValue(f"unknown tag {key!r} (known: $bytes, $datetime, $map)")
        return {k: from_json(v) for k, v in value.items()}
    if cls is list:
        return [from_json(v) for v in value]
    return value


def event_to_json(event: Any) -> dict[str, Any]:
    """`{"id", "type", "values", "meta"}` of an `Event`, JSON-ready."""
    return {
        "id": event.id,
        "type": event.type,
        "values": to_json(event.values),
        "meta": to_json(event.meta),
    }


def event_from_json(data: Any) -> Event:
    """An `Event` from `event_to_json`'s form (checked)."""
    from .event import Event

    if type(data) is not dict:
        raise InvalidValue("an event must be a JSON object")
    return Event(
        values=from_json(data.get("values") or {}),
        type=data.get("type"),
        meta=from_json(data.get("meta") or {}),
        id=data.get("id"),
    )
