"""Probation (issue 11): new worker-tier patterns run on workers of their own until they
have proved themselves, so newcomers' first strikes never reach the patterns that have; a
pattern moving off probation keeps its state and misses or doubles no event."""

from __future__ import annotations

import collections
import datetime as dt
import os
import time
from typing import Any

import pytest
from support import paced, wait_for

from aa.mesh import Event
from aa.router import Router, RouterConfig, WorkerConfig
from aa.router.patterns.workers import WorkerPool
from aa.router.patterns.workers.carry import NotPortable, dump_state, load_state

#: Probation as short as a test wants it: five events and 50 ms.
QUICK = WorkerConfig(probation_events=5, probation_seconds=0.05)


@pytest.fixture
async def router(request: Any) -> Any:
    """A router whose worker config is the test's parameter (`indirect`), else `QUICK`."""
    async with Router(
        RouterConfig(port=0, name="test", workers=getattr(request, "param", QUICK))
    ) as r:
        yield r


COUNTER = "state['n'] = state.get('n', 0) + 1\nforward(event.with_values(n=state['n']))"


def pool_of(router: Router) -> WorkerPool:
    pool = router.engine.workers
    assert pool is not None
    return pool


def on_probation(pool: WorkerPool, source: str) -> bool:
    """Whether the pattern of *source* runs on a probation worker."""
    (inst,) = [i for i in pool._instances.values() if i.spec_key[2] == source]
    return inst.worker.probation


async def test_a_pattern_leaves_probation_with_its_state_and_every_event(router, make_client):
    got: list[Event] = []
    sub = await (await make_client(client_id="counting")).subscribe(
        COUNTER, got.append, format="script"
    )
    pool = pool_of(router)
    assert on_probation(pool, COUNTER)
    pub = await make_client()
    sent = 0
    deadline = time.monotonic() + 20
    while pool.counters["graduated"] == 0:  # paced, so the probation worker has quiet moments
        assert time.monotonic() < deadline, pool.counters
        pub.publish_nowait({"i": sent})
        sent += 1
        await wait_for(lambda sent=sent: len(got) == sent, 10)
    assert not on_probation(pool, COUNTER)
    for _ in range(50):  # now on the regular worker: a burst, queued behind the move
        pub.publish_nowait({"i": sent})
        sent += 1
    await wait_for(lambda: len(got) == sent, 10)
    # The count went on where it was: the state moved, no event was missed or seen twice.
    assert [e.values["n"] for e in got] == list(range(1, sent + 1))
    assert [e.values["i"] for e in got] == list(range(sent))
    assert sub.failure is None
    workers = router.stats()["workers"]  # what /health shows an operator
    assert (
        workers["graduated"] == 1
        and workers["patterns_on_probation"] == 0
        and workers["regular_workers"] == 1
    )


async def test_a_state_that_cannot_be_carried_keeps_its_pattern_on_probation(router, make_client):
    source = (
        "if 'it' not in state:\n"
        "    state['it'] = iter(range(10 ** 6))\n"
        "forward(event.with_values(n=next(state['it'])))"
    )
    got: list[Event] = []
    await (await make_client()).subscribe(source, got.append, format="script")
    pool = pool_of(router)
    pub = await make_client()
    for i in range(30):
        pub.publish_nowait({"i": i})
        await wait_for(lambda i=i: len(got) == i + 1, 10)
    (inst,) = pool._instances.values()
    assert inst.worker.probation and pool.counters["graduated"] == 0
    assert inst.next_try > QUICK.probation_events  # it was asked, and will be asked again later
    assert [e.values["n"] for e in got] == list(range(30))


