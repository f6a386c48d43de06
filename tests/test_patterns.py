"""The pattern engine as a subscriber sees it: expressions, scripts, XPath, params and
shared instances (hostile patterns are in test_patterns_sandbox.py)."""

from __future__ import annotations

from collections.abc import Hashable
from datetime import UTC, datetime
from typing import Any

import pytest

import aa.router.patterns as patterns
from aa.mesh import Event, InvalidValue, PatternError, PatternSpec, UsageError
from aa.router.patterns import HostFacts, PatternEngine, SandboxLimits

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)

ALARM = """\
if Temperature > 100:
    if not state.get("high"):
        state["high"] = True
        forward()
else:
    state["high"] = False
"""

ROUND_ROBIN = """\
n = state.get("n", 0)
forward(to=subscribers[n % len(subscribers)])
state["n"] = n + 1
"""


class Recorder:
    def __init__(self) -> None:
        self.failures: list[tuple[list[Hashable], str, str]] = []

    def __call__(self, keys: list[Hashable], code: str, message: str) -> None:
        self.failures.append((keys, code, message))


@pytest.fixture
def failures() -> Recorder:
    return Recorder()


@pytest.fixture
def engine(failures: Recorder) -> PatternEngine:
    host = HostFacts(
        router_id="r-1", router_name="lab-router", clock=lambda: NOW, peer_count=lambda: 3
    )
    return PatternEngine(host=host, on_failure=failures)


def expr(source: str) -> PatternSpec:
    return PatternSpec(source=source)


def script(source: str) -> PatternSpec:
    return PatternSpec(kernel="python", format="script", source=source)


def xpath(source: str) -> PatternSpec:
    return PatternSpec(kernel="xpath", format="expr", source=source)


def ev(type: str | None = None, meta: dict[str, Any] | None = None, **values: Any) -> Event:
    return Event(values=values, type=type, meta=meta or {}, id="e-1")


def keys(deliveries: list[tuple[Hashable, Event]]) -> list[Hashable]:
    return [k for k, _ in deliveries]


def test_public_api() -> None:
    assert {
        "PatternEngine",
        "PatternSet",
        "PREDICATE_TIER",
        "WORKER_TIER",
        "SANDBOX_TIER",
        "Matcher",
        "pattern_warnings",
    } <= set(patterns.__all__)  # the exact list: tests/test_exports.py


def test_standalone_matcher_is_no_subscriber(engine: PatternEngine, failures: Recorder) -> None:
    hot = engine.matcher(expr("Temperature > limit"), {"limit": 30})
    runaway = engine.matcher(script("while True: pass"))
    assert hot(ev(Temperature=31)) and not hot(ev(Temperature=3))
    assert (
        not runaway(ev())
        and runaway.stopped == "pattern stopped: exceeded its time budget of 20 ms"
    )
    assert len(engine) == 0 and engine.match(ev(Temperature=31)) == [] and failures.failures == []


# -- expressions ---------------------------------------------------------------------------


def test_expression_matches_and_delivers_the_same_event(engine: PatternEngine) -> None:
    engine.subscribe("a", expr('Temperature > 100 and Sensor.startswith("lab")'))
    hot = ev(Temperature=101, Sensor="lab3")
    assert engine.match(hot) == [("a", hot)]
    assert engine.match(hot)[0][1] is hot
    assert engine.match(ev(Temperature=99, Sensor="lab3")) == []
    assert engine.match(ev(Temperature=101, Sensor="yard")) == []


@pytest.mark.parametrize(
    "source",
    [
        "Missing > 1",
        "Sensor > 100",
        "Temperature / 0",
        "L[10]",
        "d['nope']",
        "Sensor.nothing()",
        "int('x')",
    ],
)
def test_errors_in_expressions_mean_no_match(
    engine: PatternEngine, failures: Recorder, source: str
) -> None:
    engine.subscribe("a", expr(source))
    assert engine.match(ev(Temperature=1, Sensor="lab", L=[1], d={})) == []
    assert failures.failures == [] and len(engine) == 1


def test_type_meta_event_and_params_are_reachable(engine: PatternEngine) -> None:
    engine.subscribe("t", expr('type == "reading" and meta["client"] == "c1"'))
    engine.subscribe(
        "e",
        expr('event.id == "e-1" and event["odd name"] == 1 and event.values["Temperature"] == 5'),
    )
    engine.subscribe("p", expr('params["limit"] == 3 and Temperature > limit'), {"limit": 3})
    engine.subscribe("v", expr("event.Temperature == 5 and event.get('x', 7) == 7"))
    e = Event(
        values={"Temperature": 5, "odd name": 1}, type="reading", meta={"client": "c1"}, id="e-1"
    )
    assert keys(engine.match(e)) == ["t", "e", "p", "v"]


