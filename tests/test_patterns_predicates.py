"""The predicate tier as a subscriber sees it: which patterns land in it, what they mean,
what stays in the sandbox, and the helpers around it (warnings, pattern sets, quenching)."""

from __future__ import annotations

import random
from collections.abc import Hashable
from datetime import UTC, datetime
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import cpu_seconds

import aa.router.patterns.engine as engine_module
from aa.mesh import Event, PatternSpec
from aa.router.patterns import PREDICATE_TIER, SANDBOX_TIER, HostFacts, PatternEngine, PatternSet

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def failures() -> list[tuple[list[Hashable], str, str]]:
    return []


@pytest.fixture
def engine(failures: list[Any]) -> PatternEngine:
    host = HostFacts(router_id="r", router_name="r", clock=lambda: NOW, peer_count=lambda: 0)
    return PatternEngine(
        host=host, on_failure=lambda keys, code, message: failures.append((keys, code, message))
    )


def expr(source: str) -> PatternSpec:
    return PatternSpec(source=source)


def keys(deliveries: list[tuple[Hashable, Event]]) -> list[Hashable]:
    return [k for k, _ in deliveries]


@pytest.mark.parametrize(
    "source",
    [
        "Temperature > 100",
        "Temperature > 100 and Sensor.startswith('lab')",
        "1 < X <= 5 or not (Y != 'a')",
        "Room in ('A', 'B') and Floor not in [1, 2]",
        "type == 'reading' and meta['client'] == 'c1'",
        "Temperature > threshold and params['room'] == Room",
        "'Temperature' in event and 'client' in meta",
        "(Temperature - 32) * 5 / 9 > 30 and n % k == 0 and X ** 2 < 10 and -X < 0",
        "len(Readings) > 2 and Name.lower() == 'x' and Name.upper().endswith('Y')",
        "'lab' in Sensor and X is None and Y is not True",
        "L[0] == 1 and d['k'] == 2 and event['odd name'] == 1",
        "True",
    ],
)
def test_inside_the_grammar(engine: PatternEngine, source: str) -> None:
    assert engine.tier(expr(source)) == PREDICATE_TIER


@pytest.mark.parametrize(
    "source",
    [
        "int(X) > 3",  # calls other than len()
        "event.Temperature > 3",  # attributes other than the four methods
        "Name.replace('a', 'b') == 'x'",
        "f'{X}' == '1'",
        "[v for v in L if v > 2]",
        "X & 1",
        "X if Y else Z",
        "(y := X) > 1",
        "_private > 1",
        "open == 1",  # the kernel refuses it, with its reason
        "'%d' % X == '1'",
        "X > 1j",
        "L[1:2] == [1]",
        "meta == {}",
        "X is 3",
        "Temperature >",  # does not parse: the kernel reports it
        "X > 1 and " * 1000 + "True",  # too long for the tier
    ],
)
def test_outside_the_grammar_stays_in_the_sandbox(engine: PatternEngine, source: str) -> None:
    assert engine.tier(expr(source)) == SANDBOX_TIER
    assert (
        engine.tier(PatternSpec(kernel="python", format="script", source="forward()"))
        == SANDBOX_TIER
    )


def test_the_kernels_semantics(engine: PatternEngine) -> None:
    """A missing name, a type mismatch, an error in a comparison: that comparison is
    unknown, as in the python kernel; `or` is rescued by a true operand, `not` of unknown is
    unknown (no match)."""
    engine.subscribe("or", expr("Temperature > 100 or Humidity > 90"))
    engine.subscribe("not", expr("not (Temperature > 100)"))
    engine.subscribe("param", expr("Temperature > limit"), {"limit": 10})
    engine.subscribe("high", expr("Temperature > limit"), {"limit": 1000})
    engine.subscribe("len", expr("len > 3"))
    assert keys(engine.match(Event(values={"Humidity": 95}))) == ["or"]  # only the left unknown
    assert keys(engine.match(Event(values={"Humidity": 5}))) == []  # unknown or false
    assert keys(engine.match(Event(values={"Temperature": "hot", "Humidity": 95}))) == ["or"]
    assert keys(engine.match(Event(values={"Temperature": 50, "Humidity": 95}))) == [
        "or",
        "not",
        "param",
    ]
    # A param is the subscriber's: an event value of its name does not change it (as in the
    # kernel); a builtin's name is the event's value when it has one.
    assert keys(engine.match(Event(values={"Temperature": 50, "limit": 1, "len": 4}))) == [
        "not",
        "param",
        "len",
    ]