async def test_newcomers_striking_at_once_do_not_delay_a_pattern_that_proved_itself(
    router, make_client
):
    """Twenty new clients whose scripts get stuck in C on their first event (each costs its
    worker a kill: ~40 ms) against a bystander that left probation: it gets its deliveries
    as promptly as before. Without probation it shared a worker with about half of them
    (`test_without_probation_the_same_strike_delays_the_bystander`)."""
    delays = await strike(router, make_client, attackers=20)
    stretch = max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    assert max(delays) < 0.1 * stretch, f"bystander delays {sorted(delays)[-5:]}"


@pytest.mark.parametrize("router", [WorkerConfig(probation_workers=0)], indirect=True)
async def test_without_probation_the_same_strike_delays_the_bystander(router, make_client):
    """The measurement above means something: with no probation workers, the same strike
    holds the bystander's deliveries for several kills."""
    delays = await strike(router, make_client, attackers=20)
    assert max(delays) > 0.2, f"bystander delays {sorted(delays)[-5:]}"


async def strike(router: Router, make_client: Any, attackers: int) -> list[float]:
    """A bystander script proves itself (or, without probation, just runs), then
    *attackers* new clients subscribe a catastrophic regular expression each and an event
    sets them all off; returns the bystander's delays (receipt - publication) from then on."""
    seen: dict[int, float] = {}
    bystander = await make_client(client_id="bystander")
    await bystander.subscribe(
        "forward()", lambda e: seen.setdefault(e.values["i"], time.perf_counter()), format="script"
    )
    pool = pool_of(router)
    config = pool.config
    pub = await make_client(client_id="publisher")
    i = 0
    while config.probation_count and not pool.counters["graduated"] or i < 10:
        pub.publish_nowait({"i": i, "t": time.perf_counter()})
        i += 1

        def arrived(i: int = i) -> bool:
            return i - 1 in seen

        await wait_for(arrived, 10)
    assert not config.probation_count or not on_probation(pool, "forward()")
    stuck = "import re\nre.match('(a+)+$', 'a' * 34 + 'b')"
    for n in range(attackers):
        c = await make_client(client_id=f"attacker{n}")
        await c.subscribe(f"{stuck}  # {n}", format="script")
    sent: dict[int, float] = {}
    first = i
    async for _ in paced(200, 40):  # 200 events/s for 0.2 s: the strike and what follows it
        sent[i] = time.perf_counter()
        pub.publish_nowait({"i": i})
        i += 1
    await wait_for(lambda: all(k in seen for k in sent), 60)
    assert pool.counters["kills"] >= 1  # the strike did happen
    return [seen[k] - sent[k] for k in range(first, i)]


@pytest.mark.parametrize(
    "router", [WorkerConfig(probation_events=5, probation_seconds=0.05, workers=1)], indirect=True
)
async def test_a_pattern_that_gets_a_regular_worker_killed_takes_its_clients_others_back(
    router, make_client
):
    neighbour_got: list[Event] = []
    neighbour = await make_client(client_id="neighbour")
    await neighbour.subscribe("forward()", neighbour_got.append, format="script")
    pool = pool_of(router)
    sleeper = await make_client(client_id="sleeper")
    trigger = "import re\nif i == -1:\n    re.match('(a+)+$', 'a' * 34 + 'b')\nforward()"
    other = "if i >= 0:\n    forward()"
    bad = await sleeper.subscribe(trigger, format="script")
    quiet_got: list[Event] = []
    await sleeper.subscribe(other, quiet_got.append, format="script")
    pub = await make_client()
    i = 0
    while pool.counters["graduated"] < 3:
        pub.publish_nowait({"i": i})
        i += 1
        await wait_for(lambda i=i: len(neighbour_got) == i, 10)
    pub.publish_nowait({"i": -1})  # the sleeper strikes, on the regular worker
    await wait_for(lambda: bad.failure is not None, 20)
    assert bad.failure.code == "pattern-timeout"
    assert pool.counters["demoted"] == 1
    assert on_probation(pool, other) and not on_probation(pool, "forward()")
    pub.publish_nowait({"i": i})
    await wait_for(lambda: quiet_got and quiet_got[-1].values["i"] == i, 10)  # still served
    await wait_for(lambda: len(neighbour_got) == i + 2, 10)


