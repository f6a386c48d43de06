"""The event value model (pure: no I/O).

A value is None, bool, int (signed or unsigned 64-bit, the range msgpack carries), float,
str, bytes, datetime, or a list or str-keyed dict of values. Type is kept end to end: an int
stays an int, bytes stay bytes, a naive datetime stays naive. Aware datetimes travel as
instants and come back in UTC (same instant, offset normalised).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from datetime import datetime
from typing import Any, Literal, NoReturn, TypeAlias, overload

from .errors import InvalidValue

__all__ = ["Value", "Values", "check_value", "check_values", "MAX_NESTING"]

Value: TypeAlias = (
    None | bool | int | float | str | bytes | datetime | list["Value"] | dict[str, "Value"]
)
Values: TypeAlias = dict[str, Value]

#: Deepest nesting of lists/maps inside one value. Deeper structures are refused: they only
#: serve to exhaust the decoder's and the pattern engine's stack.
MAX_NESTING = 32

_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1
_SCALARS = (str, int, float, bool, bytes, datetime, type(None))


def check_value(value: Any, where: str = "value", depth: int = 0) -> None:
    """Raise `InvalidValue` unless *value* belongs to the value model."""
    if not _valid(value, depth):
        _explain(value, where, depth)


def check_values(values: Mapping[str, Any], where: str = "values") -> None:
    """Raise `InvalidValue` unless *values* is a str-keyed map of event values."""
    if type(values) is not dict:
        if not isinstance(values, Mapping):
            raise InvalidValue(
                f"{where} must be a map of names to values, not {type(values).__name__}"
            )
        values = dict(values)
    if not _valid_map(values, 0):
        _explain(values, where, 0)


# The checks run on every event a router receives, so the path that finds nothing wrong
# allocates nothing and calls as little as it can; only when something is wrong does
# `_explain` walk the value again to say where.


def _valid(value: Any, depth: int) -> bool:
    cls = type(value)
    if (
        cls is str
        or cls is float
        or cls is bool
        or value is None
        or cls is bytes
        or cls is datetime
    ):
        return True
    if cls is int:
        fits: bool = _INT_MIN <= value <= _INT_MAX
        return fits
    if depth >= MAX_NESTING:
        return False
    if cls is dict:
        return _valid_map(value, depth + 1)
    if cls is list or cls is tuple:
        return all(_valid(item, depth + 1) for item in value)
    if isinstance(value, _SCALARS):  # subclasses (IntEnum, datetime subclasses)
        return (
            not isinstance(value, int) or isinstance(value, bool) or _INT_MIN <= value <= _INT_MAX
        )
    return False


@overload
def _valid_map(values: dict[Any, Any], depth: int, flat: Literal[False] = False) -> bool: ...


@overload
def _valid_map(values: dict[Any, Any], depth: int, flat: bool) -> bool | None: ...


def _valid_map(values: dict[Any, Any], depth: int, flat: bool = False) -> bool | None:
    """Whether *values* is in the model; with *flat*, None (falsy) at its first list or map,
    which `_check_steps` then checks a step at a time."""
    for key, item in values.items():
        if type(key) is not str:
            return False
        cls = type(item)
        if cls is str or cls is float or cls is bool or item is None:
            continue
        if cls is int:
            if not _INT_MIN <= item <= _INT_MAX:
                return False
            continue
        if flat and (cls is dict or cls is list or cls is tuple):
            return None
        if not _valid(item, depth):
            return False
    return True


def _check_steps(values: dict[Any, Any], where: str, per_step: int) -> Generator[None, None, None]:
    """`check_values(values, where)` by a walk that yields after every *per_step* items: one
    event of a large frame may hold ~128,000 nested values (~30 ms of checks in one go).
    `InvalidValue` names what is wrong, found without a second walk of the whole."""
    stack: list[tuple[Any, int]] = []
    for key, item in values.items():
        if type(key) is not str:
            _refuse({key: None}, where, 0)
        stack.append((item, 0))
    left = per_step
    while stack:
        value, depth = stack.pop()
        cls = type(value)
        if cls is dict or cls is list or cls is tuple:  # the rules of `_valid`
            if depth >= MAX_NESTING:
                _refuse(value, where, depth)  # nested too deep: said at once
            if cls is dict:
                for key, item in value.items():
                    if type(key) is not str:
                        _refuse({key: None}, where, depth)
                    stack.append((item, depth + 1))
            else:
                stack += [(item, depth + 1) for item in value]
        elif not _valid(value, depth):
            _refuse(value, where, depth)
        left -= 1
        if not left:
            left = per_step
            yield


def _refuse(value: Any, where: str, depth: int) -> NoReturn:
    """Raise `InvalidValue` for *value*, a scalar, a container too deep or a one-key map
    holding a bad key: `_explain` has nothing else to walk."""
    _explain(value, where, depth)
    raise InvalidValue(f"{where} is not an event value")


def _explain(value: Any, where: str, depth: int) -> None:
    """Raise `InvalidValue` saying what is wrong with *value* and where."""
    cls = type(value)
    if isinstance(value, bool) or value is None or isinstance(value, (str, float, bytes, datetime)):
        return
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            raise InvalidValue(f"{where}: int {value} is outside the 64-bit range")
        return
    if depth >= MAX_NESTING:
        raise InvalidValue(f"{where}: nested deeper than {MAX_NESTING} levels")
    if cls is list or cls is tuple:
        for i, item in enumerate(value):
            _explain(item, f"{where}[{i}]", depth + 1)
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if type(key) is not str:
                raise InvalidValue(
                    f"{where}: names and map keys must be str, not {type(key).__name__}"
                )
            _explain(item, f"{where}.{key}", depth + 1)
        return
    raise InvalidValue(
        f"{where}: {cls.__name__} is not an event value "
        "(use None, bool, int, float, str, bytes, datetime, list or dict)"
    )