def test_subscription_order_across_tiers_and_groups(engine: PatternEngine) -> None:
    engine.subscribe("s", PatternSpec(kernel="python", format="script", source="forward()"))
    engine.subscribe("p1", expr("X == 1"))
    engine.subscribe("k", expr("int(X) == 1"))  # sandbox tier
    engine.subscribe("p2", expr("X == 1"))  # same instance and bucket as p1
    engine.subscribe("r", expr("X >= 1"))
    assert keys(engine.match(Event(values={"X": 1}))) == ["s", "p1", "k", "p2", "r"]
    engine.update("p1", {"unused": 1})  # p1 moves to a bucket of its own
    assert keys(engine.match(Event(values={"X": 1}))) == ["s", "p1", "k", "p2", "r"]


def test_parametric_update_moves_the_subscription(engine: PatternEngine) -> None:
    engine.subscribe("t", expr("Symbol == sym and Price < limit"), {"sym": "IBM", "limit": 10.0})
    quote = Event(values={"Symbol": "IBM", "Price": 20.0})
    assert engine.match(quote) == []
    engine.update("t", {"limit": 30.0})
    assert keys(engine.match(quote)) == ["t"]
    engine.update("t", {"sym": "ACME"})
    assert engine.match(quote) == [] and keys(
        engine.match(Event(values={"Symbol": "ACME", "Price": 1}))
    ) == ["t"]


def test_a_disjunction_that_would_explode_is_scanned_not_refused(engine: PatternEngine) -> None:
    source = " and ".join(f"(A{i} == 1 or B{i} == 2)" for i in range(40))  # 2**40 conjunctions
    with cpu_seconds() as spent:
        engine.subscribe("x", expr(source))
    assert spent() < 1.0
    assert engine.tier(expr(source)) == PREDICATE_TIER
    hit = {**{f"A{i}": 1 for i in range(40)}}
    assert keys(engine.match(Event(values=hit))) == ["x"]
    assert engine.match(Event(values={**hit, "A3": 0})) == []


def test_huge_integers_are_no_match_not_a_stall(engine: PatternEngine, failures: list[Any]) -> None:
    engine.subscribe("pow", expr("X ** 100000 // Y ** 50000 > 1"))
    engine.subscribe("mul", expr("X ** 40 * X ** 40 // Y > 1"))  # 4,960 bits: past the tier's cap
    engine.subscribe("ok", expr("X ** 2 > 1"))
    assert engine.tier(expr("X ** 40 * X ** 40 // Y > 1")) == PREDICATE_TIER
    with cpu_seconds() as spent:
        for _ in range(20):
            assert keys(engine.match(Event(values={"X": 2**62, "Y": 3}))) == ["ok"]
    assert spent() < 1.0 and failures == []


def test_oversized_repetition_stops_the_pattern_as_in_the_kernel(
    engine: PatternEngine, failures: list[Any]
) -> None:
    engine.subscribe("big", expr("S * N == ''"))
    engine.subscribe("fine", expr("S == 'ab'"))
    assert keys(engine.match(Event(values={"S": "ab", "N": 10**9}))) == ["fine"]
    assert failures and failures[0][0] == ["big"] and failures[0][1] == "pattern-memory"
    assert engine.keys() == ["fine"]


