"""The event value model (pure: no I/O).

A value is None, bool, int (signed or unsigned 64-bit, the range msgpack carries), float,
str, bytes, datetime, or a list or str-keyed dict of values. Type is kept end to end: an int
stays an int, bytes stay bytes, a naive datetime stays naive. Aware datetimes travel as
instants and come back in UTC (same instant, offset normalised).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Mapping, TypeAlias, Union

from .errors import InvalidValue

__all__ = ["Value", "Values", "check_value", "check_values", "MAX_NESTING"]

Value: TypeAlias = Union[
    None, bool, int, float, str, bytes, datetime, list["Value"], dict[str, "Value"]
]
Values: TypeAlias = dict[str, Value]

#: Deepest nesting of lists/maps inside one value. Deeper structures are refused: they only
#: serve to exhaust the decoder's and the pattern engine's stack.
MAX_NESTING = 32

_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1
_SCALARS = (str, int, float, bool, bytes, datetime, type(None))


def check_value(value: Any, where: str = "value", depth: int = 0) -> None:
    """Raise `InvalidValue` unless *value* belongs to the value model."""
    cls = type(value)
    if cls is int:
        if not _INT_MIN <= value <= _INT_MAX:
            raise InvalidValue(f"{where}: int {value} is outside the 64-bit range")
        return
    if cls in (str, float, bool, bytes, datetime, type(None)):
        return
    if depth >= MAX_NESTING:
        raise InvalidValue(f"{where}: nested deeper than {MAX_NESTING} levels")
    if cls is list or cls is tuple:
        for i, item in enumerate(value):
            check_value(item, f"{where}[{i}]", depth + 1)
        return
    if cls is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise InvalidValue(f"{where}: map keys must be str, not {type(key).__name__}")
            check_value(item, f"{where}.{key}", depth + 1)
        return
    if isinstance(value, _SCALARS):  # subclasses (IntEnum, datetime subclasses) are fine
        if isinstance(value, int) and not isinstance(value, bool):
            check_value(int(value), where, depth)
        return
    raise InvalidValue(
        f"{where}: {cls.__name__} is not an event value "
        "(use None, bool, int, float, str, bytes, datetime, list or dict)"
    )


def check_values(values: Mapping[str, Any], where: str = "values") -> None:
    """Raise `InvalidValue` unless *values* is a str-keyed map of event values."""
    if not isinstance(values, Mapping):
        raise InvalidValue(f"{where} must be a map of names to values, not {type(values).__name__}")
    for key, item in values.items():
        if type(key) is not str:
            raise InvalidValue(f"{where}: names must be str, not {type(key).__name__}")
        cls = type(item)
        if cls is str or cls is float or cls is bool or item is None:
            continue  # the common scalars, checked without a call
        check_value(item, f"{where}.{key}", 1)