def test_a_publishers_values_change_no_param_and_no_name_of_the_language(
    engine: PatternEngine,
) -> None:
    """An event carrying values named `threshold` and `type` changes neither the subscriber's
    `threshold` nor what `type` means, in the predicate tier, in the python kernel and in
    scripts (it reached every subscriber of `Temperature > threshold` before); such values
    are read as `event["..."]`; a builtin's name is the event's value, as in Python."""
    engine.subscribe("p", expr("Temperature > threshold and type == 'reading'"), {"threshold": 50})
    engine.subscribe(
        "k",
        expr("Temperature > threshold and type == 'reading' and any(True for _ in [1])"),
        {"threshold": 50},
    )
    engine.subscribe(
        "s",
        script("if Temperature > threshold and event.type == 'reading':\n    forward()"),
        {"threshold": 50},
    )
    engine.subscribe("v", expr("event['threshold'] == 1 and event['type'] == 'value'"))
    engine.subscribe("m", expr("max > 5"))
    assert engine.tier(expr("Temperature > threshold and type == 'reading'")) == "predicate"
    hostile = Event(
        values={"Temperature": 20, "threshold": 1, "type": "value", "max": 9, "params": {}},
        type="reading",
    )
    assert keys(engine.match(hostile)) == ["v", "m"]
    assert keys(
        engine.match(Event(values={"Temperature": 60, "threshold": 100}, type="reading"))
    ) == ["p", "k", "s"]


def test_expressions_can_use_builtins_and_modules(engine: PatternEngine) -> None:
    engine.subscribe(
        "a",
        expr("math.sqrt(X) == 3 and re.match('la', S) and max(L) == 3 and any(v > 2 for v in L)"),
    )
    engine.subscribe("b", expr("f'{X:>4}' == '   9' and isinstance(S, str) and len(str(L)) == 9"))
    assert keys(engine.match(ev(X=9, S="lab", L=[1, 2, 3]))) == ["a", "b"]


def test_subscription_order_across_patterns(engine: PatternEngine) -> None:
    engine.subscribe("z", expr("X > 0"))
    engine.subscribe("a", expr("X > 1"))
    engine.subscribe("m", expr("X > 0"))
    assert keys(engine.match(ev(X=5))) == ["z", "a", "m"]


# -- instances, params, update -------------------------------------------------------------


def test_same_pattern_is_one_instance(engine: PatternEngine) -> None:
    engine.subscribe("a", expr("X > 1"))
    engine.subscribe("b", expr("X > 1"))
    engine.subscribe("c", expr("X > 2"))
    engine.subscribe("d", script("forward()"))
    assert (len(engine), engine.instance_count, engine.keys()) == (4, 3, ["a", "b", "c", "d"])
    engine.unsubscribe("a")
    engine.unsubscribe("unknown")
    assert engine.instance_count == 3
    engine.unsubscribe("b")
    assert (len(engine), engine.instance_count) == (2, 2)


def test_subscribe_twice_and_unknown_update_are_usage_errors(engine: PatternEngine) -> None:
    engine.subscribe("a", expr("X > 1"))
    with pytest.raises(UsageError):
        engine.subscribe("a", expr("X > 2"))
    with pytest.raises(UsageError):
        engine.update("nobody", {"x": 1})
    with pytest.raises(InvalidValue):
        engine.subscribe("b", expr("X > 1"), {"bad": object()})


def test_params_are_per_subscriber_and_update_merges(engine: PatternEngine) -> None:
    engine.subscribe(
        "low", expr("Temperature > threshold and Room == room"), {"threshold": 10, "room": "A"}
    )
    engine.subscribe(
        "high", expr("Temperature > threshold and Room == room"), {"threshold": 50, "room": "A"}
    )
    assert engine.instance_count == 1
    assert keys(engine.match(ev(Temperature=30, Room="A"))) == ["low"]
    engine.update("low", {"threshold": 40})  # room stays "A"
    assert keys(engine.match(ev(Temperature=30, Room="A"))) == []
    assert keys(engine.match(ev(Temperature=45, Room="A"))) == ["low"]
    engine.update("high", {"threshold": 40})
    assert keys(engine.match(ev(Temperature=45, Room="A"))) == ["low", "high"]