def test_warnings_for_patterns_that_cannot_match(engine: PatternEngine) -> None:
    seen = {"Temperature", "Sensor", "Room"}
    assert engine.pattern_warnings(expr("Temprature > 100"), seen) == [
        "no event has had `Temprature`; did you mean `Temperature`?"
    ]
    assert engine.pattern_warnings(expr("Sensor == lab-1"), seen) == [
        "`lab-1` is read as an expression, not as text; did you mean Sensor == 'lab-1'?"
    ]
    assert engine.pattern_warnings(expr("Room == A"), seen) == [
        "`A` is read as an expression, not as text; did you mean Room == 'A'?"
    ]
    assert engine.pattern_warnings(expr("Sensor == lab-1"), set()) == [
        "`lab-1` is read as an expression, not as text; did you mean Sensor == 'lab-1'?"
    ]
    # a name beside a literal is the field, seen or not yet (a newcomer's first subscribe)
    for source in ['Door == "open"', "X == 1", '"open" != Door', "X in (1, 2)"]:
        assert not any(
            "read as an expression" in w for w in engine.pattern_warnings(expr(source), set())
        ), source
    assert (
        engine.pattern_warnings(expr("Temperature > limit and len(Sensor) > 2"), seen, {"limit": 3})
        == []
    )
    script = PatternSpec(
        kernel="python",
        format="script",
        source="n = state.get('n', 0)\nif Tempratur > n:\n    forward()",
    )
    assert engine.pattern_warnings(script, seen) == [
        "no event has had `Tempratur`; did you mean `Temperature`?"
    ]
    assert engine.pattern_warnings(expr("Temperature >"), seen) == []
    # a name not published yet is the normal order in publish/subscribe: no warning, unless
    # it is a near miss of a name seen (case, or a couple of edits by its length)
    assert engine.pattern_warnings(expr('Door == "open" and Humidity > 3'), seen) == []
    assert engine.pattern_warnings(expr("room == 'A' or Snesor == 'x' or Rom == 1"), seen) == [
        "no event has had `Snesor`; did you mean `Sensor`?",
        "no event has had `room`; did you mean `Room`?",
    ]  # `Rom`: three letters, too short to tell a typo from another name


def test_pattern_set_answers_like_each_matcher(engine: PatternEngine) -> None:
    caches = PatternSet(engine)
    sources = [
        'Device == "phone-7"',
        "Device == 'phone-8' or Battery < 10",
        "Battery < level",
        "int(Battery) == 5",
        "'Device' in event",
    ]
    assert [caches.add(i, expr(s), {"level": 20}) for i, s in enumerate(sources)] == [
        PREDICATE_TIER
    ] * 3 + [SANDBOX_TIER, PREDICATE_TIER]
    matchers = [engine.matcher(expr(s), {"level": 20}) for s in sources]
    events = [
        Event(values=v)
        for v in (
            {"Device": "phone-7", "Battery": 5},
            {"Device": "phone-8", "Battery": 50},
            {"Battery": 15},
            {},
        )
    ]
    for e in events:
        assert caches.match(e) == [i for i, m in enumerate(matchers) if m(e)]
    caches.update(2, {"level": 10})
    assert caches.match(Event(values={"Battery": 15})) == []
    caches.remove(0)
    assert caches.match(events[0]) == [1, 2, 3, 4] and len(caches) == 4 and 0 not in caches
    assert len(engine) == 0  # none of them is a subscriber


def test_keys_matching_is_matches_prototype_for_every_key(engine: PatternEngine) -> None:
    engine.subscribe("snow", expr("SnowDepth == 80"))
    engine.subscribe("sensor", expr("SnowDepthSensor == True"))
    engine.subscribe("all", expr("True"))
    engine.subscribe(
        "script",
        PatternSpec(kernel="python", format="script", source="if SnowDepth > 10:\n    forward()"),
    )
    engine.subscribe("kernel", expr("int(SnowDepth) > 10"))
    proto = Event(values={"SnowDepthSensor": True, "SnowDepth": 50})
    subscribers = engine.keys()  # a PatternEngine method (the engine itself is not iterable)
    for needs in (False, True):
        expected = [k for k in subscribers if engine.matches_prototype(k, proto, needs_names=needs)]
        assert engine.keys_matching(proto, needs_names=needs) == expected
    assert engine.keys_matching(proto) == ["sensor", "all", "script", "kernel"]


def mostly(valid: list[str], tricky: list[str]) -> st.SearchStrategy[str]:
    return st.sampled_from(valid * 4 + tricky)


