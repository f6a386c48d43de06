"""Rows of the event log as one Arrow table per batch (pure: no I/O).

Every event a router dispatches passes through `build_table` once, so it is written to
run in C: each column is built from whole lists with ``map``, ``chain`` and Arrow's
converters, not by a Python loop over rows or values. A Python loop runs only for what
the fast paths refuse — a value that is not a str, int or float, a non-finite float, a
meta that plain JSON cannot hold, an event without an aware ``time`` — and then only over
that batch, giving exactly the text `aa.router.eventlog.codec` gives. The values' text
(``str`` of a float, mostly) and the meta's JSON (a column per key, `_meta_columns`) are
most of a row's cost.

The input is four parallel sequences (``zip(*rows)`` of the rows ``[id, type, values,
meta]`` the writer process decodes, see `aa.router.eventlog.writer`); nothing in them is
changed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from itertools import accumulate, chain, repeat
from typing import Any, Final, NoReturn

import pyarrow as pa
import pyarrow.compute as pc

from aa.mesh import META_CLIENT, META_ROUTER, META_TIME

from .codec import encode_json, encode_value

__all__ = ["SCHEMA", "build_table"]

#: The columns of every file (the Hive partitions add ``date`` and ``hour`` on reading).
SCHEMA: Final = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("type", pa.string()),
        pa.field("time", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("router", pa.string()),
        pa.field("client", pa.string()),
        pa.field("logged_by", pa.string(), nullable=False),
        pa.field("values", pa.map_(pa.string(), pa.string())),
        pa.field("values_types", pa.map_(pa.string(), pa.string())),
        pa.field("meta_json", pa.string()),
    ]
)

_MAP: Final = pa.map_(pa.string(), pa.string())
_STR: Final = pa.string()
_TIME: Final = pa.timestamp("us", tz="UTC")
_OFFSETS: Final = pa.int32()
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_US: Final = timedelta(microseconds=1)

#: Value types whose text is ``str(value)`` (a float's only when finite) and their names.
_PLAIN_TYPES: Final = {str: "str", int: "int", float: "float"}
_PLAIN_SET: Final = frozenset(_PLAIN_TYPES)
_STR_OR_NONE: Final = frozenset({str, type(None)})
_MISSING: Final = object()


def _refuse(value: object) -> NoReturn:
    raise TypeError(type(value).__name__)


# The C encoder `codec`'s plain encoder (`json.JSONEncoder(ensure_ascii=False,
# separators=(",", ":"), allow_nan=False)`) builds per call, made once and called through
# `map`: same text, without the Python frames `JSONEncoder.encode` adds per call. No
# circular-reference markers: event values are trees (`aa.mesh.values`). Where the C
# accelerator is missing, `encode_json` does every row.
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
_HAS_C_ENCODER: Final = _c_make_encoder is not None


def _no_c_encoder(value: Any, level: int) -> Sequence[str]:
    raise TypeError("no C JSON encoder")  # never called: `_meta_texts` checks first


#: ``_JSON(value, 0)``: the chunks of *value*'s JSON text.
_JSON: Final[Callable[[Any, int], Sequence[str]]] = (
    _c_make_encoder(
        None, _refuse, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )
    if _c_make_encoder is not None
    else _no_c_encoder
)
_join: Final = "".join
_encode_str: Final = json.encoder.encode_basestring  # the C one when there is a C encoder


def build_table(
    ids: Sequence[str | None],
    types: Sequence[str | None],
    values: Sequence[dict[str, Any]],
    metas: Sequence[dict[str, Any]],
    logged: Sequence[float],
    logged_by: str,
) -> pa.Table:
    """The `SCHEMA` table of a batch of events given as parallel sequences (*logged*: when
    each was logged, in seconds; *logged_by*: this router)."""
    n = len(ids)
    source = metas
    metas = list(map(dict.copy, metas))
    # The time stamp has its own column and is left out of meta_json (see `SCHEMA`).
    times = list(map(dict.pop, metas, repeat(META_TIME), repeat(_MISSING)))
    try:
        distinct = set(times)  # one stamp per dispatched batch, usually
    except TypeError:  # something unhashable: not a datetime
        distinct = {None}
    if all(type(t) is datetime and t.tzinfo is not None for t in distinct):
        if len(distinct) * 4 > n:  # each relayed event decoded its own
            time_col = pa.array(times, _TIME)
        else:  # a stamp per client's batch: converted once each (a datetime keeps its hash)
            micros = {t: (t - _EPOCH) // _US for t in distinct}
            time_col = pa.array(list(map(micros.__getitem__, times)), _TIME)
    else:
        stamps: list[int] = []
        for i, t in enumerate(times):
            if type(t) is datetime and t.tzinfo is not None:
                stamps.append((t - _EPOCH) // _US)
            else:  # no time, or no zone: logged time, and the meta keeps what it had
                stamps.append(int(logged[i] * 1_000_000))
                if t is not _MISSING:
                    metas[i] = source[i]
        time_col = pa.array(stamps, _TIME)
    routers = list(map(dict.get, metas, repeat(META_ROUTER)))
    if not set(map(type, routers)) <= _STR_OR_NONE:
        routers = [r if type(r) is str else None for r in routers]
    clients = list(map(dict.get, metas, repeat(META_CLIENT)))
    if not set(map(type, clients)) <= _STR_OR_NONE:
        clients = [c if type(c) is str else None for c in clients]
    ids = list(ids)
    if None in ids:
        ids = [i if i is not None else "" for i in ids]
    texts, names = _value_texts(values)
    offsets = pa.array(list(accumulate(map(len, values), initial=0)), _OFFSETS)
    keys = pa.array(list(chain.from_iterable(values)), _STR)
    return pa.Table.from_arrays(
        [
            pa.array(ids, _STR),
            pa.array(types, _STR),
            time_col,
            pa.array(routers, _STR),
            pa.array(clients, _STR),
            pa.array([logged_by] * n, _STR),
            pa.MapArray.from_arrays(offsets, keys, pa.array(texts, _STR), type=_MAP),
            pa.MapArray.from_arrays(offsets, keys, pa.array(names, _STR), type=_MAP),
            _as_array(_meta_texts(metas)),
        ],
        schema=SCHEMA,
    )


def _as_array(texts: pa.Array | list[str]) -> pa.Array:
    return texts if isinstance(texts, pa.Array) else pa.array(texts, _STR)


def _value_texts(values: Sequence[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    """The values of every row, flattened in order: their texts and type names."""
    flat = list(chain.from_iterable(map(dict.values, values)))
    kinds = list(map(type, flat))
    present = set(kinds)
    names: list[Any] = list(map(_PLAIN_TYPES.get, kinds))
    texts: list[Any] | None = None
    if present <= _PLAIN_SET:
        try:
            texts = list(map(str, flat))  # a str is itself; an int, digits; a float, its repr
        except ValueError:  # an int beyond str()'s digit limit
            texts = None
    if texts is None:
        texts = flat[:]
        for i, k in enumerate(kinds):
            if k is not str:
                texts[i], names[i] = encode_value(flat[i])
    elif float in present and ("nan" in texts or "inf" in texts or "-inf" in texts):
        for i, k in enumerate(kinds):  # NaN, Infinity, -Infinity in codec's spelling
            if k is float:
                texts[i] = encode_value(flat[i])[0]
    return texts, names


def _meta_texts(metas: list[dict[str, Any]]) -> pa.Array | list[str]:
    """Each meta as `codec` typed JSON."""
    if not _HAS_C_ENCODER:
        return list(map(encode_json, metas))
    shapes = set(map(tuple, metas))  # the keys, in order
    if len(shapes) == 1:
        texts = _meta_columns(metas, shapes.pop())
        if texts is not None:
            return texts
    try:
        out = list(map(_join, map(_JSON, metas, repeat(0))))
    except (TypeError, ValueError):  # bytes, a datetime, a non-finite float somewhere
        return [_meta_text(m) for m in metas]
    if '"$' in _join(out):  # a key or string starting with "$": maybe to escape
        return [t if '"$' not in t else encode_json(m) for t, m in zip(out, metas)]
    return out


def _meta_text(meta: dict[str, Any]) -> str:
    try:
        text = _join(_JSON(meta, 0))
    except (TypeError, ValueError):
        return encode_json(meta)
    return text if '"$' not in text else encode_json(meta)


def _meta_columns(metas: list[dict[str, Any]], keys: tuple[Any, ...]) -> pa.Array | None:
    """The metas' JSON when all have the same keys in the same order (one shape per
    publisher: the router stamps the same keys on all) — a column per key, each encoded
    once per distinct value, joined by Arrow: a quarter of the cost of encoding each meta.
    None when a column needs more care than that (`_meta_texts` then encodes row by row)."""
    parts: list[Any] = []
    for i, key in enumerate(keys):
        if type(key) is not str or key.startswith("$"):  # a "$" key is escaped (codec)
            return None
        texts = _json_column(list(map(dict.__getitem__, metas, repeat(key))))
        if texts is None:
            return None
        parts += ("{" if i == 0 else ",") + _encode_str(key) + ":", pa.array(texts, _STR)
    if not parts:
        return pa.array(["{}"] * len(metas), _STR)
    return pc.binary_join_element_wise(*parts, "}", "")


def _json_column(column: list[Any]) -> list[str] | None:
    """The JSON text of each value of one meta key, exactly as the C encoder writes it."""
    kinds = set(map(type, column))
    if kinds == {str}:
        encode: Callable[[Any], str] = _encode_str  # a string's text is the same tagged or not
    elif kinds == {int}:
        encode = int.__repr__  # what the C encoder writes for an int (a bool is not an int here)
    elif kinds == {list} and set(map(type, chain.from_iterable(column))) <= {str}:  # a path
        column = list(map(tuple, column))  # hashable; the encoder writes a tuple as a list
        encode = _encode_list
    else:
        try:
            texts = list(map(_join, map(_JSON, column, repeat(0))))
        except (TypeError, ValueError):
            return None
        return None if '"$' in _join(texts) else texts
    distinct = set(column)  # equal values of one type have one text
    if len(distinct) * 4 > len(column):
        return list(map(encode, column))
    text = {v: encode(v) for v in distinct}
    return list(map(text.__getitem__, column))


def _encode_list(value: tuple[str, ...]) -> str:
    return _join(_JSON(value, 0))