def test_script_state_is_shared_by_a_group(engine: PatternEngine) -> None:
    engine.subscribe("a", script(ALARM))
    engine.subscribe("b", script(ALARM))
    assert keys(engine.match(ev(Temperature=101))) == ["a", "b"]
    engine.subscribe("late", script(ALARM))  # joins the group: the alarm is already raised
    assert keys(engine.match(ev(Temperature=102))) == []
    assert keys(engine.match(ev(Temperature=90))) == []
    assert keys(engine.match(ev(Temperature=105))) == ["a", "b", "late"]


def test_update_moves_state_with_a_lone_subscriber(engine: PatternEngine) -> None:
    counting = script(
        "state['n'] = state.get('n', 0) + step\nforward(event.with_values(n=state['n']))"
    )
    engine.subscribe("a", counting, {"step": 1})
    engine.match(ev())
    engine.match(ev())
    engine.update("a", {"step": 10})  # alone: state moves along
    assert [e.values["n"] for _, e in engine.match(ev())] == [12]


def test_update_copies_state_when_others_stay(engine: PatternEngine) -> None:
    counting = script(
        "state['n'] = state.get('n', 0) + step\nforward(event.with_values(n=state['n']))"
    )
    engine.subscribe("a", counting, {"step": 1})
    engine.subscribe("b", counting, {"step": 1})
    engine.match(ev())
    engine.update("b", {"step": 100})
    out = {k: e.values["n"] for k, e in engine.match(ev())}
    assert out == {"a": 2, "b": 101}


# -- scripts -------------------------------------------------------------------------------


def test_the_papers_high_temperature_alarm(engine: PatternEngine) -> None:
    engine.subscribe("alarm", script(ALARM))
    readings = [90, 101, 102, 99, 105, 106]
    fired = [t for t in readings if engine.match(ev(Temperature=t))]
    assert fired == [101, 105]


def test_script_forward_default_is_the_event_itself(engine: PatternEngine) -> None:
    engine.subscribe("a", script("forward()"))
    e = ev(X=1)
    assert engine.match(e)[0][1] is e


def test_round_robin_over_subscribers(engine: PatternEngine) -> None:
    for k in ("w1", "w2", "w3"):
        engine.subscribe(k, script(ROUND_ROBIN))
    got = [keys(engine.match(ev(job=i))) for i in range(6)]
    assert got == [["w1"], ["w2"], ["w3"], ["w1"], ["w2"], ["w3"]]


def test_forward_to_subscriber_by_id_and_params(engine: PatternEngine) -> None:
    src = "for s in subscribers:\n    if s.params['room'] == Room:\n        forward(to=s.id)"
    engine.subscribe("a", script(src), {"room": "A"})
    engine.subscribe("b", script(src), {"room": "B"})
    assert keys(engine.match(ev(Room="B"))) == ["b"]


def test_derived_events(engine: PatternEngine) -> None:
    src = (
        "forward(event.copy(values={'C': (F - 32) * 5 / 9}))\n"
        "forward(new_event({'alarm': F > 200}, type='alarm'))\n"
        "forward(event.with_values(F=0))"
    )
    engine.subscribe("a", script(src))
    source = ev(type="reading", meta={"client": "c1"}, F=212)
    out = [e for _, e in engine.match(source)]
    assert out[0].values == {"C": 100.0} and out[0].type == "reading"
    assert out[1].values == {"alarm": True} and out[1].type == "alarm"
    assert out[2].values == {"F": 0}
    assert all(e.meta == {"client": "c1"} and e.id is None for e in out)
    assert source.values == {"F": 212}


def test_scripts_cannot_change_the_shared_event(engine: PatternEngine) -> None:
    engine.subscribe("a", script("L.append(4)\nevent.values['L'].append(5)\nforward()"))
    engine.subscribe("b", expr("L == [1, 2]"))
    e = ev(L=[1, 2])
    assert keys(engine.match(e)) == ["a", "b"]
    assert e.values["L"] == [1, 2]


def test_script_errors_forward_nothing(engine: PatternEngine, failures: Recorder) -> None:
    engine.subscribe("a", script("forward()\nif Temperature > 1:\n    forward()"))
    assert keys(engine.match(ev(Other=1))) == []  # NameError after a forward: nothing
    assert keys(engine.match(ev(Temperature=5))) == ["a", "a"]
    assert failures.failures == []


