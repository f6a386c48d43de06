"""The compiled stamping loop (`router/_stamp.pyx`) stamps a publish as the Python loop does
(`Dispatcher._stamp`, the reference): the same ids, the same retries dropped, the same meta
maps in the same key order, the same events packed once for the batch."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aa.mesh import (
    MAX_ID_LENGTH,
    Event,
    FloodRules,
    IdGenerator,
    SeenIds,
)
from aa.mesh._speedups import pyx_fresh
from aa.mesh.protocol import packed_fields
from aa.router import Router, RouterConfig, dispatch
from aa.router.dispatch import Dispatcher

compiled = dispatch._compiled_stamp
_set_packed = dispatch._set_packed
needs_compiled = pytest.mark.skipif(compiled is None, reason="the stamping loop is not compiled")

SHARED = {
    "time": datetime(2026, 11, 28, tzinfo=UTC),
    "client": "c1",
    "address": "127.0.0.1:9",
    "router": "r1",
    "ttl": None,
    "path": None,
    "user": "ann",
}


class _Engine:
    match = None

    def deliver_each(self, events: Any) -> None:
        pass


def _dispatcher(max_ids: int = 1000) -> Dispatcher:
    seen = SeenIds(max_ids=max_ids, max_age=60.0)
    seen.check("primed", now=0.0)  # its generations start: a batch may then move none
    rules = FloodRules("r1", seen=seen, initial_ttl=7)
    counters: Any = Counter()
    return Dispatcher(
        ids=IdGenerator("feed"),
        rules=rules,
        engine=_Engine(),  # type: ignore[arg-type]
        counters=counters,
    )


def _shape(result: tuple[list[Event], list[Event], int]) -> Any:
    out, alike, duplicates = result
    return (
        [(e.id, e.type, e.values, list(e.meta.items())) for e in out],
        [e.id for e in alike],
        duplicates,
    )


def _both(
    events: list[Event], own: str | None, now: float = 1.0, max_ids: int = 1000
) -> tuple[Any, Any]:
    reference, fast = _dispatcher(max_ids), _dispatcher(max_ids)
    assert compiled is not None
    want = _shape(reference._stamp(events, dict(SHARED), own, now))
    got = _shape(fast._stamp_compiled(events, dict(SHARED), own, now))
    assert len(reference.rules.seen) == len(fast.rules.seen)
    assert reference.rules.seen._current == fast.rules.seen._current
    assert reference.rules.seen._previous == fast.rules.seen._previous
    return want, got


@needs_compiled
def test_the_usual_batch_is_stamped_alike() -> None:
    events = [
        Event(values={"x": 1}, id="a-1"),
        Event(values={"x": 2}, type="reading", meta={"unit": "C", "ttl": 99, "user": "eve"}),
        Event(values={"x": 3}, id="b-9"),  # not in the scope: prefixed
        Event(values={"x": 4}, id="x" * MAX_ID_LENGTH),  # too long once prefixed: hashed
        Event(values={"x": 1}, id="a-1"),  # a retry
        Event(values={"x": 5}),
    ]
    want, got = _both(events, "a-")
    assert got == want
    assert want[2] == 1
    stamped = want[0]
    assert [m[-3:] for _, _, _, m in stamped][0] == [("ttl", 7), ("path", ["r1"]), ("user", "ann")]
    assert dict(stamped[1][3])["user"] == "ann"  # the publisher's own router keys go
    assert want[1] == [stamped[0][0], stamped[2][0], stamped[3][0], stamped[4][0]]


@needs_compiled
def test_without_a_scope_ids_are_kept() -> None:
    events = [Event(values={"x": i}, id=f"id-{i % 3}") for i in range(7)]
    want, got = _both(events, None)
    assert got == want
    assert [e[0] for e in want[0]] == ["id-0", "id-1", "id-2"] and want[2] == 4


_ids = st.one_of(
    st.none(), st.sampled_from(["a-1", "a-2", "b-1", "x" * MAX_ID_LENGTH, "a-" + "y" * 62])
)
_ints = st.integers(-(2**63), 2**63 - 1)
_metas = st.dictionaries(
    st.sampled_from(["unit", "ttl", "path", "user", "time", "k"]), _ints, max_size=3
)


@needs_compiled
@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(_ids, _metas, _ints), max_size=12),
    st.one_of(st.none(), st.sampled_from(["a-", "b-"])),
    st.sampled_from([2, 8, 1000]),
    st.sampled_from([1.0, 29.9, 30.0, 61.0]),
)
def test_any_batch_is_stamped_as_the_reference_does(
    batch: Any, own: str | None, max_ids: int, now: float
) -> None:
    """Whether or not the batch moves a generation of the seen ids (by their count, or by
    their age: the first moves at 30 s, half the maximum age)."""
    events = [Event(values={"x": x}, meta=m, id=i) for i, m, x in batch]
    want, got = _both(events, own, now, max_ids)
    assert got == want


def _kept(event: Event) -> Event:
    """*event* with the bytes the router's publish reader keeps of a usual event: the
    packer's, ending with its empty meta."""
    _set_packed(event, packed_fields(event.id, event.type, event.values, event.meta))
    return event


