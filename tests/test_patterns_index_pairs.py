"""Two range bounds on two fields (`x > a and y < b`, the shape of a client cache's window):
the predicate index takes an event to the conjunctions whose two bounds it satisfies, and
answers exactly as evaluating every pattern does, however the patterns come and go.

The pair table (`index._Pairs`) splits and merges blocks as entries come and go; the tests
shrink its block size so that a few dozen patterns already go through every form."""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_patterns_index import make_engine, python_kernel_only

import aa.router.patterns.index.predicate_index as index_module
from aa.mesh import Event, PatternSpec
from aa.router.patterns import PatternEngine, PatternSet

OPS = ["<", "<=", ">", ">="]
NUMBERS = [-2, -1, 0, 0.5, 1, 1.0, 2, 2.5, 3, math.inf, -math.inf]
STRINGS = ["", "a", "ab", "b"]
#: Event values: both families, NaN, booleans, None, bytes, a list; and missing (see below).
EVENT_VALUES: list[Any] = [
    *NUMBERS,
    *STRINGS,
    math.nan,
    True,
    False,
    None,
    b"a",
    [1],
]


@contextmanager
def small_blocks(size: int = 2) -> Iterator[None]:
    with mock.patch.object(index_module, "_PAIR_BLOCK", size):
        yield


def bound(rnd: random.Random) -> str:
    return repr(rnd.choice(STRINGS)) if rnd.random() < 0.25 else repr(rnd.choice(NUMBERS[:-2]))


def pair_source(rnd: random.Random) -> str:
    """Two range bounds on two fields, either way round, sometimes a third check or a
    param, sometimes a bound on a meta field or on the type."""
    fields = rnd.sample(["x", "y", "z"], 2)
    if rnd.random() < 0.1:
        fields[0] = rnd.choice(['meta["m"]', "type"])
    parts = []
    for f in fields:
        op, c = rnd.choice(OPS), bound(rnd)
        parts.append(f"{f} {op} {c}" if rnd.random() < 0.8 else f"{c} {op} {f}")
    if rnd.random() < 0.2:
        parts.append(
            rnd.choice(["z != 1", "x < lim", "z >= lim", "y == lim", "y == 'a'", "x > 0.5"])
        )
    return " and ".join(parts)


def random_event(rnd: random.Random) -> Event:
    values = {name: rnd.choice(EVENT_VALUES) for name in ("x", "y", "z") if rnd.random() < 0.85}
    meta = {"m": rnd.choice(EVENT_VALUES)} if rnd.random() < 0.5 else {}
    return Event(values=values, type=rnd.choice([None, "a", "b"]), meta=meta)


def keys(deliveries: list[tuple[Hashable, Event]]) -> list[Hashable]:
    return [k for k, _ in deliveries]


def _apply(engine: PatternEngine, op: tuple[Any, ...]) -> Any:
    try:
        if op[0] == "sub":
            engine.subscribe(op[1], PatternSpec(source=op[2]), op[3])
        elif op[0] == "update":
            engine.update(op[1], op[2])
        elif op[0] == "unsub":
            engine.unsubscribe(op[1])
        else:
            return keys(engine.match(op[1]))
    except Exception as exc:  # the same error on both sides
        return type(exc).__name__
    return None


def operations(rnd: random.Random, n: int, subscribers: int) -> list[tuple[Any, ...]]:
    ops: list[tuple[Any, ...]] = []
    for _ in range(n):
        r = rnd.random()
        who = rnd.randrange(subscribers)
        lim = {"lim": rnd.choice([*NUMBERS[:-2], "a"])}
        if r < 0.45:
            ops.append(("sub", who, pair_source(rnd), lim if rnd.random() < 0.3 else {}))
        elif r < 0.55:
            ops.append(("update", who, lim))
        elif r < 0.7:
            ops.append(("unsub", who))
        else:
            ops.append(("event", random_event(rnd)))
    return ops