def test_script_sees_router_and_modules(engine: PatternEngine) -> None:
    src = (
        "import statistics\nfrom collections import deque\n"
        "w = state.setdefault('w', [])\nw.append(X)\n"
        "if router.name == 'lab-router' and router.peer_count == 3 and router.time.year == 2024:\n"
        "    forward(event.with_values(mean=statistics.mean(w), n=len(deque(w))))"
    )
    engine.subscribe("a", script(src))
    engine.match(ev(X=1))
    assert [e.values["mean"] for _, e in engine.match(ev(X=3))] == [2]


def test_try_except_and_functions_work_in_scripts(engine: PatternEngine) -> None:
    src = (
        "def safe_ratio(a, b):\n"
        "    try:\n        return a / b\n    except ZeroDivisionError:\n        return None\n"
        "state['n'] = state.get('n', 0)\nstate['n'] += 1\n"
        "if safe_ratio(A, B) is None:\n    forward()"
    )
    engine.subscribe("a", script(src))
    assert keys(engine.match(ev(A=1, B=0))) == ["a"]
    assert keys(engine.match(ev(A=1, B=2))) == []


# -- xpath ---------------------------------------------------------------------------------


def test_xpath_patterns(engine: PatternEngine) -> None:
    engine.subscribe("t", xpath("/event/values/Temperature > 100"))
    engine.subscribe("p", xpath("/event/values/Temperature > $threshold"), {"threshold": 50})
    engine.subscribe("m", xpath("/event/@type = 'reading' and /event/meta/client = 'c1'"))
    engine.subscribe(
        "n", xpath("/event/values/value[@name='odd name'] = 'x' and /event/values/On = 'true'")
    )
    engine.subscribe("l", xpath("count(/event/values/L/item) = 2 and /event/values/Map/Room = 'A'"))
    e = Event(
        values={"Temperature": 101, "odd name": "x", "On": True, "L": [1, 2], "Map": {"Room": "A"}},
        type="reading",
        meta={"client": "c1"},
    )
    assert keys(engine.match(e)) == ["t", "p", "m", "n", "l"]
    assert keys(engine.match(ev(Temperature=60))) == ["p"]
    assert keys(engine.match(ev(Other=1))) == []


def test_xpath_missing_variable_is_no_match(engine: PatternEngine, failures: Recorder) -> None:
    engine.subscribe("a", xpath("/event/values/T > $nope"))
    assert engine.match(ev(T=1)) == [] and failures.failures == []


# -- compile errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (expr("Temperature >"), ["line 1, at its end"]),  # Python's column 0: the end, said so
        (expr("x >>> ("), ["line 1, col 5"]),
        (expr("import os"), ["line 1", 'it is statements: a script pattern, format "script"']),
        (script("if X:\nforward()"), ["line 2", "indented block"]),
        (script("return 1"), ["line 1", "'return' outside function"]),
        (xpath("/event/values/T >"), ["line 1", "column"]),
    ],
)
def test_compile_errors_are_clear(
    engine: PatternEngine, spec: PatternSpec, words: list[str]
) -> None:
    with pytest.raises(PatternError) as info:
        engine.subscribe("a", spec)
    assert info.value.code == "pattern-compile"
    assert all(w in info.value.message for w in words), info.value.message
    assert len(engine) == 0 and engine.instance_count == 0


# -- quenching -----------------------------------------------------------------------------


def test_matches_prototype(engine: PatternEngine) -> None:
    engine.subscribe("snow", expr("SnowDepth == 80"))
    engine.subscribe("sensor", expr("SnowDepthSensor == True"))
    engine.subscribe("all", expr("True"))
    engine.subscribe("alarm", script(ALARM))
    proto = Event(values={"SnowDepthSensor": True, "SnowDepth": 50})
    assert not engine.matches_prototype("snow", proto)
    assert engine.matches_prototype("sensor", proto)
    assert engine.matches_prototype("all", proto)
    assert not engine.matches_prototype("all", proto, needs_names=True)
    hot = Event(values={"Temperature": 120})
    assert engine.matches_prototype("alarm", hot)
    assert engine.matches_prototype("alarm", hot)  # dry runs leave the state alone
    assert keys(engine.match(hot)) == ["all", "alarm"]
    with pytest.raises(UsageError):
        engine.matches_prototype("nobody", hot)


# -- limits --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"time_budget": 0},
        {"time_budget": float("nan")},
        {"max_state_bytes": 10},
        {"max_sequence": "x"},
        {"max_patterns_per_owner": 0},
    ],
)
def test_limits_are_validated(kwargs: dict[str, Any]) -> None:
    with pytest.raises(UsageError):
        SandboxLimits(**kwargs)