def test_carried_states_are_plain_data_only() -> None:
    state = {
        "n": 3,
        "big": 2**100,
        "f": 1.5,
        "s": "x",
        "b": b"y",
        "none": None,
        "c": 1j,
        "l": [1, (2, 3)],
        "set": {1, 2},
        "fs": frozenset({(1, 2)}),
        ("k", 1): "tuple key",
        "q": collections.deque([1, 2], 5),
        "counter": collections.Counter("hello"),
        "od": collections.OrderedDict(a=1),
        "dd": collections.defaultdict(list, {"a": [1]}),
        "when": dt.datetime(2026, 11, 24, tzinfo=dt.timezone(dt.timedelta(hours=2))),
        "day": dt.date(2026, 11, 24),
        "gap": dt.timedelta(days=1, seconds=2),
    }
    back = load_state(dump_state(state))
    assert back == state
    assert type(back["q"]) is collections.deque and back["q"].maxlen == 5
    assert back["dd"].default_factory is list and back["when"].utcoffset() == dt.timedelta(hours=2)
    for bad in ({"g": (x for x in ())}, {"f": len}, {"dd": collections.defaultdict(lambda: 1)}):
        with pytest.raises(NotPortable):
            dump_state(bad)
    deep: Any = []
    for _ in range(100):
        deep = [deep]
    with pytest.raises(NotPortable):
        dump_state({"deep": deep})
    shared: Any = [[]] * 1000  # three objects in memory, a million lists written out
    with pytest.raises(NotPortable):
        dump_state({"x": [shared] * 1000})
    with pytest.raises(NotPortable):  # crafted bytes from a worker broken into
        load_state(b"\x92\xa1d\x92\xa1x" + b"\x92\xa1l\xdc\x4e\x20" + b"\x92\xa1l\x90" * 20_000)
    with pytest.raises(NotPortable):
        load_state(b"\x81\xa1x\x01")  # a bare map: not what dump_state writes
    for blob in (b"\x01", dump_state({"a": 1})[:-1], b"\x92\xa1Z\x90", b"\x90"):
        with pytest.raises(NotPortable):
            load_state(blob)


async def test_new_params_on_a_proven_pattern_are_new_behaviour_and_go_on_probation(
    router, make_client
):
    """Joining a pattern that left probation with params nobody there has would run new
    behaviour beside the proven patterns: those subscribers start on probation, in a second
    instance of the pattern, and join the proven one when they leave it."""
    source = "if i % k == 0:\n    forward()"
    first: list[Event] = []
    await (await make_client(client_id="first")).subscribe(
        source, first.append, params={"k": 1}, format="script"
    )
    pool = pool_of(router)
    pub = await make_client()
    sent = 0

    async def publish_until(condition: Any) -> None:
        nonlocal sent
        deadline = time.monotonic() + 20
        while not condition():
            assert time.monotonic() < deadline, pool.counters
            pub.publish_nowait({"i": sent})
            sent += 1

            def caught_up(sent: int = sent) -> bool:
                return len(first) == sent

            await wait_for(caught_up, 10)

    await publish_until(lambda: pool.counters["graduated"] == 1)
    same: list[Event] = []
    other: list[Event] = []
    await (await make_client(client_id="same")).subscribe(
        source, same.append, params={"k": 1}, format="script"
    )
    await (await make_client(client_id="other")).subscribe(
        source, other.append, params={"k": 2}, format="script"
    )
    places = {(i.spec_key[2], i.worker.probation): len(i.subs) for i in pool._instances.values()}
    assert places == {(source, False): 2, (source, True): 1}  # "same" joined the proven instance
    joined = sent
    await publish_until(lambda: pool.counters["graduated"] == 2)
    assert [(i.worker.probation, len(i.subs)) for i in pool._instances.values()] == [(False, 3)]
    await publish_until(lambda: sent >= joined + 60)
    await wait_for(
        lambda: (
            len(same) == sent - joined and len(other) == len(range(joined + joined % 2, sent, 2))
        ),
        10,
    )
    assert [e.values["i"] for e in other] == [i for i in range(joined, sent) if i % 2 == 0]