literals = mostly(
    [
        "0",
        "-0",
        "7",
        "-12",
        "1.5",
        "-0.0",
        "1e3",
        "2.5E-2",
        "1.",
        "'a'",
        '"b c"',
        "''",
        "True",
        "None",
    ],
    ["007", "0x1F", "1_000", "1j", "r'a'", "'\\n'"],
)
fast_names = mostly(["A", "b2", "len"], ["type", "_x", "and", "Xﬁ", "in"])
fast_ops = mostly(["==", "!=", "<", "<=", ">", ">="], ["=<", "is"])


@st.composite
def fast_sources(draw: Any) -> str:
    parts = []
    for _ in range(draw(st.integers(1, 3))):
        items = [draw(st.one_of(literals, fast_names)) for _ in range(draw(st.integers(1, 3)))]
        parts.append(f" {draw(fast_ops)} ".join(items))
    space = draw(mostly(["", " "], ["\t", "\n", "  "]))
    return (
        space.join(["", " and ".join(parts)])
        if draw(st.booleans())
        else " and ".join(parts) + space
    )


@settings(max_examples=500, deadline=None)
@given(fast_sources())
def test_the_fast_path_reads_what_the_ast_path_reads(source: str) -> None:
    from aa.router.patterns.predicates.fastpath import parse_conjunction
    from aa.router.patterns.predicates.grammar import parse_predicate

    engine = PatternEngine(
        host=HostFacts(router_id="r", router_name="r", clock=lambda: NOW, peer_count=lambda: 0),
        on_failure=lambda *a: None,
    )
    fast = parse_conjunction(source)
    if fast is None:
        return  # the general path decides
    slow = parse_predicate(
        source, engine._sandbox.expr_builtins, engine._sandbox.guards, closures=False
    )
    assert slow is not None and slow.exact
    shape = [[(a.op, a.left, a.right, a.negated, a.reads) for a in c] for c in fast.dnf]
    assert shape == [[(a.op, a.left, a.right, a.negated, a.reads) for a in c] for c in slow.dnf]
    assert (fast.names, fast.mentions) == (slow.names, slow.mentions)


def test_a_conjunction_of_hundreds_of_bounds_subscribes_quickly(engine: PatternEngine) -> None:
    source = " and ".join(f"{i} < A{i % 3} < {i + 1000}" for i in range(120))
    with cpu_seconds() as spent:
        engine.subscribe("x", expr(source))
    assert spent() < 1.0
    assert keys(engine.match(Event(values={"A0": 500, "A1": 500, "A2": 500}))) == ["x"]
    assert engine.match(Event(values={"A0": 500, "A1": 1200, "A2": 500})) == []


# An attacker who has read this tier's source: it runs in the router with no deadline, so no
# grammar-legal source may be made slow (one such pattern froze a router for hours).
COSTLY_SOURCES = [
    '["a"*2]*999999 in [["a"*2]*999998+["b"]]*999999',
    '"a"*4000+"b" in ["a"*4001]*999999',
    " or ".join(['"a"*4000+"b" in ["a"*4001]*999999'] * 15),
    'len(("\\u0130"*999999)' + ".lower()" * 35 + ") > 0",
    "X in [S * 999999]",
    "(S * 4000) * 4000 == S",
    "S + S + S + S == T",
    "'%s' % S * 999999 == S",
]


@pytest.mark.parametrize("source", COSTLY_SOURCES)
def test_no_grammar_legal_source_is_slow(
    engine: PatternEngine, failures: list[Any], source: str
) -> None:
    if engine.tier(expr(source)) != PREDICATE_TIER:
        return  # the worker tier runs it, under its deadline, in another process
    with cpu_seconds() as spent:
        engine.subscribe("costly", expr(source))
        engine.subscribe("victim", expr("V == 1"))
        for _ in range(20):
            assert "victim" in keys(
                engine.match(Event(values={"V": 1, "X": "x", "S": "s" * 3000, "T": "t"}))
            )
    assert spent() < 0.5  # in the router, with no deadline: microseconds


def test_the_attackers_sources_left_in_the_predicate_tier_are_the_bounded_ones(
    engine: PatternEngine,
) -> None:
    inside = [s for s in COSTLY_SOURCES if engine.tier(expr(s)) == PREDICATE_TIER]
    assert inside == ["X in [S * 999999]", "(S * 4000) * 4000 == S", "S + S + S + S == T"]


