"""The compiled matcher (`router/patterns/_match.pyx`) matches as `PatternEngine.match` does
(the reference): the same deliveries in the same order, the same evaluation marks and
counts, for every shape of the predicate tier, and it steps aside for everything else."""

from __future__ import annotations

import time
from collections.abc import Hashable
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aa.mesh import Event, PatternSpec
from aa.router.patterns import HostFacts, PatternEngine
from aa.router.patterns import engine as engine_module

needs_compiled = pytest.mark.skipif(
    engine_module._compiled is None, reason="the matcher is not compiled"
)

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)

#: Checks of the predicate grammar, and a few outside it (those go to the scan list or the
#: sandbox), over values A and B (numbers), S (a string) and the event type.
ATOMS = [
    "A == 3",
    "A == 2.5",
    "A != 3",
    "A > 2",
    "A >= 2.5",
    "A < 4",
    "2 <= A < 5",
    "A in (1, 2, 7)",
    "B > -1",
    "B < 0.5",
    "S == 'lab-1'",
    'S.startswith("lab")',
    'S.startswith("la")',
    'S.endswith("-1")',
    "S in ('yard', 'lab-2')",
    "type == 'reading'",
    "type == 'alarm'",
    "A > limit",
    "S.startswith(prefix)",
    "A > B",
    "A + 1 > 3",
    "len(S) > 3",
    "True",
]
PARAMS = {"limit": 2, "prefix": "la"}

atoms = st.sampled_from(ATOMS)
patterns = st.one_of(
    atoms,
    st.builds(lambda a, b: f"{a} and {b}", atoms, atoms),
    st.builds(lambda a, b: f"({a}) or ({b})", atoms, atoms),
    st.builds(lambda a, b, c: f"{a} and {b} and {c}", atoms, atoms, atoms),
    st.builds(lambda a: f"not ({a})", atoms),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 8),
    st.sampled_from([2.5, -0.5, 1e300, float("nan")]),
    st.sampled_from(["lab-1", "lab-2", "la", "yard", "", "x-1"]),
)
events = st.builds(
    lambda values, type, meta: Event(values=values, type=type, meta=meta, id="e-1"),
    st.dictionaries(st.sampled_from(["A", "B", "S", "T"]), scalars, max_size=4),
    st.sampled_from([None, "reading", "alarm"]),
    st.sampled_from([{}, {"unit": "C"}]),
)


def _engine(compiled: bool) -> PatternEngine:
    host = HostFacts(router_id="r-1", router_name="r", clock=lambda: NOW, peer_count=lambda: 0)
    engine = PatternEngine(host=host, on_failure=lambda keys, code, message: None)
    if not compiled:
        engine._fast = None  # the reference
    return engine


def _subscribed(compiled: bool, sources: list[str]) -> PatternEngine:
    engine = _engine(compiled)
    for n, source in enumerate(sources):
        engine.subscribe(f"s{n}", PatternSpec(source=source), PARAMS)
    return engine


def _state(engine: PatternEngine) -> Any:
    """What a match leaves behind: the engine's mark, the index's count of candidates, each
    subscriber's bucket mark, the pending run-time errors."""
    return (
        engine._stamp,
        engine._index.candidates,
        [member.bucket.stamp for member in engine._subs.values()],
        len(engine._sandbox.errors.tallies),
    )


def _same(sources: list[str], batch: list[Event]) -> None:
    reference, fast = _subscribed(False, sources), _subscribed(True, sources)
    assert fast._fast is not None
    for event in batch:
        want = [(key, ev is event) for key, ev in reference.match(event)]
        got = [(key, ev is event) for key, ev in fast.match(event)]
        assert got == want, (sources, event)
        assert _state(fast) == _state(reference), (sources, event)


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(st.lists(patterns, min_size=1, max_size=6), st.lists(events, min_size=1, max_size=40))
def test_the_same_deliveries_as_the_reference(sources: list[str], batch: list[Event]) -> None:
    _same(sources, batch)


