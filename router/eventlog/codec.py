"""Event values as text for the event log, losslessly (pure: no I/O).

The event log is read by Spark, which has no type for "a value that is an int in one event
and a string in the next". So each value is written as text in the `values` map column,
with its type in the parallel `values_types` map column; a job casts by type:

==================  ==================================  ===================================
values_types        values (text)                       Spark
==================  ==================================  ===================================
``null``            (a null map value)                  —
``bool``            ``true`` / ``false``                ``.cast("boolean")``
``int``             decimal digits, e.g. ``101``        ``.cast("long")`` (``decimal(20)``
                                                        above 2**63)
``float``           shortest round-trip text, e.g.      ``.cast("double")``
                    ``21.5``, ``1e-07``; ``NaN``,
                    ``Infinity``, ``-Infinity``
``str``             the string itself                   as is
``bytes``           base64 (standard alphabet)          ``unbase64(...)``
``datetime``        ISO 8601 with offset, UTC:          ``to_timestamp(...)``
                    ``2024-05-01T12:00:00.250000+00:00``
``naive-datetime``  ISO 8601 without offset             ``to_timestamp(...)`` (no zone)
``list``, ``map``   typed JSON (below)                  ``from_json(..., schema)``
==================  ==================================  ===================================

Typed JSON, for lists and maps (and the whole of ``meta_json``): plain JSON, except that the
values JSON cannot tell apart are tagged as one-key objects — ``{"$bytes": "<base64>"}``,
``{"$datetime": "<ISO>"}``, ``{"$naive-datetime": "<ISO>"}``, ``{"$float": "NaN"}`` (also
``Infinity``, ``-Infinity``); floats always carry a ``.`` or an exponent, so ``1.0`` stays a
float. A map key that starts with ``$`` is written with one more ``$`` in front (``$x`` →
``$$x``), so a tag is never confused with a user's key. `decode_value` is the inverse.
"""

from __future__ import annotations

import base64
import json
import math
from datetime import datetime
from typing import Any, Final

from aa.mesh import Value

__all__ = ["encode_value", "decode_value", "encode_json", "decode_json", "TYPE_NAMES"]

#: Every name `values_types` can hold.
TYPE_NAMES: Final = frozenset(
    {"null", "bool", "int", "float", "str", "bytes", "datetime", "naive-datetime", "list", "map"}
)

_NONFINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}
_FROM_TEXT = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _float_text(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    return _NONFINITE.get(v) or repr(v)


def _tagged(v: Any) -> Any:
    t = type(v)
    if t is str or t is int or t is bool or v is None:
        return v
    if t is float:
        return v if math.isfinite(v) else {"$float": _float_text(v)}
    if t is bytes:
        return {"$bytes": base64.b64encode(v).decode("ascii")}
    if isinstance(v, datetime):
        return {("$datetime" if v.tzinfo is not None else "$naive-datetime"): v.isoformat()}
    if t is dict:
        return {("$" + k if k.startswith("$") else k): _tagged(x) for k, x in v.items()}
    if t is list or t is tuple:
        return [_tagged(x) for x in v]
    # Subclasses of the value types (IntEnum, a str subclass) are written as their base.
    if isinstance(v, bool):
        return bool(v)
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return _tagged(float(v))
    if isinstance(v, str):
        return str(v)
    if isinstance(v, bytes):
        return _tagged(bytes(v))
    raise TypeError(f"cannot encode {t.__name__}")


def _untagged(v: Any) -> Value:
    if type(v) is dict:
        if len(v) == 1:
            ((k, x),) = v.items()
            if k.startswith("$") and not k.startswith("$$"):
                if k == "$bytes":
                    return base64.b64decode(x)
                if k in ("$datetime", "$naive-datetime"):
                    return datetime.fromisoformat(x)
                if k == "$float":
                    return _FROM_TEXT[x]
                raise ValueError(f"unknown tag {k!r} in typed JSON")
        return {(k[1:] if k.startswith("$$") else k): _untagged(x) for k, x in v.items()}
    if type(v) is list:
        return [_untagged(x) for x in v]
    scalar: Value = v  # what json.loads makes of the rest: a str, number, bool or None
    return scalar


_PLAIN: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def encode_json(value: Value) -> str:
    """*value* as typed JSON text (see the module docstring)."""
    # Fast path, for the usual value with nothing to tag: plain JSON refuses bytes,
    # datetimes (TypeError) and non-finite floats (ValueError), and any '"$' in the text
    # means some key (or string) starts with "$" and may need escaping. Each sends us to
    # the full walk, which is always right; the fast path is only ever right or refused.
    try:
        text = _PLAIN.encode(value)
    except (TypeError, ValueError):
        pass
    else:
        if '"$' not in text:
            return text
    return _PLAIN.encode(_tagged(value))


def decode_json(text: str) -> Value:
    """The inverse of `encode_json`."""
    return _untagged(json.loads(text))


def encode_value(value: Value) -> tuple[str | None, str]:
    """(text, type name) of one top-level value, for the `values` and `values_types` maps."""
    t = type(value)
    if value is None:
        return None, "null"
    if type(value) is str:
        return value, "str"
    if t is bool:
        return ("true" if value else "false"), "bool"
    if type(value) is float:
        return _float_text(value), "float"
    if type(value) is bytes:
        return base64.b64encode(value).decode("ascii"), "bytes"
    if isinstance(value, datetime):
        return value.isoformat(), ("datetime" if value.tzinfo is not None else "naive-datetime")
    if t is dict:
        return encode_json(value), "map"
    if t is list or isinstance(value, tuple):
        return encode_json(value), "list"
    if isinstance(value, bool):
        return ("true" if value else "false"), "bool"
    if isinstance(value, int):
        return str(int(value)), "int"
    if isinstance(value, float):
        return _float_text(float(value)), "float"
    if isinstance(value, str):
        return str(value), "str"
    if isinstance(value, bytes):
        return base64.b64encode(bytes(value)).decode("ascii"), "bytes"
    raise TypeError(f"cannot encode {t.__name__}")


def decode_value(text: str | None, type_name: str) -> Value:
    """The inverse of `encode_value`. Raises `ValueError` for an unknown type name."""
    if type_name == "null":
        return None
    if text is None:
        raise ValueError(f"a {type_name} value needs text")
    if type_name == "str":
        return text
    if type_name == "int":
        return int(text)
    if type_name == "float":
        return _FROM_TEXT.get(text) or float(text)
    if type_name == "bool":
        return text == "true"
    if type_name == "bytes":
        return base64.b64decode(text)
    if type_name in ("datetime", "naive-datetime"):
        return datetime.fromisoformat(text)
    if type_name in ("list", "map"):
        return decode_json(text)
    raise ValueError(f"unknown value type {type_name!r}")