def test_literal_sequences_built_by_arithmetic_go_to_the_workers(engine: PatternEngine) -> None:
    for source in ('"a" * 3 == S', "S in ['x'] * 3", "S == 'a' + 'b'", "S == '%s' % X"):
        assert engine.tier(expr(source)) != PREDICATE_TIER, source
    assert engine.tier(expr("S * 2 == 'abab'")) == PREDICATE_TIER
    assert keys(engine.match(Event(values={"S": "ab"}))) == []


def test_sequences_past_the_tier_cap_do_not_match(
    engine: PatternEngine, failures: list[Any]
) -> None:
    engine.subscribe("short", expr("S * 2 == T"))
    engine.subscribe("long", expr("S * 3000 == T"))
    hit = Event(values={"S": "ab", "T": "abab"})
    assert keys(engine.match(hit)) == ["short"]
    assert keys(engine.match(Event(values={"S": "a", "T": "a" * 3000}))) == ["long"]
    assert keys(engine.match(Event(values={"S": "ab", "T": "ab" * 3000}))) == []  # 6,000 > cap
    assert failures == []


def test_advice_at_subscribe_stays_cheap_whatever_the_source(engine: PatternEngine) -> None:
    # Subscribe advice runs on the router's loop: an attacker once made one subscribe cost
    # 15 s (a 16 KB source: quadratic segments) and 52 s (10,000 look-alike names seen).
    rng = random.Random(1)

    def word() -> str:
        return "Sensor" + "".join(rng.choice("abcdefgh") for _ in range(6))

    seen = {word() for _ in range(9990)}
    for source in (
        " or ".join(f"{word()}>0" for _ in range(150)),
        " or ".join(f"X == lab-{i}" for i in range(500)),
        "x = 1\n" + "\n".join(f"if {word()} == b{i}: forward()" for i in range(300)),
        # a real typo among look-alikes: the first seen name with two letters swapped
        f"{min(seen)[:-2] + min(seen)[:-3:-1]} > 1 or "
        + " or ".join(f"{word()}>0" for _ in range(150)),
    ):
        with cpu_seconds() as spent:  # 15 ms here; the attacks took 15 s and 52 s
            warnings = engine.pattern_warnings(
                PatternSpec(
                    kernel="python", format="script" if "\n" in source else "expr", source=source
                ),
                seen,
            )
        assert spent() < 0.3, source[:40]
        assert len(warnings) <= 5
        assert warnings or source.startswith("x = 1")  # look-alikes may be no near miss


def test_the_flat_planner_chooses_what_the_general_planner_chooses(engine: PatternEngine) -> None:
    """`flat_plan` (subscribes and updates of the common conjunction) against `_plan`, on
    random conjunctions, params (NaN, None, unhashable too) and posting sizes: the same
    access, the same checks left (a PARAM check read with the bucket's params), the same
    shadow."""
    import math
    import random

    from aa.router.patterns.predicates import program as P
    from aa.router.patterns.predicates.fastpath import parse_conjunction
    from aa.router.patterns.predicates.flatplan import flat_plan

    rng = random.Random(1)
    for k in range(200):
        engine.subscribe(k, expr(f"A == {rng.choice([1, 2, 3])}"))
        engine.subscribe(-k - 1, expr(f"B > {rng.choice([1, 2, 3])}"))
    posting = engine._index.posting
    operands = ["1", "2", "2.5", "'a'", "0", "-1", "p", "q", "True", "None"]
    compared = 0
    for _ in range(3000):
        parts = []
        for _ in range(rng.randint(1, 5)):
            field, op, operand = (
                rng.choice("ABC"),
                rng.choice(["==", "!=", "<", "<=", ">", ">="]),
                rng.choice(operands),
            )
            parts.append(
                f"{field} {op} {operand}" if rng.random() < 0.7 else f"{operand} {op} {field}"
            )
        source = " and ".join(parts)
        g = parse_conjunction(source)
        if g is None:
            continue
        params = {
            k: rng.choice([1, 2.5, "a", math.nan, None, [1]])
            for k in rng.sample(["p", "q"], rng.randint(0, 2))
        }
        program = P.PredicateProgram(engine.sandbox, source, g)
        flat = flat_plan(g.dnf[0], params, program.builtins, posting)
        if flat is None:
            continue
        compared += 1

        def seen(plan: Any, params: dict[str, Any] = params) -> tuple[Any, ...]:
            c = plan.conjs[0]
            rest = [
                (P.VALUE, k, fn, params[x]) if w == P.PARAM else (w, k, fn, x)
                for w, k, fn, x in zip(*[iter(c.rest)] * 4)
            ]
            return (
                c.access.kind,
                c.access.src,
                repr(c.access.keys),
                repr(rest),
                plan.shadow,
                len(plan.conjs),
            )

        assert seen(flat) == seen(program._plan(g, params, posting)), (source, params)
    assert compared > 1000