@needs_compiled
def test_the_usual_event_is_matched_the_same_way() -> None:
    """bench_router.py's pattern, a second subscriber of it and one of another: every event
    of a run, the timed ones (one in CPU_SAMPLE_EVERY, left to the reference) among them."""
    sources = [
        'Temperature > -1000 and Sensor.startswith("lab")',
        'Temperature > -1000 and Sensor.startswith("lab")',
        "Temperature > 50",
    ]
    batch = [
        Event(values={"Temperature": 20 + i % 80, "Sensor": "lab-1", "Seq": i}, id=f"e-{i}")
        for i in range(100)
    ]
    _same(sources, batch)


@needs_compiled
def test_it_steps_aside_for_a_script_and_for_meta_fields() -> None:
    """A bucket on the engine's scan list, or a pattern over the meta: the reference runs
    (the compiled matcher returns None and changes nothing)."""
    for other in ("forward()", None):
        engine = _engine(True)
        engine.subscribe("p", PatternSpec(source="A > 1"))
        if other is None:
            engine.subscribe("m", PatternSpec(source="meta['unit'] == 'C'"))
        else:
            engine.subscribe("x", PatternSpec(kernel="python", format="script", source=other))
        before = _state(engine)
        assert engine._fast.match(Event(values={"A": 2}, meta={"unit": "C"})) is None
        assert _state(engine) == before
        assert [k for k, _ in engine.match(Event(values={"A": 2}, meta={"unit": "C"}))] == [
            "p",
            other is None and "m" or "x",
        ]


class _Key:
    """A subscriber key whose delivery calls back into the engine, as a local subscription's
    callback may: it subscribes a script and takes itself out on its first delivery."""

    def __init__(self, engine: PatternEngine, log: list[Hashable], name: str) -> None:
        self.engine, self.log, self.name = engine, log, name

    def __hash__(self) -> int:
        return hash(self.name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Key) and other.name == self.name

    def deliver(self, event: Event) -> None:
        self.log.append((self.name, event.values["A"]))
        if self.name == "a" and event.values["A"] == 2:
            self.engine.subscribe(
                _Plain(self.log, "script"),
                PatternSpec(kernel="python", format="script", source="forward()"),
            )
            self.engine.unsubscribe(self)


class _Plain:
    def __init__(self, log: list[Hashable], name: str) -> None:
        self.log, self.name = log, name

    def deliver(self, event: Event) -> None:
        self.log.append((self.name, event.values["A"]))


@needs_compiled
def test_a_delivery_that_changes_the_engine_is_seen_by_the_next_event() -> None:
    logs = []
    for compiled in (False, True):
        engine = _engine(compiled)
        log: list[Hashable] = []
        engine.subscribe(_Key(engine, log, "a"), PatternSpec(source="A > 0"))
        engine.subscribe(_Key(engine, log, "b"), PatternSpec(source="A > 1"))
        engine.deliver_each([Event(values={"A": n}) for n in range(5)])
        logs.append(log)
    assert logs[1] == logs[0]
    assert ("script", 3) in logs[0] and ("a", 3) not in logs[0]


def _change_and_match_cpu(engine: PatternEngine, rounds: int) -> float:
    """CPU seconds of *rounds* of (a subscription added, an event, it taken out, an event)."""
    event = Event(values={"F1": 1, "X": 2}, id="e-1")
    start = time.thread_time()
    for _ in range(rounds):
        engine.subscribe("churn", PatternSpec(source="F2 == 1"))
        engine.match(event)
        engine.unsubscribe("churn")
        engine.match(event)
    return time.thread_time() - start


@needs_compiled
def test_a_change_costs_the_fields_read_not_all_the_fields() -> None:
    """A client that subscribes and unsubscribes between events, on a router whose patterns
    read 20,000 fields, costs the compiled matcher about what it costs the reference: the
    matcher's table is made again for the fields the next event reads, not for all of them."""
    cpu = []
    for compiled in (False, True):
        engine = _subscribed(compiled, [f"F{i} == 1" for i in range(20_000)])
        _change_and_match_cpu(engine, 10)  # warm
        cpu.append(_change_and_match_cpu(engine, 300))
    reference, fast = cpu
    assert fast < 4 * reference, cpu