@pytest.mark.parametrize("seed", range(6))
def test_subscriptions_on_two_bounds_match_as_evaluating_each_does(seed: int) -> None:
    """Subscribe, update params (in place or re-planned), unsubscribe and match, in random
    order: the index delivers what evaluating every pattern delivers."""
    rnd = random.Random(seed)
    ops = operations(rnd, 1500, subscribers=150)
    with python_kernel_only():
        reference = make_engine()
        expected = [_apply(reference, op) for op in ops]
    with small_blocks(2 + seed % 3):
        indexed = make_engine()
        got = [_apply(indexed, op) for op in ops]
    assert got == expected


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["x", "y"]),
            st.sampled_from(OPS),
            st.sampled_from(NUMBERS[:-2] + STRINGS),
            st.sampled_from(["y", "z"]),
            st.sampled_from(OPS),
            st.sampled_from(NUMBERS[:-2] + STRINGS),
        ),
        min_size=1,
        max_size=30,
    ),
    st.lists(st.integers(0, 29), max_size=15),
    st.lists(
        st.dictionaries(st.sampled_from(["x", "y", "z"]), st.sampled_from(EVENT_VALUES)),
        min_size=1,
        max_size=10,
    ),
)
def test_a_set_of_two_bound_patterns_answers_like_each_matcher(
    pats: list[tuple[Any, ...]], removed: list[int], evs: list[dict[str, Any]]
) -> None:
    """Open and closed bounds, numbers against strings, missing fields, after removals."""
    engine = make_engine()
    with python_kernel_only():
        reference = make_engine()
    with small_blocks():
        patterns = PatternSet(engine)
        naive = {}
        for i, (f, op1, c1, g, op2, c2) in enumerate(pats):
            source = f"{f} {op1} {c1!r} and {g} {op2} {c2!r}"
            patterns.add(i, PatternSpec(source=source))
            naive[i] = reference.matcher(PatternSpec(source=source))
        for i in removed:
            patterns.remove(i)
            naive.pop(i, None)
        for values in evs:
            e = Event(values=values)
            assert patterns.match(e) == [i for i, m in naive.items() if m(e)], (values, pats)


def test_many_patterns_coming_and_going_in_full_size_blocks() -> None:
    """Thousands of window patterns, removed in random order down to none and added
    again: the blocks split and merge at their real size and answers stay exact."""
    rnd = random.Random(7)
    engine = make_engine()
    with python_kernel_only():
        reference = make_engine()
    patterns = PatternSet(engine)
    naive: dict[int, Any] = {}

    def check() -> None:
        for _ in range(40):
            v = rnd.choice([rnd.randrange(-10, 1010), rnd.random() * 1000, "a", math.nan])
            e = Event(values={"x": v, "y": rnd.choice([v, rnd.randrange(1000)])})
            assert patterns.match(e) == [i for i, m in naive.items() if m(e)]

    def add(i: int) -> None:
        a, b = rnd.randrange(1000), rnd.randrange(1000)
        source = f"x {rnd.choice(OPS)} {a} and y {rnd.choice(OPS)} {b}"
        patterns.add(i, PatternSpec(source=source))
        naive[i] = reference.matcher(PatternSpec(source=source))

    for i in range(2000):
        add(i)
    check()
    order = list(naive)
    rnd.shuffle(order)
    for n, i in enumerate(order):
        patterns.remove(i)
        del naive[i]
        if n % 400 == 0:
            check()
    check()
    assert index_is_empty(patterns)
    for i in range(300):
        add(i)
    check()


def index_is_empty(patterns: PatternSet) -> bool:
    index = patterns._index  # what is checked is that the index itself holds nothing
    return not (index._values or index._meta or not index._type.empty() or len(index))


@pytest.mark.parametrize("kind", ["numbers", "strings"])
def test_candidates_per_event_do_not_grow_with_non_matching_range_patterns(kind: str) -> None:
    """An event whose values lie inside every window's access bound and outside every
    other bound is a candidate for none of them: the work per event stays flat from a
    hundred patterns to four thousand."""
    per_event = []
    for n in (100, 1000, 4000):
        patterns = PatternSet(make_engine())
        for i in range(n):
            c = i if kind == "numbers" else f"{i:05d}"
            patterns.add(i, PatternSpec(source=f"x > {c!r} and y < {c!r}"))
        patterns.add(
            "hit",
            PatternSpec(source="x >= 0 and y >= 0" if kind == "numbers" else "x >= '' and y >= ''"),
        )
        evs = [
            Event(values={"x": v, "y": v})
            for v in (
                range(0, n, max(n // 50, 1))
                if kind == "numbers"
                else (f"{j:05d}" for j in range(0, n, max(n // 50, 1)))
            )
        ]
        before = patterns.candidates
        for e in evs:
            assert patterns.match(e) == ["hit"]
        per_event.append((patterns.candidates - before) / len(evs))
    assert per_event[-1] <= 2, per_event
    assert per_event[-1] <= per_event[0] + 1, per_event
