"""Issue 12 benchmark: matching one event against N predicate-tier subscriptions (the
pattern engine of one router, in process: `PatternEngine.match`, no sockets).

    python tests/bench/bench_matching.py                          # N = 1,000 and 10,000
    python tests/bench/bench_matching.py --sizes 1000,10000,100000,1000000
    python tests/bench/bench_matching.py --workload trading       # parametric updates only
    python tests/bench/bench_matching.py --router --sizes 100000   # through an embedded Router

Workloads:

- `betree` (BE-Tree, Sadoghi and Jacobsen 2011; PADRES): N subscriptions of 1-5 predicates
  over `--names` attributes (10-50), constants Zipf-distributed (exponent `--zipf`) over
  `--domain` values; each predicate an equality (`--eq` of them) or a range `lo <= aK <= hi`
  up to `--width` of the domain wide. Events carry a value for every attribute, uniform over
  the domain (`--event-dist zipf`: the constants' distribution, where the hot values make
  about 1% of all subscriptions match every event: the figure is then the deliveries').
- `trading` (Jayaram, Jayalath and Eugster, parametric subscriptions): N traders subscribe
  `Symbol == sym and Price < limit` (a third `>`, a third `<`, a third `==`, as the paper's
  operator mix) with params; the benchmark then moves `limit` by `update()` and measures
  updates/s and the reaction time: an update followed by the first event that matches only
  the new limit, delivered.

What the figures include. `subscribes_per_s`: for each subscription (timed one by one:
until 2026-11-24 05:00 the clock also ran while the workload drew the next source and
params), building its `PatternSpec` (as the codec does for a client's frame),
`PatternEngine.subscribe`: the params check, parsing (the fast conjunction reader, else
`ast`; no RestrictedPython for a predicate pattern), normalising and planning (the access
predicate), the index insert, and the engine's bookkeeping (subscriber, params bucket,
shared instance). With `--router`, the subscriptions go through an embedded
`Router.subscribe` (a `LocalSubscription`, the router's checks, quenching and store hooks
too) and the memory is the whole router process's RSS. `updates_per_s`:
`PatternEngine.update` (with `--router`, `LocalSubscription.update`). Each rate is given per
second of wall time and per second of this process's CPU time (`*_cpu`): on a loaded machine
the second is the one to compare (for subscribes it counts the workload's draws too: a lower
bound of the rate). The collector is set as `aa router` sets it (`--python-gc`: Python's
defaults, with which a subscribe cost a fifth more: 17,500 against 21,000 BE-Tree-style
subscribes/s at 100,000, idle, 2026-11-24).

Each run prints the deliveries per event: the cost of an event is the index lookups plus
the verification of its candidates plus its deliveries, so a workload's selectivity decides
what is reachable. Per size: events/s is not the figure; per-event match time is (median per
run, then the median and min-max over `--runs` runs), with the number of deliveries per
event; subscribe rate; update rate (trading); memory per subscription (RSS growth of this
process while subscribing, after a collection); the collector's longest pause per generation
while subscribing (`gc_pause_ms_max`) and a full collection afterwards (`gc_full_ms`): what
the router's loop would stop for; and the collector's share of the subscribes' time
(`gc_share_of_subscribing`). Targets (issue 12): 1 M subscriptions ≤ 1 ms per event and
≤ 20× the 1,000 figure; ≥ 50,000 subscribes/s; ≥ 100,000 updates/s; ≤ 1 KB per subscription.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import gc
import itertools
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import report

from aa.mesh import Event, PatternSpec
from aa.router.patterns import HostFacts, PatternEngine

SYMBOLS = 200  # the paper's 200 event types: 100 commodities' quotes, predictions, ...


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def make_engine() -> PatternEngine:
    host = HostFacts(
        router_id="b",
        router_name="bench",
        clock=lambda: datetime.now(UTC),
        peer_count=lambda: 0,
    )
    return PatternEngine(host=host, on_failure=lambda keys, code, message: None)


class Zipf:
    def __init__(self, n: int, s: float, rng: random.Random) -> None:
        self.cum = list(itertools.accumulate(1.0 / (i + 1) ** s for i in range(n)))
        self.rng = rng
        self.total = self.cum[-1]

    def __call__(self) -> int:
        return bisect.bisect_left(self.cum, self.rng.random() * self.total)


def betree(
    args: argparse.Namespace, n: int, rng: random.Random
) -> tuple[Iterator[tuple[str, dict[str, Any]]], Callable[[], Event]]:
    z = Zipf(args.domain, args.zipf, rng)
    width = max(1, int(args.domain * args.width))

    def subs() -> Iterator[tuple[str, dict[str, Any]]]:
        for _ in range(n):
            preds = []
            for a in rng.sample(range(args.names), rng.randint(1, 5)):
                c = z()
                if rng.random() < args.eq:
                    preds.append(f"a{a} == {c}")
                else:
                    preds.append(f"{c} <= a{a} <= {c + rng.randint(1, width)}")
            yield " and ".join(preds), {}

    def event() -> Event:
        draw = z if args.event_dist == "zipf" else (lambda: rng.randrange(args.domain))
        return Event(values={f"a{a}": draw() for a in range(args.names)})

    return subs(), event


TRADING = [
    "Symbol == sym and Price > limit",
    "Symbol == sym and Price < limit",
    "Symbol == sym and Price == limit",
]


def trading(
    args: argparse.Namespace, n: int, rng: random.Random
) -> tuple[Iterator[tuple[str, dict[str, Any]]], Callable[[], Event]]:
    def subs() -> Iterator[tuple[str, dict[str, Any]]]:
        for i in range(n):
            yield (
                TRADING[i % 3],
                {"sym": f"S{rng.randrange(SYMBOLS)}", "limit": round(rng.uniform(50, 150), 1)},
            )

    def event() -> Event:
        return Event(
            values={
                "Symbol": f"S{rng.randrange(SYMBOLS)}",
                "Price": round(rng.uniform(50, 150), 1),
            },
            type="quote",
        )

    return subs(), event


def run_size(args: argparse.Namespace, n: int) -> None:
    rng = random.Random(args.seed)
    subs, event = (betree if args.workload == "betree" else trading)(args, n, rng)
    router: Any = None
    if args.router:
        from aa.router import Router, RouterConfig

        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        router = Router(RouterConfig(port=0))
        loop.run_until_complete(router.start())
        engine = router.engine
    else:
        engine = make_engine()
    handles: list[Any] = []
    gc.collect()
    pauses = CollectorPauses()
    before = rss()
    subscribe_s = 0.0
    wall = time.perf_counter
    cpu = time.process_time()
    for i, (source, params) in enumerate(
        subs
    ):  # the clock runs per subscribe, not while the workload draws
        w = wall()
        spec = PatternSpec(source=source)
        if router is not None:
            handles.append(router.subscribe(spec, _ignore, params=params))
        else:
            engine.subscribe(i, spec, params)
        subscribe_s += wall() - w
    subscribe_cpu = time.process_time() - cpu  # the workload's draws included: an upper bound
    pauses.stop()
    t = wall()
    gc.collect()
    full_pause = wall() - t
    grown = rss() - before
    events = [event() for _ in range(args.events)]
    run_medians = []
    delivered = 0
    for _ in range(args.runs):
        times = []
        for e in events:
            t = time.perf_counter()
            delivered += len(engine.match(e))
            times.append(time.perf_counter() - t)
        run_medians.append(statistics.median(times))
    figures: dict[str, object] = {
        "workload": args.workload,
        "via": "router" if router is not None else "engine",
        "subscriptions": n,
        "names": args.names if args.workload == "betree" else 2,
        "match_ms_median": round(statistics.median(run_medians) * 1e3, 4),
        "match_ms_min": round(min(run_medians) * 1e3, 4),
        "match_ms_max": round(max(run_medians) * 1e3, 4),
        "deliveries_per_event": round(delivered / (args.runs * len(events)), 2),
        "subscribes_per_s": round(n / subscribe_s),
        "subscribes_per_cpu_s": round(n / subscribe_cpu),
        "bytes_per_subscription": round(grown / n),
        # the longest the collector held the process (a router's loop) while subscribing,
        # by generation, and a full collection afterwards (when the long-lived objects have
        # grown by a quarter since the last one, CPython 3.11 makes one)
        "gc_pause_ms_max": pauses.longest(),
        "gc_share_of_subscribing": round(
            pauses.total / subscribe_s, 3
        ),  # the collector's time / the subscribes' time
        "gc_full_ms": round(full_pause * 1e3, 1),
        "rss_mb": round(rss() / 2**20),
        "instances": engine.instance_count,
    }
    if args.workload == "trading":
        figures.update(updates(engine, n, rng, args.updates, handles))
    figures["load"] = os.getloadavg()[0]
    report("matching", figures)


class CollectorPauses:
    """The longest pause of each generation's collections, from `gc.callbacks`."""

    def __init__(self) -> None:
        self.worst = [0.0, 0.0, 0.0]
        self.total = 0.0
        self._t = 0.0
        gc.callbacks.append(self._note)

    def _note(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            g = info["generation"]
            took = time.perf_counter() - self._t
            self.worst[g] = max(self.worst[g], took)
            self.total += took

    def stop(self) -> None:
        gc.callbacks.remove(self._note)

    def longest(self) -> list[float]:
        return [round(w * 1e3, 1) for w in self.worst]


def _ignore(event: Event) -> None:
    pass


def updates(
    engine: PatternEngine, n: int, rng: random.Random, count: int, handles: list[Any]
) -> dict[str, object]:
    """updates/s, and the reaction time (the paper's measure): update a `Price < limit`
    trader to a higher limit, then publish a quote between the old and the new limit, which
    must reach it — the time from the update's call to the delivery's being decided."""
    keys = [rng.randrange(n) for _ in range(count)]
    limits = [round(rng.uniform(50, 150), 1) for _ in range(count)]
    cpu, t0 = time.process_time(), time.perf_counter()
    if handles:
        for k, limit in zip(keys, limits):
            handles[k].update(limit=limit)
    else:
        for k, limit in zip(keys, limits):
            engine.update(k, {"limit": limit})
    rate, rate_cpu = count / (time.perf_counter() - t0), count / (time.process_time() - cpu)
    reactions = []
    for i in range(1, min(n, 600), 3):  # i % 3 == 1: "Price < limit"
        k = handles[i] if handles else i
        sym = engine._subs[k].params["sym"]
        engine.update(k, {"limit": 10.0})
        quote = Event(values={"Symbol": sym, "Price": 20.0}, type="quote")
        t = time.perf_counter()
        engine.update(k, {"limit": 30.0})
        got = engine.match(quote)
        reactions.append(time.perf_counter() - t)
        assert sum(key == k for key, _ in got) == 1  # delivered, once
    return {
        "updates_per_s": round(rate),
        "updates_per_cpu_s": round(rate_cpu),
        "reaction_ms_median": round(statistics.median(reactions) * 1e3, 4),
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workload", choices=["betree", "trading", "both"], default="both")
    ap.add_argument("--sizes", default="1000,10000", help="comma-separated subscription counts")
    ap.add_argument("--names", type=int, default=20, help="attributes (betree: 10-50)")
    ap.add_argument("--domain", type=int, default=10_000, help="values per attribute (betree)")
    ap.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of the constants")
    ap.add_argument("--eq", type=float, default=0.6, help="share of equality predicates (betree)")
    ap.add_argument(
        "--width", type=float, default=0.001, help="widest range, as a share of the domain (betree)"
    )
    ap.add_argument(
        "--event-dist", choices=["zipf", "uniform"], default="uniform", help="event values (betree)"
    )
    ap.add_argument("--events", type=int, default=500, help="events per run")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--updates", type=int, default=50_000, help="parametric updates (trading)")
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument(
        "--router",
        action="store_true",
        help="subscribe through an embedded Router (whole-router RSS)",
    )
    ap.add_argument(
        "--python-gc",
        action="store_true",
        help="keep Python's default collector (default: set it as `aa router` does)",
    )
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # one size, in this process
    args = ap.parse_args()
    if args.one is not None:
        if (
            not args.python_gc
        ):  # as the router process runs: what start-up built frozen, rare passes
            from aa.tools.router_cmd import _tune_gc

            _tune_gc()
        run_size(args, args.one)
        return 0
    workloads = ["betree", "trading"] if args.workload == "both" else [args.workload]
    failed = 0
    for workload in workloads:
        for n in args.sizes.split(","):
            # One process per size: the RSS growth is then this size's alone.
            opts = {**vars(args), "workload": workload, "one": n, "sizes": n}
            flags = [f"--{k.replace('_', '-')}" for k in ("router", "python_gc") if opts.pop(k)]
            argv = [f"--{k.replace('_', '-')}={v}" for k, v in opts.items()] + flags
            failed |= subprocess.call([sys.executable, __file__, *argv])
    return failed


if __name__ == "__main__":
    sys.exit(main())