@pytest.mark.parametrize("router", [WorkerConfig(probation_workers=0, workers=1)], indirect=True)
async def test_a_stop_takes_only_the_subscribers_whose_params_caused_it(router, make_client):
    """One script, two subscribers with their own params: the params of one make it loop
    past its budget (a stop by the sandbox's ticks), or hang in C (a kill); the other
    subscriber of the same pattern goes on."""
    source = (
        "import re\n"
        "if slow == 1:\n"
        "    while True:\n"
        "        pass\n"
        "if slow == 2:\n"
        "    re.match('(a+)+$', 'a' * 34 + 'b')\n"
        "forward()"
    )
    honest: list[Event] = []
    await (await make_client(client_id="honest")).subscribe(
        source, honest.append, params={"slow": 0}, format="script"
    )
    looping = await (await make_client(client_id="looping")).subscribe(
        source, params={"slow": 1}, format="script"
    )
    hanging = await (await make_client(client_id="hanging")).subscribe(
        source, params={"slow": 2}, format="script"
    )
    pub = await make_client()
    for i in range(5):
        pub.publish_nowait({"i": i})
    await wait_for(lambda: looping.failure is not None and hanging.failure is not None, 30)
    assert looping.failure.code == "pattern-timeout" and hanging.failure.code == "pattern-timeout"
    assert "worker process was replaced" in str(hanging.failure)
    pub.publish_nowait({"i": 5})
    await wait_for(lambda: honest and honest[-1].values["i"] == 5, 10)
    assert sorted(e.values["i"] for e in honest) == list(range(6))


@pytest.mark.parametrize("router", [WorkerConfig(probation_workers=0, workers=1)], indirect=True)
async def test_a_kill_tells_params_apart_as_buckets_do(router, make_client):
    """`{"slow": True}` and `{"slow": 1}` are equal in Python but two buckets (two states):
    the kill the second one causes stops only its own subscribers."""
    source = "import re\nif str(slow) == '1':\n    re.match('(a+)+$', 'a' * 34 + 'b')\nforward()"
    honest: list[Event] = []
    await (await make_client(client_id="honest")).subscribe(
        source, honest.append, params={"slow": True}, format="script"
    )
    hanging = await (await make_client(client_id="hanging")).subscribe(
        source, params={"slow": 1}, format="script"
    )
    pub = await make_client()
    pub.publish_nowait({"i": 0})
    await wait_for(lambda: hanging.failure is not None, 30)
    pub.publish_nowait({"i": 1})
    await wait_for(lambda: len(honest) == 2, 10)


@pytest.mark.parametrize("router", [WorkerConfig(probation_workers=0, workers=1)], indirect=True)
async def test_an_update_behind_a_strike_does_not_pass_the_blame_to_the_new_params(
    router, make_client
):
    """The attacker sets off a hang, then updates its params to the victim's at once: the
    worker is still running the old bucket, and the kill must stop that one."""
    source = (
        "import re\nif slow == 2 and i == -1:\n    re.match('(a+)+$', 'a' * 40 + 'b')\nforward()"
    )
    honest: list[Event] = []
    await (await make_client(client_id="honest")).subscribe(
        source, honest.append, params={"slow": 0}, format="script"
    )
    attacker = await make_client(client_id="attacker")
    hanging = await attacker.subscribe(source, params={"slow": 2}, format="script")
    pub = await make_client()
    pub.publish_nowait({"i": 0})
    await wait_for(lambda: len(honest) == 1, 10)  # the worker is up
    await attacker.publish({"i": -1})
    (worker,) = pool_of(router)._slots
    await wait_for(lambda: worker.in_flight is not None, 10)  # the worker runs the batch that hangs
    await hanging.update(slow=0)  # queued behind it
    await wait_for(lambda: hanging.failure is not None, 30)
    pub.publish_nowait({"i": 1})
    await wait_for(lambda: honest and honest[-1].values["i"] == 1, 10)
    assert [e.values["i"] for e in honest] == [0, -1, 1]