@settings(max_examples=1000, deadline=None)
@given(
    st.lists(
        st.one_of(
            literals,
            fast_names,
            fast_ops,
            st.sampled_from(["and", "-5", "-0", "00", "-", "--1", "5-3", "²", "1 ", ""]),
            st.text(max_size=3),
        ),
        min_size=1,
        max_size=9,
    ),
    st.sampled_from([" ", "  ", "\t"]),
)
def test_the_split_scan_reads_what_the_regular_expression_reads(
    tokens: list[str], sep: str
) -> None:
    from aa.router.patterns.predicates.fastpath import (
        _TOKEN,
        _UNUSUAL,
        _parse_spaced,
        _parse_tokens,
    )

    source = sep.join(tokens)
    split = _parse_spaced(source)
    if split is _UNUSUAL:
        return
    scanned = _parse_tokens(_TOKEN.findall(source.rstrip()))
    assert (split is None) == (scanned is None), source
    if split is not None and scanned is not None:
        shape = [
            (a.op, a.left, type(a.left[1]), a.right, type(a.right[1]), a.reads)
            for a in split.dnf[0]
        ]
        assert shape == [
            (a.op, a.left, type(a.left[1]), a.right, type(a.right[1]), a.reads)
            for a in scanned.dnf[0]
        ], source
        assert (split.names, split.mentions) == (scanned.names, scanned.mentions)


def test_a_params_free_subscribe_read_and_planned_at_once_is_planned_as_in_two_steps(
    engine: PatternEngine,
) -> None:
    """`plan_spaced` (the BE-Tree-style subscribe: read and planned in one pass, no atoms
    built) gives the plan that `parse_conjunction` then `flat_plan` give, access, checks and
    types all, on random sources of names (builtins, keywords too), operators, integers and
    a few oddities; and it is taken whenever the source is single-spaced names, operators
    and integers that `flat_plan` plans."""
    from aa.router.patterns.predicates.fastpath import _UNUSUAL, _parse_spaced, parse_conjunction
    from aa.router.patterns.predicates.flatplan import flat_plan, plan_spaced

    rng = random.Random(3)
    for k, source in enumerate(
        ["A == 1", "A == 1", "B > 2", "b2 == 7", "b2 == -12", "B < 5"]
    ):  # postings of unequal sizes
        engine.subscribe(k, expr(source))
    builtins, posting = engine.sandbox.expr_builtins, engine._index.posting
    names, ints = ["A", "B", "b2"], ["0", "-0", "1", "-12", "7", "True", "False", "None"]
    odd = ["len", "in", "_x", "1.5", "'a'", "007", "A", "1"]

    def operand(pool: list[str]) -> str:
        return rng.choice(odd) if rng.random() < 0.05 else rng.choice(pool)

    def op() -> str:
        return rng.choice(["==", "==", "!=", "<", "<=", ">", ">=", "is"])

    def part() -> str:
        shape = rng.choice(["nc", "nc", "cn", "cnc", "nn", "cc", "n"])
        return f" {op()} ".join(operand(names if x == "n" else ints) for x in shape)

    def seen(plan: Any) -> tuple[Any, ...]:
        c = plan.conjs[0]
        rest = [(w, k, fn, x, type(x)) for w, k, fn, x in zip(*[iter(c.rest)] * 4)]
        return (
            c.access.kind,
            c.access.src,
            c.access.keys,
            [type(k) for k in c.access.keys],
            rest,
            plan.shadow,
            plan.pinned,
            plan.exact,
            plan.scan,
            len(plan.conjs),
        )

    planned = 0
    for _ in range(4000):
        source = rng.choice([" and "] * 8 + [" or ", "  and "]).join(
            part() for _ in range(rng.randint(1, 4))
        ) + rng.choice(["", "", "", " "])
        once = plan_spaced(source, builtins, posting)
        g = parse_conjunction(source)
        twice = flat_plan(g.dnf[0], {}, builtins, posting) if g is not None else None
        if once is not None:
            planned += 1
            assert twice is not None and seen(once) == seen(twice), source
        elif twice is not None:
            assert _parse_spaced(source) is _UNUSUAL, (
                source
            )  # a float, a string: the regular expression's reading
    assert planned > 300


