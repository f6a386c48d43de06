"""The client's compiled check and pack of a published event (`client/_publish.pyx`) makes
the bytes the reference path makes (`packed_publish`: the value model's checks, then the
codec's packer), and leaves every event it does not pack, good or bad, to that path: the
same bytes and the same errors either way."""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aa.client import outbox
from aa.mesh import MAX_ID_LENGTH
from aa.mesh.protocol import packed_fields, unpack

try:
    from aa.client import _publish
except ImportError:  # built without a compiler: the reference path alone runs
    _publish = None  # type: ignore[assignment]

pytestmark = pytest.mark.skipif(_publish is None, reason="the packer was not compiled")


def outcome(monkeypatch: pytest.MonkeyPatch, compiled: bool, *args: Any) -> tuple[str, bytes | str]:
    """What `packed_publish(*args)` gives with or without the compiled packer."""
    monkeypatch.setattr(outbox, "_pack", _publish.pack if compiled else None)
    try:
        return "bytes", outbox.packed_publish(*args)
    except Exception as exc:
        return type(exc).__name__, str(exc)


INTS = [
    -(2**63),
    -(2**31) - 1,
    -(2**31),
    -32769,
    -32768,
    -129,
    -128,
    -33,
    -32,
    -1,
    0,
    1,
    127,
    128,
    255,
    256,
    65535,
    65536,
    2**32 - 1,
    2**32,
    2**63 - 1,
    2**63,
    2**64 - 1,
]


class Level(enum.IntEnum):
    LOW = 1


def test_every_int_width_packs_as_msgpack_packs_it() -> None:
    for i in INTS:
        values = {"i": i, "n": -i if -i >= -(2**63) else 0}
        got = _publish.pack("a-1", None, values, {}, MAX_ID_LENGTH)
        assert got == packed_fields("a-1", None, values, {}), i
        assert unpack(got)[2] == values


def test_every_str_and_bytes_width_packs_as_msgpack_packs_it() -> None:
    for n in (0, 1, 31, 32, 255, 256, 1500):
        for values in ({"s" * max(n, 1): "x" * n}, {"b": b"\xff" * n}, {"u": "å" * n}):
            got = _publish.pack("a-1", "ü" * n, values, {"m": "y" * n}, MAX_ID_LENGTH)
            if n * 6 > _publish.MAX_BYTES:  # over its buffer: the reference packs it
                assert got is None
            else:
                assert got == packed_fields("a-1", "ü" * n, values, {"m": "y" * n}), n


@pytest.mark.parametrize(
    "args",
    [
        ({"x": 1.5, "y": None, "t": True, "f": False, "nan": float("nan")}, "t", None, "a-1"),
        ({}, None, {}, "b" * MAX_ID_LENGTH),
        ({"big": "x" * 5000}, None, None, "a-1"),  # over the compiled buffer: the reference
        ({"d": datetime(2026, 1, 1, tzinfo=UTC), "n": datetime(2026, 1, 1)}, None, None, "a-1"),
        ({"l": [1, [2, {"m": {}}]], "m": {"k": b"v"}}, None, {"user": "ann"}, "a-1"),
        ({"i": Level.LOW}, None, None, "a-1"),
        ({"i": 2**64}, None, None, "a-1"),
        ({"i": -(2**63) - 1}, None, None, "a-1"),
        ({1: 1}, None, None, "a-1"),
        ({"x": 1}, None, {2: 1}, "a-1"),
        ({"x": object()}, None, None, "a-1"),
        ({"x": {1, 2}}, None, None, "a-1"),
        ({"x": "\ud800"}, None, None, "a-1"),
        ({"\ud800": 1}, None, None, "a-1"),
        ({"x": 1}, 5, None, "a-1"),
        ({"x": 1}, None, None, "b" * (MAX_ID_LENGTH + 1)),
        ({"x": 1}, None, None, 7),
        ([("x", 1)], None, None, "a-1"),
        ("not a map", None, None, "a-1"),
        ({"x": 1}, None, [("k", 1)], "a-1"),
        (
            {"x": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]},
            None,
            None,
            "a",
        ),
    ],
)
def test_the_same_bytes_or_the_same_error(monkeypatch: pytest.MonkeyPatch, args: Any) -> None:
    assert outcome(monkeypatch, True, *args) == outcome(monkeypatch, False, *args)


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=40)
    | st.binary(max_size=40)
)
flat = st.dictionaries(st.text(max_size=12), scalars, max_size=10)


@settings(max_examples=300, deadline=None)
@given(flat, flat, st.text(min_size=1, max_size=MAX_ID_LENGTH), st.none() | st.text(max_size=9))
def test_any_flat_event_packs_alike(values: Any, meta: Any, id: str, type: str | None) -> None:
    got = _publish.pack(id, type, values, meta, MAX_ID_LENGTH)
    want = packed_fields(id, type, values, meta)
    assert got == want or got is None and len(want) > _publish.MAX_BYTES
    with pytest.MonkeyPatch.context() as mp:
        assert outcome(mp, True, values, type, meta, id) == outcome(
            mp, False, values, type, meta, id
        )


def test_the_pure_path_packs_with_the_reference() -> None:
    import os
    import subprocess
    import sys

    code = "from aa.client import outbox; print(outbox._pack is None)"
    env = {**os.environ, "AA_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "True", out.stderr
