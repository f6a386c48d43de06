"""Hostile patterns, as an attacker who has read the code would write them (issue 11).

Each test starts one router and runs a class of attacks together (escape, CPU, memory,
flood, crash), every attack from its own client, while a victim subscribed to a simple
expression (the router's own tier) measures its latency at 200 events/s and an honest
bystander script (the worker tier) counts its deliveries. Each attack must be contained:
refused at subscribe, or stopped with a reason to its own subscriber only, or inert
(it obtains nothing); the router stays alive, its RSS grows by less than 100 MB, the victim
loses nothing with p99 under 10 ms, and the bystander loses nothing, delayed (p99) by at
most 100 ms.

The 10 ms are counted on top of the machine's own wake-up delay, measured by a probe
beside the victim (its p99): near zero on an idle machine, several ms on a shared one.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from dataclasses import dataclass
from typing import Any

from support import paced, wait_for

from aa.mesh import Event, PatternError
from aa.router import Router

#: Events the publisher sends per test, at `RATE` per second.
EVENTS = 300
RATE = 200
STOP_CODES = {
    "pattern-timeout",
    "pattern-memory",
    "pattern-forbidden",
    "pattern-refused",
    "pattern-compile",
    "pattern-crash",
}


@dataclass
class Attack:
    name: str
    source: str
    #: "refused" at subscribe, "stopped" later, "inert" (never delivers), or "contained"
    #: (any of these, or delivering only what it may: the event's own values).
    expect: str
    fmt: str = "script"
    kernel: str = "python"
    codes: tuple[str, ...] = ()


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def until(condition: Any, timeout: float) -> bool:
    """Whether *condition()* became true within *timeout* s (`support.wait_for`)."""
    try:
        await wait_for(condition, timeout)
    except TimeoutError:
        return False
    return True


async def run_attacks(
    router: Router, open_client: Any, attacks: list[Attack], *, during: Any = None
) -> dict[str, Any]:
    """Subscribe every attack from its own client, publish EVENTS events, and check the
    containment rules common to all attacks. Returns what each attack ended with."""
    victim_lat: list[float] = []
    bystander: list[int] = []
    bystander_lat: list[float] = []
    victim = await open_client(router, client_id="victim")
    await victim.subscribe(
        "Seq >= 0", lambda e: victim_lat.append(time.perf_counter() - e.values["t"])
    )
    honest = await open_client(router, client_id="honest")

    def honest_got(e: Event) -> None:
        if e.values["Seq"] >= 0:
            bystander.append(e.values["Seq"])
            bystander_lat.append(time.perf_counter() - e.values["t"])
        else:
            warmed.append(e)

    warmed: list[Event] = []
    honest_sub = await honest.subscribe("forward()", honest_got, format="script")
    baseline = rss()
    noise: list[float] = []
    probing = True

    async def probe() -> None:
        # The machine's own scheduling delay, measured beside the victim: on a shared,
        # loaded machine the event loop itself wakes late, attack or not.
        loop = asyncio.get_running_loop()
        async for _, due in paced(500):
            if not probing:
                break
            noise.append(loop.time() - due)

    prober = asyncio.get_running_loop().create_task(probe())

    outcomes: dict[str, Any] = {}
    subs: dict[str, Any] = {}
    got: dict[str, list[Event]] = {}
    for i, attack in enumerate(attacks):
        c = await open_client(router, client_id=f"attacker{i}")
        got[attack.name] = []
        try:
            subs[attack.name] = await c.subscribe(
                attack.source, got[attack.name].append, format=attack.fmt, kernel=attack.kernel
            )
        except PatternError as exc:
            outcomes[attack.name] = ("refused", exc.code, str(exc))
    pub = await open_client(router, client_id="publisher")
    # Warm up: every worker started (and the attacks that fire on any event fired), the
    # spare ready, before the measured run.
    pub.publish_nowait({"Seq": -2, "t": 0.0})
    assert await until(lambda: warmed, 60)
    assert await until(lambda: router.engine.workers is None or router.engine.workers.warm, 60)
    async for seq, _ in paced(RATE, EVENTS):
        pub.publish_nowait(
            {
                "Seq": seq,
                "t": time.perf_counter(),
                "Name": "sensor-1",
                "Temperature": 20 + seq % 10,
                "Readings": [1.5, 2.5],
            }
        )
        if during is not None and seq == EVENTS // 3:
            during()
    await pub.flush(timeout=30)
    assert await until(lambda: len(victim_lat) >= EVENTS, 30), (
        f"victim got {len(victim_lat)} of {EVENTS}"
    )
    stopping = [a for a in attacks if a.expect == "stopped" and a.name in subs]
    await until(lambda: all(subs[a.name].failure is not None for a in stopping), 30)
    assert await until(lambda: len(bystander) >= EVENTS, 30), (
        f"bystander got {len(bystander)} of {EVENTS} ({honest_sub.failure}); "
        f"{router.engine.workers and router.engine.workers.counters}; {outcomes}"
    )
    for attack in attacks:
        if attack.name in subs and subs[attack.name].failure is not None:
            f = subs[attack.name].failure
            outcomes[attack.name] = ("stopped", f.code, str(f))
        outcomes.setdefault(attack.name, ("running", None, ""))
    # -- containment ---------------------------------------------------------------------
    for attack in attacks:
        outcome, code, message = outcomes[attack.name]
        where = f"{attack.name}: {outcome} {code} {message!r}"
        if outcome in ("refused", "stopped"):
            assert code in STOP_CODES and message and len(message) <= 500, where
            if attack.codes:
                assert code in attack.codes, where
        if attack.expect == "refused":
            assert outcome == "refused", where
        elif attack.expect == "stopped":
            assert outcome == "stopped", where
        elif attack.expect == "inert":
            assert outcome in ("refused", "stopped") or not got[attack.name], where
        # Nothing obtained: whatever an attack received is the publisher's events, as sent.
        for ev in got[attack.name]:
            assert set(ev.values) <= {"Seq", "t", "Name", "Temperature", "Readings", "r"}, where
    assert sorted(bystander) == list(range(EVENTS)) and bystander == sorted(bystander)
    bystander_lat.sort()
    probing = False
    await prober
    victim_lat.sort()
    noise.sort()
    p99 = victim_lat[int(len(victim_lat) * 0.99) - 1]
    machine = noise[int(len(noise) * 0.99) - 1]
    # The bystander shares a worker with some attacks: while they are throttled, stopped, or
    # their worker killed and replaced, it waits: at most issue 11's 100 ms on an idle
    # machine (tests/bench/bench_workers.py measures it). That wait is CPU work (the
    # watchdog's CPU confirmation, a fork, re-creations), so on a shared machine its wall
    # time stretches with the run queue per core: the bound here does too.
    by99 = bystander_lat[int(len(bystander_lat) * 0.99) - 1]
    stretch = max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    print(
        f"bystander p50 {bystander_lat[len(bystander_lat) // 2] * 1000:.1f} ms, "
        f"p99 {by99 * 1000:.1f} ms, max {bystander_lat[-1] * 1000:.1f} ms"
    )
    assert by99 < 0.100 * stretch + machine, (
        f"bystander p99 {by99 * 1000:.1f} ms "
        f"(machine's own: {machine * 1000:.1f} ms, load x{stretch:.1f})"
    )
    assert p99 < 0.010 + machine, (
        f"victim p99 {p99 * 1000:.1f} ms (machine's own: {machine * 1000:.1f} ms)"
    )
    assert rss() - baseline < 100 * 1024 * 1024, f"router RSS grew {(rss() - baseline) >> 20} MB"
    # The router still answers.
    last: list[Event] = []
    await victim.subscribe("Seq == -1", last.append)
    pub.publish_nowait({"Seq": -1, "t": time.perf_counter()})
    assert await until(lambda: last, 10)
    return outcomes


ESCAPE = [
    Attack("import-os-expr", "__import__('os').system('true')", "refused", fmt="expr"),
    Attack("class-bases", "().__class__.__bases__", "refused", fmt="expr"),
    Attack("open-file", "open('/etc/passwd').read()", "refused", fmt="expr"),
    Attack("import-os", "import os\nforward()", "refused"),
    Attack("import-socket", "import socket\nforward()", "refused"),
    Attack("exec", "exec('1')", "refused"),
    Attack("eval-expr", "eval('1') == 1", "refused", fmt="expr"),
    Attack("globals", "g = globals()\nforward()", "refused"),
    Attack("class-def", "class X:\n    pass", "refused"),
    Attack("generator", "def g():\n    yield 1", "refused"),
    Attack("private-literal", "getattr(event, '_event')", "refused"),
    Attack("rebind-state", "state = []", "refused"),
    Attack("dunder-values", "event.values.__class__", "refused"),
    Attack("json-submodule", "from json import decoder", "refused"),
    Attack(
        "private-dynamic",
        "n = '_ev' + 'ent'\nforward(getattr(event, n))",
        "stopped",
        codes=("pattern-forbidden",),
    ),
    Attack(
        "str-format",
        "forward(new_event({'r': '{0.__class__}'.format(event)}))",
        "stopped",
        codes=("pattern-forbidden",),
    ),
    Attack("type-event", "forward(type(event)(None, {'r': 1}, None))", "inert"),
    Attack("type-subscriber", "forward(to=type(subscribers[0])('victim', {}))", "inert"),
    Attack(
        "type-of-class", "t = type(type(event))\nforward()", "stopped", codes=("pattern-forbidden",)
    ),
    Attack(
        "module-proxy", "import math\nforward(new_event({'r': str(type(math)('os', {}))}))", "inert"
    ),
    Attack(
        "xpath-doc",
        "doc('file:///etc/passwd')",
        "stopped",
        kernel="xpath",
        fmt="expr",
        codes=("pattern-compile",),
    ),
    Attack(
        "huge-private-name",
        "n = '_' + 'a' * 900000\nforward(getattr(event, n))",
        "stopped",
        codes=("pattern-forbidden",),
    ),
]

CPU = [
    Attack(
        "redos-script",
        "import re\nre.match('(a+)+$', 'a' * 32 + 'b')\nforward()",
        "stopped",
        codes=("pattern-timeout",),
    ),
    Attack(
        "redos-expr",
        "re.match('(a+)+$', 'a' * 32 + 'b') is None",
        "stopped",
        fmt="expr",
        codes=("pattern-timeout",),
    ),
    Attack(
        "pow-mod-expr",
        "pow(3, 2 ** 20000, 7 ** 20000 + 2) > 0",
        "stopped",
        fmt="expr",
        codes=("pattern-timeout",),
    ),
    Attack(
        "bigint-floordiv",
        "for i in range(100000):\n    q = (7 ** 20000 + i) // (3 ** 11000)",
        "stopped",
        codes=("pattern-timeout",),
    ),
    Attack(
        "isqrt",
        "import math\nfor i in range(100000):\n    math.isqrt(7 ** 20000 + i)",
        "stopped",
        codes=("pattern-timeout",),
    ),
    Attack(
        "sorted-5m",
        "sorted(list(range(1000000)) * 5)",
        "stopped",
        codes=("pattern-memory", "pattern-timeout"),
    ),
    Attack(
        "sorted-1m-strings",
        "x = sorted([str(i) * 20 for i in range(1000000)])",
        "stopped",
        codes=("pattern-timeout", "pattern-memory"),
    ),
    Attack(
        "hash-collisions",
        "L = [i * (2 ** 61 - 1) for i in range(60000)]\ns = set(L)",
        "stopped",
        codes=("pattern-timeout",),
    ),
    Attack(
        "statistics",
        "import statistics\nstatistics.variance(range(1000000))",
        "stopped",
        codes=("pattern-timeout",),
    ),
    Attack(
        "random-sample",
        "import random\nrandom.sample(range(1000000), 1000000)",
        "stopped",
        codes=("pattern-timeout", "pattern-memory"),
    ),
    Attack(
        "counter-chain",
        "import collections, itertools\n"
        "collections.Counter(itertools.chain(range(1000000), range(1000000)))",
        "stopped",
        codes=("pattern-timeout", "pattern-memory"),
    ),
    Attack("while-true", "while True:\n    pass", "stopped", codes=("pattern-timeout",)),
    Attack(
        "recursion", "def f(n):\n    return f(n + 1)\nf(0)", "stopped", codes=("pattern-memory",)
    ),
    Attack(
        "xpath-loop",
        "count(for $i in 1 to 100000, $j in 1 to 100000 return $i) > 0",
        "stopped",
        kernel="xpath",
        fmt="expr",
        codes=("pattern-timeout",),
    ),
    Attack("printf-redos", "x = ('%(' * 200000) % {}", "inert"),
]

MEMORY = [
    Attack(
        "chain-list",
        "import itertools\nx = list(itertools.chain(*([range(1000000)] * 60)))",
        "stopped",
        codes=("pattern-memory", "pattern-timeout"),
    ),
    Attack(
        "tee",
        "import itertools, collections\n"
        "a, b = itertools.tee(itertools.chain(*([range(1000000)] * 60)))\n"
        "collections.deque(a, maxlen=0)",
        "stopped",
        codes=("pattern-memory", "pattern-timeout"),
    ),
    Attack(
        "growing-state",
        "state.setdefault('x', []).append('y' * 200000)\nforward()",
        "stopped",
        codes=("pattern-memory",),
    ),
    Attack(
        "deep-state",
        "s = state\nfor i in range(200):\n    s['a'] = {}\n    s = s['a']",
        "stopped",
        codes=("pattern-memory",),
    ),
    Attack("big-repeat", "x = 'x' * 10 ** 8", "stopped", codes=("pattern-memory",)),
    Attack("big-bytes", "x = bytes(10 ** 9)", "stopped", codes=("pattern-memory",)),
    Attack("list-repeat", "x = [0] * 10 ** 7", "stopped", codes=("pattern-memory",)),
    Attack("format-width", "x = f'{Seq:>{10 ** 9}}'", "stopped", codes=("pattern-memory",)),
    Attack(
        "nested-repeat",
        "x = [[0] * 1000000] * 1000\ny = str(x)",
        "stopped",
        codes=("pattern-memory",),
    ),
]

FLOOD = [
    Attack(
        "distinct-forwards",
        "for i in range(9998):\n    forward(event.with_values(r=i))",
        "stopped",
        codes=("pattern-memory", "pattern-timeout"),
    ),
    Attack("same-forwards", "for i in range(9998):\n    forward()", "contained"),
    Attack("big-derived", "forward(event.with_values(r='x' * 900000))", "contained"),
    Attack(
        "many-big-derived",
        "for i in range(10):\n    forward(event.with_values(r='x' * 900000 + str(i)))",
        "stopped",
        codes=("pattern-memory",),
    ),
    Attack("source-64k", "x = 0\n" + "x = x + 1\n" * 6500 + "forward()", "contained"),
    Attack(
        "deep-derived",
        "v = []\nfor i in range(200):\n    v = [v]\nforward(new_event({'r': v}))",
        "inert",
    ),
]

CRASH = [
    Attack("json-deep", "import json\njson.loads('[' * 100000 + ']' * 100000)", "inert"),
    Attack(
        "repr-deep",
        "x = []\nfor i in range(100000):\n    x = [x]\nforward(new_event({'r': repr(x)}))",
        "contained",
    ),
    Attack("int-digits", "forward(new_event({'r': int('9' * 5000)}))", "inert"),
    Attack("system-exit", "raise SystemExit(1)", "inert"),
    Attack(
        "memory-error-loop",
        "x = []\nwhile True:\n    x.append(' ' * 100000)",
        "stopped",
        codes=("pattern-memory", "pattern-timeout"),
    ),
]


async def test_escape_attacks_are_refused_or_stopped(router, open_client):
    await run_attacks(router, open_client, ESCAPE)


async def test_cpu_attacks_are_stopped(router, open_client):
    await run_attacks(router, open_client, CPU)


async def test_memory_attacks_are_stopped(router, open_client):
    await run_attacks(router, open_client, MEMORY)


async def test_flood_attacks_are_contained(router, open_client):
    await run_attacks(router, open_client, FLOOD)


async def test_crash_attacks_and_killed_workers_are_contained(router, open_client):
    def kill_workers() -> None:
        pool = router.engine.workers
        assert pool is not None
        for i, slot in enumerate(pool._slots):
            if slot.proc is not None and slot.proc.pid is not None:
                os.kill(slot.proc.pid, signal.SIGSEGV if i % 2 else signal.SIGKILL)

    await run_attacks(router, open_client, CRASH, during=kill_workers)


async def test_sixty_just_under_budget_patterns_from_one_client(router, open_client):
    from aa.router.patterns.workers import WorkerConfig

    c = await open_client(router, client_id="sixty")
    subs = [await c.subscribe("n = -1\nfor i in range(25000):\n    n = n + 1", format="script")]
    # One worker, so the bystander shares it with the sixty (with two, affinity keeps them
    # apart and the sixty only slow down their own worker).
    router.engine.workers.config = WorkerConfig(workers=1)
    subs += [
        await c.subscribe(f"n = {i}\nfor i in range(25000):\n    n = n + 1", format="script")
        for i in range(59)
    ]
    await run_attacks(router, open_client, [])
    stopped = [s for s in subs if s.failure is not None]
    assert len(stopped) >= 50
    assert all("share" in str(s.failure) or s.failure.code == "pattern-timeout" for s in stopped)


async def test_random_seed_in_one_pattern_fixes_nobody_elses_numbers(router, open_client):
    seeded = random.Random(4242)
    sequence = {seeded.random() for _ in range(50)}
    a = await open_client(router, client_id="seeder")
    b = await open_client(router, client_id="other")
    got: list[float] = []
    router.engine.workers  # noqa: B018  (both land on workers; force one worker to share it)
    await a.subscribe("import random\nrandom.seed(4242)", format="script")
    router.subscribe(
        "import random\nforward(event.with_values(r=random.random()))",
        lambda e: got.append(e.values["r"]),
        format="script",
    )
    pub = await open_client(router, client_id="p")
    for i in range(20):
        pub.publish_nowait({"i": i})
    assert await until(lambda: len(got) == 20, 20)
    assert not sequence & set(got)
    del b
