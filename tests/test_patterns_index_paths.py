"""Everything else that matches patterns goes through the predicate index too (issue 12):
client caches (`CacheIndex`, over a `PatternSet`) and history replay deliver exactly what
evaluating every pattern with the python kernel delivers."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import cpu_seconds, wait_for
from test_patterns_index import conjunctions, events, expressions, make_engine, python_kernel_only

from aa.mesh import Event, PatternSpec
from aa.router import Router, RouterConfig
from aa.router.caches import CacheIndex
from aa.router.patterns import PREDICATE_TIER, PatternSet

cache_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 9), st.one_of(expressions(), conjunctions())),
        st.tuples(st.just("remove"), st.integers(0, 9)),
        st.tuples(st.just("event"), events()),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cache_ops)
def test_client_cache_index_answers_like_evaluating_every_pattern(
    ops: list[tuple[Any, ...]],
) -> None:
    engine = make_engine()
    index = CacheIndex()
    with python_kernel_only():
        reference = make_engine()
    naive: dict[int, Any] = {}
    for op in ops:
        if op[0] == "add":
            spec = PatternSpec(source=op[2])
            try:
                matcher = engine.matcher(spec)
            except Exception:  # refused: refused on both sides
                continue
            index.add(op[1], spec, matcher)
            naive.setdefault(op[1], reference.matcher(spec))
        elif op[0] == "remove":
            index.remove(op[1])
            naive.pop(op[1], None)
        else:
            assert sorted(index.match(op[1])) == sorted(k for k, m in naive.items() if m(op[1])), (
                ops
            )


def test_client_cache_patterns_of_the_predicate_tier_are_indexed() -> None:
    """Ranges and conjunctions too, not only `Name == constant`: the index finds 3 of
    10,000 patterns; none of the others is evaluated."""
    engine = make_engine()
    index = CacheIndex()
    for i in range(10_000):
        source = [
            f'Device == "phone-{i}"',
            f"{i} <= Temperature < {i + 1} and Room == 'A'",
            f"Name.startswith('n{i}-')",
        ][i % 3]
        index.add(i, PatternSpec(source=source), engine.matcher(PatternSpec(source=source)))
    with mock.patch.object(PatternSet, "match", wraps=index._set.match) as indexed:
        got = index.match(
            Event(values={"Device": "phone-3", "Temperature": 4.5, "Room": "A", "Name": "n5-x"})
        )
    assert indexed.call_count == 1 and sorted(got) == [3, 4, 5]
    for i in range(10_000):
        index.remove(i)
    assert len(index) == 0 and not index.match(Event(values={"Device": "phone-3"}))


async def test_history_replay_matches_through_the_predicate_tier(tmp_path: Path) -> None:
    """Stored events replayed to predicate-tier subscribers: exactly those the python kernel
    accepts, oldest first, and no pattern code run (the python kernel is never called)."""
    rng = random.Random(7)
    router = Router(RouterConfig(port=0, data_dir=tmp_path / "r"))
    await router.start()
    try:
        stored = [
            {"A": rng.randrange(6), "B": rng.choice(["a", "ab", "b"]), "n": i} for i in range(300)
        ]
        for values in stored:
            router.publish(values, meta={"persist": True})
        await router.storage.flush()
        sources = [
            "A == 3",
            "A >= 4 and B == 'ab'",
            "1 < A <= 2",
            "B.startswith('a') and A != 0",
            "A in (1, 5) or B == 'b'",
        ]
        with python_kernel_only():
            reference = make_engine()
            naive = {
                s: [
                    v["n"]
                    for v in stored
                    if reference.matcher(PatternSpec(source=s))(Event(values=v))
                ]
                for s in sources
            }
        got: dict[str, list[int]] = {s: [] for s in sources}
        from aa.router.patterns.sandbox.python_kernel import ExprProgram

        with mock.patch.object(ExprProgram, "run", side_effect=AssertionError("pattern code run")):
            for s in sources:
                assert router.engine.tier(PatternSpec(source=s)) == PREDICATE_TIER
                router.subscribe(
                    s, lambda e, s=s: got[s].append(e.values["n"]), history={"since": None}
                )
            await wait_for(lambda: all(len(got[s]) == len(naive[s]) for s in sources), timeout=30)
        assert got == naive
    finally:
        await router.aclose()


def test_patterns_that_would_explode_or_run_long_stall_no_new_path() -> None:
    """A disjunction of 2**40 conjunctions, and the longest conjunctions each parser takes,
    in a client cache and as parametric subscribers: placed (or scanned) at once, exact."""
    engine = make_engine()
    index = CacheIndex()
    explode = " and ".join(f"(A{i} == 1 or B{i} == 2)" for i in range(40))
    fast = " and ".join(f"A{i} < p" for i in range(100))[:1000].rsplit(" and ", 1)[0]  # fast reader
    slow = " and ".join(f"(A{i} < p)" for i in range(300))  # ast: parentheses
    with cpu_seconds() as spent:
        for k, source in enumerate([explode, fast, slow]):
            spec = PatternSpec(source=source)
            index.add(k, spec, engine.matcher(spec, {"p": 5} if k else None))
            engine.subscribe(k, spec, {"p": 5} if k else None)
            engine.update(k, {"p": 7}) if k else None
    assert spent() < 2.0
    hit = Event(values={**{f"A{i}": 1 for i in range(300)}})
    assert sorted(index.match(hit)) == [0, 1, 2]
    assert [k for k, _ in engine.match(hit)] == [0, 1, 2]
    miss = Event(values={**{f"A{i}": 1 for i in range(300)}, "A3": 6})  # 6 < 7 (updated), not < 5
    assert sorted(index.match(miss)) == [] and [k for k, _ in engine.match(miss)] == [1, 2]