# -- three values: a comparison that cannot be made is unknown, not the whole pattern ------

#: (source, event values, match?) — the same answers in the predicate tier and the kernel.
READS_LIKE_PYTHON = [
    ('A > 1 or B == "x"', {"B": "x"}, True),  # the missing A is only its own comparison
    ('A > 1 or B == "x"', {"B": "y"}, False),
    ('A > 1 or B == "x"', {"A": "hot", "B": "x"}, True),  # a comparison that does not apply
    ('A > 1 and B == "x"', {"B": "x"}, False),
    ("not (A > 1)", {"B": 1}, False),  # unknown stays unknown: no match
    ("not (A > 1)", {"A": 0}, True),
    ("A != 1", {"B": 1}, False),  # needs A, as A == 1 does
    ('not (A > 1 and B == "x")', {"B": "y"}, True),  # false and unknown: false
    ('not (A > 1 or B == "x")', {"B": "y"}, False),  # unknown or false: unknown
    ('(A > 1 or B == "x") and C == 1', {"B": "x", "C": 1}, True),
    ('"A" not in event or A > 1', {"B": 1}, True),
    ("(A or 0) > 1", {"B": 1}, False),  # inside a comparison: Python's own `or`
]


@pytest.mark.parametrize("source, values, expected", READS_LIKE_PYTHON)
def test_a_missing_name_makes_only_its_own_comparison_false(
    engine: PatternEngine, source: str, values: dict[str, Any], expected: bool
) -> None:
    assert engine.tier(expr(source)) == PREDICATE_TIER
    engine.subscribe("p", expr(source))
    assert (keys(engine.match(Event(values=values))) == ["p"]) is expected
    # The python kernel (expressions outside the grammar, in workers) answers the same.
    with (
        mock.patch.object(engine_module, "parse_predicate", return_value=None),
        mock.patch.object(engine_module, "parse_conjunction", return_value=None),
        mock.patch.object(engine_module, "plan_spaced", return_value=None),
    ):
        kernel = engine.matcher(expr(source + " "), {})  # another source: a new instance
        assert engine.tier(expr(source + " ")) == SANDBOX_TIER
    assert kernel(Event(values=values)) is expected


def test_an_unknown_pattern_tells_its_first_error_and_a_decided_one_tells_none() -> None:
    told: list[str] = []
    host = HostFacts(router_id="r", router_name="r", clock=lambda: NOW, peer_count=lambda: 0)
    engine = PatternEngine(
        host=host,
        on_failure=lambda *a: None,
        on_errors=lambda keys, notice: told.append(notice.error),
        monotonic=lambda: 0.0,
    )
    engine.subscribe("k", expr('sorted([1]) and (1 / Count > 1 or Flag == "x")'))  # the kernel
    assert engine.tier(expr('sorted([1]) and (1 / Count > 1 or Flag == "x")')) == SANDBOX_TIER
    assert keys(engine.match(Event(values={"Count": 0, "Flag": "x"}))) == ["k"]
    assert told == []  # the `or` is decided: its other operand's error is no matter
    assert keys(engine.match(Event(values={"Count": 0}))) == []
    assert told == ["ZeroDivisionError: division by zero"]