@needs_compiled
@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(_ids, _metas, _ints, st.booleans()), max_size=12),
    st.one_of(st.none(), st.sampled_from(["a", "b"])),
)
def test_the_compiled_loop_packs_as_pack_with_meta_does(batch: Any, scope: str | None) -> None:
    """The compiled loop gives a stamped event the bytes of its source with the stamp's in
    place of the empty meta: the same events packed as by `pack_with_meta` after the Python
    loop, each with the bytes of packing it whole."""
    packed = []
    for loop in (None, compiled):
        events = [Event(values={"x": x}, meta=m, id=i) for i, m, x, _ in batch]
        events = [_kept(e) if keep else e for e, (*_, keep) in zip(events, batch, strict=True)]
        fast = _dispatcher()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(dispatch, "_compiled_stamp", loop)
            out = fast.accept(events, "c1", "127.0.0.1:9", "ann", scope)
        for e in out:
            assert e.packed is None or e.packed == packed_fields(e.id, e.type, e.values, e.meta)
        packed.append([(e.id, e.packed is not None) for e in out])
    assert packed[0] == packed[1]


def test_the_router_uses_the_compiled_loop_when_built() -> None:
    """And the reference otherwise (`AA_PURE_PYTHON=1`: the test's second pass)."""
    router = Router(RouterConfig(port=0))
    out = router.dispatcher.accept([Event(values={"x": 1}, id="p-1")], "c", "a", None, "p")
    assert [list(e.meta) for e in out] == [["time", "client", "address", "router", "ttl", "path"]]
    assert (compiled is None) == (not pyx_fresh(dispatch._HERE, "_stamp"))


@needs_compiled
def test_an_extension_older_than_its_pyx_is_not_used(tmp_path, monkeypatch) -> None:
    """The router runs its Python loop when the extension was built from another `.pyx`,
    is missing, or `AA_PURE_PYTHON` is set."""
    here = dispatch._HERE
    for path in here.glob("_stamp*"):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    monkeypatch.delenv("AA_PURE_PYTHON", raising=False)
    assert pyx_fresh(tmp_path, "_stamp")
    monkeypatch.setenv("AA_PURE_PYTHON", "1")
    assert not pyx_fresh(tmp_path, "_stamp")
    monkeypatch.delenv("AA_PURE_PYTHON")
    with (tmp_path / "_stamp.pyx").open("a") as f:
        f.write("\n# edited\n")
    assert not pyx_fresh(tmp_path, "_stamp")
    for path in tmp_path.glob("_stamp.*.so*"):
        path.unlink()
    (tmp_path / "_stamp.pyx").write_bytes((here / "_stamp.pyx").read_bytes())
    assert not pyx_fresh(tmp_path, "_stamp")
