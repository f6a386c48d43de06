"""Interest routing on big meshes, simulated: the forwarding rule of `aa.mesh.interest` (the
very code the routers run) over random geometric and scale-free graphs, without sockets, on
the simulation's own clock (a heap of timed copies; links FIFO, 0.5-1.5 ms each).

    python tests/bench/bench_interest.py                          # 100 and 1,000 routers
    python tests/bench/bench_interest.py --sizes 100 1000 5000    # about 20 minutes
    python tests/bench/bench_interest.py --sizes 100 --only steady changes
    python tests/bench/bench_interest.py --sizes 2000 5000 --only cap    # the view's room

Meshes: random geometric graphs in the unit square of mean degree about 4, their islands
joined each by its shortest link; scale-free graphs (Barabasi-Albert, two links per new
router). Subscribers on 1% and on 10% of the routers, each with one to five overlapping
patterns (`pattern`): a type (50 types, Zipf-popular), a type and a site, a site alone, a
script with declared needs, all three, or "anything". Events: a Zipf-drawn type, a uniform
site, sometimes a depth, from a random router.

- steady: link messages per event under interest routing, under the shortest-path tree
  that reaches exactly the routers whose subscriptions match (the reference), and under
  flooding (every router sends to each neighbour not on the copy's path);
- changes: how many subscription changes change a router's summary (and cost a flood);
- death: the router carrying the most interest traffic dies while events flow; its
  neighbours see the links go at once and flood their new summaries; each router floods
  while unsettled (from the first notice it gets to `SETTLE_TIME` after the last) and then
  routes on the new view. "lost (through it)" are events that were inside the dead router or
  on their way to it, for routers behind it; "lost (other)" must be zero;
- heal: a partition heals, long (each side forgot the other) or short (each side holds the
  other's summaries from before the cut, one of them stale), with the other side's
  summaries crossing at their periodic repeat (today) or on link up (a fix);
- subscribe: how long a new interest takes to reach the routers of the mesh;
- congestion: one busy link of the trees carries half of what it is asked to (each message
  takes a while to send, so its queue grows); with detours (`aa.mesh.detour`), its router
  sends new events round it while its queue is past a bound and back once it drained:
  delivery delay, link messages per event, events lost and extra copies, with and without;
- cap: a router's view with room for `--caps` routers (`MeshConfig.max_routers`; 1,024 was
  the fixed cap): past it the view is incomplete and the router floods; within it, the CPU
  the forwarding costs, with the trees kept bounded by `MAX_TREE_ENTRIES`.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import math
import os
import random
import resource
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable

import msgpack
from sim_handover import HandoverSim

from aa.mesh import (
    MAX_ROUTERS,
    Detours,
    Event,
    Interest,
    InterestFilter,
    InvalidValue,
    MeshInterests,
    detour_targets,
)
from aa.mesh.interest import SETTLE_TIME
from aa.router.links.interests import SUMMARY_DEBOUNCE

TYPES = 50
SITES = 20


def geometric(n: int, degree: float, rng: random.Random) -> dict[str, list[str]]:
    pts = [(rng.random(), rng.random()) for _ in range(n)]
    radius = math.sqrt(degree / (math.pi * n))
    cell = {}
    for i, (x, y) in enumerate(pts):
        cell.setdefault((int(x / radius), int(y / radius)), []).append(i)
    adj: dict[int, set[int]] = {i: set() for i in range(n)}
    for (cx, cy), members in cell.items():
        for dx in (-1, 0, 1):
            for dy in (-1, 0, 1):
                for j in cell.get((cx + dx, cy + dy), ()):
                    for i in members:
                        if i < j and math.dist(pts[i], pts[j]) < radius:
                            adj[i].add(j)
                            adj[j].add(i)
    # Near the percolation threshold such a graph falls apart: join each smaller part to the
    # rest by its shortest possible link (a site wires its islands together).
    while True:
        comps = _components(adj)
        if len(comps) == 1:
            break
        comps.sort(key=len)
        small, rest = comps[0], set().union(*comps[1:])
        a, b = min(
            ((i, j) for i in small for j in rest), key=lambda ij: math.dist(pts[ij[0]], pts[ij[1]])
        )
        adj[a].add(b)
        adj[b].add(a)
    best = set(adj)
    name = {i: f"r{i:05d}" for i in best}
    return {name[i]: sorted(name[j] for j in adj[i]) for i in best}


def _components(adj: dict[int, set[int]]) -> list[set[int]]:
    seen: set[int] = set()
    out = []
    for s in adj:
        if s in seen:
            continue
        comp = {s}
        stack = [s]
        while stack:
            for w in adj[stack.pop()]:
                if w not in comp:
                    comp.add(w)
                    stack.append(w)
        seen |= comp
        out.append(comp)
    return out


def scale_free(n: int, m: int, rng: random.Random) -> dict[str, list[str]]:
    """Barabasi-Albert: each new router links to *m* routers picked in proportion to their
    degree (mean degree about 2m), starting from a clique of m + 1."""
    adj: dict[int, set[int]] = {i: {j for j in range(m + 1) if j != i} for i in range(m + 1)}
    ends = [i for i in range(m + 1) for _ in range(m)]  # each router once per link end
    for v in range(m + 1, n):
        picked: set[int] = set()
        while len(picked) < m:
            picked.add(rng.choice(ends))
        adj[v] = set()
        for w in picked:
            adj[v].add(w)
            adj[w].add(v)
            ends += (v, w)
    return {f"r{i:05d}": sorted(f"r{j:05d}" for j in ws) for i, ws in adj.items()}


GRAPHS = {
    "geometric": lambda n, rng: geometric(n, 4.0, rng),
    "scale-free": lambda n, rng: scale_free(n, 2, rng),
}


def zipf(rng: random.Random, k: int) -> int:
    weights = [1 / (i + 1) for i in range(k)]
    return rng.choices(range(k), weights)[0]


def subscriptions(rng: random.Random) -> list[InterestFilter]:
    """One router's subscriptions: one to five patterns, overlapping and covering each other
    (a type, and the same type at a site), with a share of "anything" (scripts without
    declared needs)."""
    return [pattern(rng) for _ in range(rng.randint(1, 5))]


def pattern(rng: random.Random) -> InterestFilter:
    kind = rng.random()
    t, s = f"t{zipf(rng, TYPES)}", f"s{rng.randrange(SITES)}"
    if kind < 0.40:
        return InterestFilter(type=t)  # type == "t7"
    if kind < 0.65:
        return InterestFilter.make(type=t, eq=[("site", s)])  # ... and site == "s3"
    if kind < 0.75:
        return InterestFilter.make(eq=[("site", s)])  # site == "s3"
    if kind < 0.85:
        return InterestFilter.make(has=["depth"])  # a script with "# needs: depth"
    if kind < 0.97:
        return InterestFilter.make(type=t, eq=[("site", s)], has=["depth"])  # depth > 3 too
    return InterestFilter()  # a script without needs: anything


def event(rng: random.Random) -> Event:
    values: dict[str, object] = {"site": f"s{rng.randrange(SITES)}"}
    if rng.random() < 0.2:
        values["depth"] = rng.randrange(10)
    return Event(values=values, type=f"t{zipf(rng, TYPES)}")


def tree_parent(graph: dict[str, list[str]], source: str) -> dict[str, str | None]:
    parent: dict[str, str | None] = {source: None}
    queue = deque([source])
    while queue:
        v = queue.popleft()
        for w in graph[v]:
            if w not in parent:
                parent[w] = v
                queue.append(w)
    return parent


def reference(parent: dict[str, str | None], wanting: set[str]) -> int:
    """Links of the shortest-path tree that reach *wanting* (the source's tree, pruned)."""
    used: set[str] = set()
    for r in wanting:
        while parent[r] is not None and r not in used:
            used.add(r)
            r = parent[r]  # type: ignore[assignment]
    return len(used)


def walk(view: MeshInterests | None, graph: dict[str, list[str]], source: str, ev: Event) -> int:
    messages = 0
    seen = {source}
    queue = deque([(source, None, (source,))])
    while queue:
        me, came, path = queue.popleft()
        targets = None if view is None else view.forward(me, source, came, ev)
        if targets is None:
            targets = [p for p in graph[me] if p not in path]
        for t in targets:
            messages += 1
            if t not in seen:
                seen.add(t)
                queue.append((t, me, (*path, t)))
    return messages


def mesh_of(kind: str, n: int, share: float, seed: int):  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    graph = GRAPHS[kind](n, rng)
    routers = sorted(graph)
    subs = {r: subscriptions(rng) for r in rng.sample(routers, max(1, round(share * len(routers))))}
    return rng, graph, routers, subs


def view_of(graph: dict[str, list[str]], interests: dict[str, Interest]) -> MeshInterests:
    view = MeshInterests(max_routers=len(graph))
    for r, ps in graph.items():
        view.put(r, ps, interests.get(r, Interest.NOTHING))
    return view


def link_delays(graph: dict[str, list[str]], rng: random.Random) -> dict[tuple[str, str], float]:
    delay = {}
    for a, ps in graph.items():
        for b in ps:
            if a < b:
                delay[a, b] = delay[b, a] = rng.uniform(0.0005, 0.0015)
    return delay


def arrivals(
    graph: dict[str, list[str]], delay: dict[tuple[str, str], float], starts: dict[str, float]
) -> dict[str, float]:
    """When a flood started at *starts* (router → time) first reaches each router."""
    at = dict(starts)
    heap = [(t, r) for r, t in starts.items()]
    heapq.heapify(heap)
    while heap:
        t, v = heapq.heappop(heap)
        if t > at.get(v, math.inf):
            continue
        for w in graph[v]:
            tw = t + delay[v, w]
            if tw < at.get(w, math.inf):
                at[w] = tw
                heapq.heappush(heap, (tw, w))
    return at


def steady(kind: str, n: int, share: float, events: int, seed: int) -> dict[str, float]:
    rng, graph, routers, subs = mesh_of(kind, n, share, seed)
    interests = {r: Interest.of(fs) for r, fs in subs.items()}
    view = view_of(graph, interests)
    m_int = m_ref = m_flood = 0
    for i in range(events):
        source, ev = rng.choice(routers), event(rng)
        wanting = {r for r, fs in subs.items() if any(f.matches(ev) for f in fs)}
        m_int += walk(view, graph, source, ev)
        m_ref += reference(tree_parent(graph, source), wanting)
        m_flood += walk(None, graph, source, ev) if i < 20 else 0
    edges = sum(len(v) for v in graph.values()) // 2
    return {
        "routers": len(routers),
        "links": edges,
        "interest": m_int / events,
        "tree": m_ref / events,
        "flood": m_flood / min(events, 20),
    }


def capped(kind: str, n: int, share: float, events: int, seed: int, cap: int) -> dict[str, float]:
    """The view held by one router with room for *cap* routers (`MeshConfig.max_routers`):
    past it some routers are unknown, the view is incomplete and the router floods. Link
    messages per event, CPU microseconds per event of the forwarding (trees built and asked,
    on one view for every router, so the trees kept are shared and bounded by
    `MAX_TREE_ENTRIES`), and the trees kept at the end."""
    rng, graph, routers, subs = mesh_of(kind, n, share, seed)
    interests = {r: Interest.of(fs) for r, fs in subs.items()}
    view = MeshInterests(max_routers=cap)
    for r, ps in graph.items():
        try:
            view.put(r, ps, interests.get(r, Interest.NOTHING))
        except InvalidValue:
            pass  # no room: this router stays unknown to the view
    messages = 0
    start = time.process_time()
    for _ in range(events):
        messages += walk(view, graph, rng.choice(routers), event(rng))
    cpu = time.process_time() - start
    return {
        "routers": len(routers),
        "held": len(view),
        "messages": messages / events,
        "us": 1e6 * cpu / events,
        "trees": view.trees,
    }


def changes(kind: str, n: int, share: float, seed: int, count: int = 2000) -> dict[str, float]:
    """Subscription changes and the summary floods they cost. Each subscriber's router serves
    a few applications: a pool of one to five patterns, and 1 to 50 clients subscribed to
    patterns of the pool. A change is a client that goes, or one that comes with a pattern
    of the pool (nine times in ten) or a new one. The router floods a new summary only when
    the merged, covered summary changed (the last client of a pattern went, or a pattern
    that no other covers came)."""
    rng, graph, routers, subs = mesh_of(kind, n, share, seed)
    edges = sum(len(v) for v in graph.values()) // 2
    flood_cost = 2 * edges - (len(routers) - 1)  # one control flood crosses every link
    pools = {r: list(fs) for r, fs in subs.items()}
    clients = {
        r: [rng.choice(pool) for _ in range(rng.randint(1, 50))] for r, pool in pools.items()
    }
    summary = {r: Interest.of(cs) for r, cs in clients.items()}
    owners = sorted(clients)
    changed = size = 0
    for _ in range(count):
        r = rng.choice(owners)
        if clients[r] and rng.random() < 0.5:
            clients[r].pop(rng.randrange(len(clients[r])))
        elif rng.random() < 0.9:
            clients[r].append(rng.choice(pools[r]))
        else:
            pools[r].append(pattern(rng))
            clients[r].append(pools[r][-1])
        now = Interest.of(clients[r])
        if now != summary[r]:
            summary[r] = now
            changed += 1
            size += len(msgpack.packb(now.to_wire()))
    return {
        "routers": len(routers),
        "links": edges,
        "changed": changed / count,
        "messages": flood_cost * changed / count,
        "flood": flood_cost,
        "bytes": size / max(changed, 1),
    }


def run(
    graph: dict[str, list[str]],
    delay: dict[tuple[str, str], float],
    links_at: Callable[[str, float], list[str]],
    rule: Callable[[str, str, str | None, Event, float], list[str] | None],
    published: list[tuple[float, str, Event]],
    dead: str | None = None,
    t0: float = math.inf,
) -> tuple[dict[int, set[str]], int]:
    """Every copy of every event, in order of the simulation's clock: which routers got
    each event, and the link messages sent. *links_at* gives a router's links at a time;
    *rule* its targets (None: flood)."""
    heap: list[tuple[float, int, str, str | None, tuple[str, ...], int]] = []
    for k, (t, source, _ev) in enumerate(published):
        heap.append((t, k, source, None, (), k))
    heapq.heapify(heap)
    seq = len(heap)
    got: dict[int, set[str]] = {}
    messages = 0
    while heap:
        t, _, me, came, path, ek = heapq.heappop(heap)
        if me == dead and t >= t0:
            continue  # arrived at a dead router: lost
        seen = got.setdefault(ek, set())
        if me in seen:
            continue
        seen.add(me)
        path = (*path, me)
        ev = published[ek][2]
        links = links_at(me, t)
        targets = rule(me, path[0], came, ev, t)
        if targets is None:
            targets = [p for p in links if p not in path]
        for w in targets:
            if w not in links:
                continue  # the link is gone (or not there yet)
            messages += 1
            heapq.heappush(heap, (t + delay[me, w], seq, w, me, path, ek))
            seq += 1
    return got, messages


def switching_rule(
    old: MeshInterests,
    new: MeshInterests,
    first: dict[str, float],
    settled: dict[str, float],
) -> Callable[[str, str, str | None, Event, float], list[str] | None]:
    """Each router routes on the old view until it first hears of the change, floods until
    it settles, then routes on the new view."""

    def rule(me: str, source: str, came: str | None, ev: Event, t: float) -> list[str] | None:
        if t < first.get(me, math.inf):
            return old.forward(me, source, came, ev)
        if t < settled.get(me, math.inf):
            return None
        return new.forward(me, source, came, ev)

    return rule


def stream(
    rng: random.Random, sources: list[str], duration: float, every: float
) -> list[tuple[float, str, Event]]:
    out = []
    t = 0.0
    k = 0
    while t < duration:
        out.append((t, sources[k % len(sources)], event(rng)))
        k += 1
        t += every
    return out


def death(kind: str, n: int, share: float, seed: int, every: float) -> dict[str, float]:
    rng, graph, routers, subs = mesh_of(kind, n, share, seed)
    interests = {r: Interest.of(fs) for r, fs in subs.items()}
    old = view_of(graph, interests)
    sources = rng.sample(routers, min(50, len(routers)))
    # The router on the most trees toward subscribers dies ...
    load: dict[str, int] = {}
    for s in sources[:10]:
        parent = tree_parent(graph, s)
        for r in subs:
            while parent[r] is not None:
                r = parent[r]  # type: ignore[assignment]
                load[r] = load.get(r, 0) + 1
    # ... among those whose death leaves the mesh in one piece (else the routers cut off
    # are unreachable whatever the routing).
    index = {r: i for i, r in enumerate(routers)}
    for dead in sorted((r for r in routers if r not in sources), key=lambda r: -load.get(r, 0)):
        new_graph = {r: [p for p in ps if p != dead] for r, ps in graph.items() if r != dead}
        adj = {index[r]: {index[p] for p in ps} for r, ps in new_graph.items()}
        if len(_components(adj)) == 1:
            break
    new = view_of({**new_graph, dead: graph[dead]}, interests)
    delay = link_delays(graph, rng)
    t0 = 0.5
    # When each router hears each of the dead router's neighbours tell.
    first = dict.fromkeys(new_graph, math.inf)
    last = dict.fromkeys(new_graph, 0.0)
    for teller in graph[dead]:
        at = arrivals(new_graph, delay, {teller: t0})
        for r in new_graph:
            first[r] = min(first[r], at[r])
            last[r] = max(last[r], at[r])
    settled = {r: last[r] + SETTLE_TIME for r in new_graph}
    published = stream(rng, sources, 2.5, every)

    def links_at(me: str, t: float) -> list[str]:
        return graph[me] if t < t0 else new_graph.get(me, [])

    got, messages = run(
        graph, delay, links_at, switching_rule(old, new, first, settled), published, dead, t0
    )
    through = other = 0
    for ek, (born, _source, ev) in enumerate(published):
        wanting = {r for r, fs in subs.items() if r != dead and any(f.matches(ev) for f in fs)}
        if wanting - got.get(ek, set()):
            if born < t0:
                through += 1
            else:
                other += 1
    return {
        "routers": len(routers),
        "events": len(published),
        "lost_through": through,
        "lost_other": other,
        "converged": max(settled.values()) - t0,
        "messages": messages / len(published),
    }


def heal(
    kind: str,
    n: int,
    share: float,
    seed: int,
    every: float,
    short: bool,
    progress: Callable[[HandoverSim], None] | None = None,
) -> dict[str, float]:
    """A partition heals, with the routers' own interest code (`sim_handover`): the mesh
    was cut in two (the first half of a breadth-first walk, and the rest) and at *t0* every
    cut link comes back at once; each end floods its new summary and hands the new peer
    every summary it holds, news is handed on, and every router floods while its view is
    unsettled or routers back in its reach are unconfirmed (`CATCH_UP_TIME`).

    Long partition: each side forgot the other (its view is incomplete until every summary
    of the other side came). *short*: each side still holds the other's summaries from
    before the cut, unconfirmed since the cut took them out of reach, and one router of the
    far side subscribed to a new type during the cut. A tenth of the events are of that
    type, from the near side."""
    gc.disable()  # a million summaries' objects, none in a cycle: collections only cost
    try:
        return _heal(kind, n, share, seed, every, short, progress)
    finally:
        gc.enable()


def _heal(
    kind: str,
    n: int,
    share: float,
    seed: int,
    every: float,
    short: bool,
    progress: Callable[[HandoverSim], None] | None,
) -> dict[str, float]:
    rng, graph, routers, subs = mesh_of(kind, n, share, seed)
    stale = {r: Interest.of(fs) for r, fs in subs.items()}
    order = list(tree_parent(graph, routers[0]))
    side = set(order[: len(order) // 2])
    cut = {(a, b) for a in graph for b in graph[a] if (a in side) != (b in side)}
    apart = {a: [b for b in ps if (a, b) not in cut] for a, ps in graph.items()}
    delay = link_delays(graph, rng)
    newcomer = rng.choice(sorted(r for r in graph if r not in side))
    subs.setdefault(newcomer, []).append(InterestFilter(type="fresh"))
    interests = {r: Interest.of(subs[r]) if r in subs else Interest.NOTHING for r in graph}
    ends = {a for a, _ in cut}
    # Version 1 is each router's summary before the cut; the cut's ends and the newcomer
    # made new ones since (what their own side holds).
    version = {r: 1 + (r in ends) + (r == newcomer) for r in graph}
    with HandoverSim(delay, routers) as sim:
        sim.progress = progress
        for r in graph:
            sim.content[r, 1] = (tuple(sorted(graph[r])), stale.get(r, Interest.NOTHING))
            sim.content[r, version[r]] = (tuple(sorted(apart[r])), interests[r])
        t_init, t0 = 0.0, 2.0
        for r in routers:
            svc, mine = sim.svc[r], r in side
            sim.wants[r] = svc.interest = svc.listening = interests[r]
            svc.version = version[r]
            sim.mesh[r].links = set(apart[r])
            held = [(o, version[o]) for o in graph if o != r and (o in side) == mine]
            others = [o for o in graph if (o in side) != mine]
            if short:
                held += [(o, 1) for o in others]
            table = svc.table
            for o, v in held:
                table.view.put(o, *sim.content[o, v])  # held since long ago: one graph build
            table.local(apart[r], interests[r], now=t_init)
            for o, v in held:
                table.receive(o, v, *sim.content[o, v], now=t_init)
            if short:
                table.unconfirmed |= set(others)  # out of reach since the cut
        sources = rng.sample(sorted(side), min(50, len(side)))
        published = [(t0 - 0.5 + t, r, ev) for t, r, ev in stream(rng, sources, 4.0, every)]
        for k in range(0, len(published), 10):
            t, source, ev = published[k]
            published[k] = (t, source, Event(values=dict(ev.values), type="fresh"))
        sim.clock.now = sim.watch_from = t0
        controls = sim.controls
        for a, b in sorted(cut):
            if a < b:
                sim.link_up(a, b)
        got, messages = sim.run(published, math.inf)
    part: dict[str, set[str]] = {}
    for r in graph:
        if r not in part:
            whole = set(tree_parent(apart, r))
            part.update(dict.fromkeys(whole, whole))
    lost = 0
    for ek, (born, source, ev) in enumerate(published):
        # Before its router heard of the healed links, an event is one of the partition's.
        reach = graph if born >= sim.first_news.get(source, math.inf) else part[source]
        wanting = {r for r, fs in subs.items() if r in reach and any(f.matches(ev) for f in fs)}
        if wanting - got.get(ek, set()):
            lost += 1
    sure = max(sim.sure_at(r) for r in routers)
    return {
        "routers": len(routers),
        "cut": len(cut) // 2,
        "events": len(published),
        "lost": lost,
        "converged": sure - t0,
        "waited_out": sum(1 for r in routers if sim.svc[r].table.waiting),
        "messages": messages / len(published),
        "controls": sim.controls - controls,
        "synced": sum(sim.svc[r].counters["interest_sync_sent"] for r in routers),
        "cpu_mean": sum(sim.cpu.values()) / len(routers),
        "cpu_max": max(sim.cpu.values(), default=0.0),
    }


def subscribe_latency(kind: str, n: int, seed: int, samples: int = 20) -> dict[str, float]:
    """From subscribe() returning on a router to its new summary reaching the publisher's
    router: the debounce, then one flood. Events published on a router before then may
    be lost for the new subscription (that router's view does not hold it yet)."""
    rng = random.Random(seed)
    graph = GRAPHS[kind](n, rng)
    routers = sorted(graph)
    delay = link_delays(graph, rng)
    far: list[float] = []
    median: list[float] = []
    hops: list[int] = []
    for r in rng.sample(routers, min(samples, len(routers))):
        at = sorted(arrivals(graph, delay, {r: SUMMARY_DEBOUNCE}).values())
        far.append(at[-1])
        median.append(at[len(at) // 2])
        parent = tree_parent(graph, r)
        hops.append(max(len(_path(parent, w)) for w in graph) - 1)
    return {
        "routers": len(routers),
        "median": statistics.median(median),
        "far": max(far),
        "hops": max(hops),
    }


def _path(parent: dict[str, str | None], r: str) -> list[str]:
    out = [r]
    while parent[out[-1]] is not None:
        out.append(parent[out[-1]])  # type: ignore[arg-type]
    return out


def congestion(
    kind: str, n: int, share: float, seed: int, every: float, detour: bool
) -> dict[str, float]:
    """Events every *every* seconds from ten routers for two seconds, interest routing on a
    settled view. The directed link that carries the most copies (among those with another
    path round them) sends one message per *service* seconds, half of what it is asked to
    carry; every other link only delays (0.5-1.5 ms, FIFO). With *detour*, a router whose
    link has more than `high` messages queued goes round it (the rules of `aa.mesh.detour`,
    with the very functions the routers call) until fewer than `low` are."""
    rng, graph, routers, subs = mesh_of(kind, n, share, seed)
    interests = {r: Interest.of(fs) for r, fs in subs.items()}
    view = view_of(graph, interests)
    detours = Detours(view)
    delay = link_delays(graph, rng)
    sources = rng.sample(routers, min(10, len(routers)))
    published = stream(rng, sources, 2.0, every)
    # The busiest link of the trees, found by a pass without congestion.
    load: dict[tuple[str, str], int] = {}
    for _, source, ev in published:
        queue = deque([(source, None)])
        while queue:
            me, came = queue.popleft()
            for w in view.forward(me, source, came, ev) or ():
                load[me, w] = load.get((me, w), 0) + 1
                queue.append((w, me))
    for u, v in sorted(load, key=lambda uv: -load[uv]):
        rest = {r: [p for p in ps if (r, p) not in ((u, v), (v, u))] for r, ps in graph.items()}
        if v in tree_parent(rest, u):
            break
    count = load[u, v]
    service = 2 * 2.0 / count  # it carries half its load
    high, low = 20, 5  # queued messages
    free_at: dict[tuple[str, str], float] = {}
    congested_state = False
    extra = messages = 0
    got: dict[int, dict[str, float]] = {}
    heap: list[tuple[float, int, str, str | None, tuple[str, ...], int, tuple[str, ...]]] = []
    seq = 0
    for k, (t, source, _ev) in enumerate(published):
        heap.append((t, seq, source, None, (), k, ()))
        seq += 1
    heapq.heapify(heap)

    def congested(t: float) -> set[str]:
        nonlocal congested_state
        queued = max(0.0, free_at.get((u, v), 0.0) - t) / service
        congested_state = queued > low if congested_state else queued > high
        return {v} if congested_state and detour else set()

    def send(t: float, me: str, w: str, path: tuple[str, ...], ek: int, to: tuple[str, ...]):  # type: ignore[no-untyped-def]
        nonlocal seq, messages
        messages += 1
        start = t
        if (me, w) == (u, v):
            start = max(t, free_at.get((u, v), 0.0)) + service
            free_at[u, v] = start
        heapq.heappush(heap, (start + delay[me, w], seq, w, me, path, ek, to))
        seq += 1

    def ordinary(
        t: float, me: str, source: str, came: str | None, path: tuple[str, ...], ek: int
    ) -> None:
        ev = published[ek][2]
        chosen = [w for w in view.forward(me, source, came, ev) or () if w not in path]
        avoid = congested(t) if me == u else set()
        plain: list[str] = []
        directed: dict[str, list[str]] = {}
        for c in chosen:
            wanted = detour_targets(view, source, c, ev) if c in avoid else None
            hops = detours.first_hops(me, wanted, blocked=path, avoid=avoid) if wanted else None
            if hops is None:
                plain.append(c)
                continue
            for h, ts in hops.items():
                directed.setdefault(h, []).extend(ts)
        for w in plain:
            if w not in directed:
                send(t, me, w, path, ek, ())
        for h, ts in directed.items():
            send(t, me, h, path, ek, tuple(sorted(set(ts))))

    while heap:
        t, _, me, came, path, ek, to = heapq.heappop(heap)
        seen = got.setdefault(ek, {})
        fresh = me not in seen
        if fresh:
            seen[me] = t
        elif not to:
            extra += 1
            continue
        else:
            extra += 1
        path = (*path, me)
        source = path[0]
        if not to:
            ordinary(t, me, source, came, path, ek)
            continue
        rest = [r for r in to if r != me]
        avoid = congested(t) if me == u else set()
        hops = detours.first_hops(me, rest, blocked=path, avoid=avoid) or {}
        for h, ts in hops.items():
            send(t, me, h, path, ek, tuple(sorted(ts)))
        tree = view.tree(source)
        assert tree is not None
        above = any(me in _path(tree.parent, r)[1:] for r in rest)
        if fresh and not above:
            ordinary(t, me, source, tree.parent[me], path, ek)
    delays: list[float] = []
    lost = 0
    for ek, (born, _source, ev) in enumerate(published):
        for r, fs in subs.items():
            if any(f.matches(ev) for f in fs):
                at = got.get(ek, {}).get(r)
                if at is None:
                    lost += 1
                else:
                    delays.append(at - born)
    delays.sort()
    return {
        "routers": len(routers),
        "events": len(published),
        "link": count,
        "mean": statistics.fmean(delays),
        "p99": delays[int(0.99 * (len(delays) - 1))],
        "max": delays[-1],
        "messages": messages / len(published),
        "lost": lost,
        "extra": extra,
    }


def _max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _progress(sim: HandoverSim) -> None:
    """A long heal's progress, on stderr: where the simulation's clock is, and its cost."""
    print(
        f"#   at {sim.clock.now:.4f} s: {sim.controls} controls, {len(sim.heap)} in flight, "
        f"{time.process_time():.0f} s of CPU, max RSS {_max_rss_mb():.0f} MB, "
        f"load {os.getloadavg()[0]:.1f}",
        file=sys.stderr,
        flush=True,
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    p.add_argument("--graphs", nargs="+", choices=sorted(GRAPHS), default=sorted(GRAPHS))
    p.add_argument("--events", type=int, default=300)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--only",
        choices=["steady", "changes", "death", "heal", "subscribe", "congestion", "cap"],
        nargs="+",
    )
    p.add_argument(
        "--partitions",
        nargs="+",
        choices=["long", "short"],
        default=["long", "short"],
        help="which partitions the heal table heals",
    )
    p.add_argument(
        "--caps",
        type=int,
        nargs="+",
        default=[1024, MAX_ROUTERS],
        help="view sizes (MeshConfig.max_routers) for the cap table",
    )
    args = p.parse_args()
    only = set(
        args.only or ["steady", "changes", "death", "heal", "subscribe", "congestion", "cap"]
    )
    # Events every millisecond up to 1,000 routers; fewer beyond (each costs a flood while
    # the mesh is unsettled).
    every = {n: 0.001 * max(1, n // 1000) for n in args.sizes}
    if "steady" in only:
        print(
            "| graph | routers | links | subscribers | msgs/event interest | tree | flood | "
            "interest/tree |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for kind in args.graphs:
            for n in args.sizes:
                for share in (0.01, 0.10):
                    r = steady(kind, n, share, args.events, args.seed)
                    ratio = r["interest"] / max(r["tree"], 1e-9)
                    print(
                        f"| {kind} | {r['routers']} | {r['links']} | {share:.0%} | "
                        f"{r['interest']:.1f} | {r['tree']:.1f} | {r['flood']:.0f} | "
                        f"{ratio:.2f} |",
                        flush=True,
                    )
        print()
    if "changes" in only:
        print(
            "| graph | routers | subscribers | changes that change the summary | "
            "control msgs per summary flood | per subscription change | summary bytes |"
        )
        print("|---|---|---|---|---|---|---|")
        for kind in args.graphs:
            for n in args.sizes:
                for share in (0.01, 0.10):
                    c = changes(kind, n, share, args.seed)
                    print(
                        f"| {kind} | {c['routers']} | {share:.0%} | {c['changed']:.0%} | "
                        f"{c['flood']} | {c['messages']:.0f} | {c['bytes']:.0f} |",
                        flush=True,
                    )
        print()
    if "death" in only:
        print(
            "| graph | routers | subscribers | events | lost (through it) | lost (other) | "
            "converged after (s) | msgs/event |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for kind in args.graphs:
            for n in args.sizes:
                for share in (0.01, 0.10):
                    d = death(kind, n, share, args.seed, every[n])
                    print(
                        f"| {kind} | {d['routers']} | {share:.0%} | {d['events']} | "
                        f"{d['lost_through']} | {d['lost_other']} | {d['converged']:.2f} | "
                        f"{d['messages']:.1f} |",
                        flush=True,
                    )
        print()
    if "heal" in only:
        print(
            "| graph | routers | cut links | partition | events | lost | converged after (s) | "
            "routers that waited out the catch-up | controls after the heal | msgs/event | "
            "interest CPU per router, mean / max (ms) |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for kind in args.graphs:
            for n in args.sizes:
                for short in (p == "short" for p in args.partitions):
                    cpu, wall = time.process_time(), time.perf_counter()
                    h = heal(kind, n, 0.10, args.seed, every[n] * 5, short, _progress)
                    print(
                        f"# {kind} {n} {'short' if short else 'long'}: "
                        f"{time.process_time() - cpu:.0f} s of CPU, "
                        f"{time.perf_counter() - wall:.0f} s of wall time, "
                        f"max RSS {_max_rss_mb():.0f} MB, load {os.getloadavg()[0]:.1f}",
                        file=sys.stderr,
                        flush=True,
                    )
                    print(
                        f"| {kind} | {h['routers']} | {h['cut']} | {'short' if short else 'long'} "
                        f"| {h['events']} | {h['lost']} | {h['converged']:.2f} | "
                        f"{h['waited_out']} | {h['controls']} | {h['messages']:.1f} | "
                        f"{h['cpu_mean'] * 1e3:.0f} / {h['cpu_max'] * 1e3:.0f} |",
                        flush=True,
                    )
        print()
    if "subscribe" in only:
        print(
            "| graph | routers | hops to the far side | new interest known, median router (ms) | "
            "farthest router (ms) |"
        )
        print("|---|---|---|---|---|")
        for kind in args.graphs:
            for n in args.sizes:
                s = subscribe_latency(kind, n, args.seed)
                print(
                    f"| {kind} | {s['routers']} | {s['hops']} | {1000 * s['median']:.1f} | "
                    f"{1000 * s['far']:.1f} |",
                    flush=True,
                )
        print()
    if "congestion" in only:
        print(
            "| graph | routers | subscribers | events | copies on the busy link | detours | "
            "delay mean (ms) | p99 (ms) | max (ms) | msgs/event | lost | extra copies |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for kind in args.graphs:
            for n in args.sizes:
                for share in (0.01, 0.10):
                    for detour in (False, True):
                        c = congestion(kind, n, share, args.seed, every[n], detour)
                        print(
                            f"| {kind} | {c['routers']} | {share:.0%} | {c['events']} | "
                            f"{c['link']} | {'yes' if detour else 'no'} | "
                            f"{1000 * c['mean']:.1f} | {1000 * c['p99']:.1f} | "
                            f"{1000 * c['max']:.1f} | {c['messages']:.2f} | {c['lost']} | "
                            f"{c['extra']} |",
                            flush=True,
                        )
        print()
    if "cap" in only:
        print(
            "| graph | routers | subscribers | view room | routers held | msgs/event | "
            "forwarding CPU (us/event) | trees kept |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for kind in args.graphs:
            for n in args.sizes:
                for cap in args.caps:
                    c = capped(kind, n, 0.01, args.events, args.seed, cap)
                    print(
                        f"| {kind} | {c['routers']} | 1% | {cap} | {c['held']} | "
                        f"{c['messages']:.1f} | {c['us']:.0f} | {c['trees']} |",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