COSTLY = "total = 0\nfor j in range(1000):\n    total += j * i\nif total >= 0:\n    forward()"
CHEAP = "if i >= 0:\n    forward()"


async def test_a_client_with_patterns_on_both_kinds_of_worker_gets_every_event_for_each(
    router, make_client
):
    """A client whose proven pattern runs on a regular worker and whose new one runs on
    probation is sent each event by two workers, in two frames: the client takes each
    subscription's copy once, so neither pattern misses an event."""
    watcher = await make_client(client_id="watcher")
    proven: list[Event] = []
    await watcher.subscribe(COSTLY, proven.append, format="script")
    pool = pool_of(router)
    pub = await make_client()
    sent = 0
    deadline = time.monotonic() + 20
    while pool.counters["graduated"] == 0:
        assert time.monotonic() < deadline, pool.counters
        pub.publish_nowait({"i": sent})
        sent += 1
        await wait_for(lambda sent=sent: len(proven) == sent, 10)
    new: list[Event] = []
    await watcher.subscribe(CHEAP, new.append, format="script")
    assert on_probation(pool, CHEAP) and not on_probation(pool, COSTLY)
    joined = sent
    for _ in range(30):
        pub.publish_nowait({"i": sent})
        sent += 1
    await wait_for(lambda: len(proven) == sent and len(new) == sent - joined, 10)
    assert [e.values["i"] for e in proven] == list(range(sent))
    assert [e.values["i"] for e in new] == list(range(joined, sent))


async def test_two_patterns_of_a_client_graduating_one_after_the_other_miss_no_event(
    router, make_client
):
    """Two patterns of one client leave probation at their own moments: across each move,
    each pattern gets every event once, in order (the client got some events from both
    kinds of worker meanwhile)."""
    watcher = await make_client(client_id="watcher")
    got: dict[str, list[int]] = {COSTLY: [], CHEAP: []}
    pub = await make_client()
    sent = 0
    joined: dict[str, int] = {}
    deadline = time.monotonic() + 30
    while sent < 40 or pool_of(router).counters["graduated"] < 2:
        assert time.monotonic() < deadline, (pool_of(router).counters, sent, got)
        if sent in (0, 4):  # the second one a few events later: it graduates later
            source = COSTLY if sent == 0 else CHEAP
            joined[source] = sent
            await watcher.subscribe(
                source, lambda e, s=source: got[s].append(e.values["i"]), format="script"
            )
        for _ in range(2):
            pub.publish_nowait({"i": sent})
            sent += 1
        await wait_for(
            lambda sent=sent: all(len(g) >= sent - joined.get(s, sent) for s, g in got.items()),
            10,
        )
    assert got == {s: list(range(joined[s], sent)) for s in got}


async def test_a_client_with_a_predicate_and_a_script_gets_every_event_for_each(
    router, make_client
):
    """The router delivers a predicate's copy of an event at once and the script's when its
    worker answers, in another frame: both reach their subscriptions."""
    watcher = await make_client(client_id="watcher")
    plain: list[Event] = []
    scripted: list[Event] = []
    await watcher.subscribe("i >= 0", plain.append)
    await watcher.subscribe(CHEAP, scripted.append, format="script")
    pub = await make_client()
    for i in range(20):
        pub.publish_nowait({"i": i})
    await wait_for(lambda: len(plain) == 20 and len(scripted) == 20, 10)
    assert [e.values["i"] for e in plain] == [e.values["i"] for e in scripted] == list(range(20))
