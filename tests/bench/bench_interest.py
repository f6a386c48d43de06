"""Interest routing on big meshes, simulated: the forwarding rule of `aa.mesh.interest` (the
very code the routers run) over random geometric graphs, without sockets.

    python tests/bench/bench_interest.py                   # 100 and 1,000 routers
    python tests/bench/bench_interest.py --sizes 100 --events 100

Meshes: random geometric graphs in the unit square of mean degree about 4, their islands
joined each by its shortest link. Subscribers on 1% and on 10% of the routers, each with one to
three patterns drawn from a mix: a type (50 types, Zipf-popular), a type and a site
(``type == "t7" and site == "s3"``, 20 sites), or a site alone. Events: a Zipf-drawn type
and a uniform site, from a random router.

Steady state, per event: link messages under interest routing, under the shortest-path tree
that reaches exactly the routers whose subscriptions match (the reference), and under
flooding (every router sends to each neighbour not on the copy's path).

A router's death: events are published every millisecond from 50 sources; each link has a
fixed delay of 0.5-1.5 ms (links are FIFO, as TCP is). At 0.5 s the router carrying the most
interest traffic dies: its neighbours see the links go at once (a crash resets its TCP
connections) and flood their new summaries; each router floods while unsettled (from the
first notice it gets to `SETTLE_TIME` after the last) and then routes on the new view.
Copies in flight to the dead router are lost, as with flooding; what counts is whether a
router that wanted an event missed it. "lost (through it)" are events that were inside the
dead router or on their way to it when it died, for routers behind it: flooding would have
had other copies; "lost (other)" must be zero.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
from collections import deque

from aa.mesh import Event, Interest, InterestFilter, MeshInterests
from aa.mesh.interest import SETTLE_TIME

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


def zipf(rng: random.Random, k: int) -> int:
    weights = [1 / (i + 1) for i in range(k)]
    return rng.choices(range(k), weights)[0]


def subscriptions(rng: random.Random) -> list[InterestFilter]:
    out = []
    for _ in range(rng.randint(1, 3)):
        kind = rng.random()
        t, s = f"t{zipf(rng, TYPES)}", f"s{rng.randrange(SITES)}"
        if kind < 0.5:
            out.append(InterestFilter(type=t))
        elif kind < 0.85:
            out.append(InterestFilter.make(type=t, eq=[("site", s)]))
        else:
            out.append(InterestFilter.make(eq=[("site", s)]))
    return out


def event(rng: random.Random) -> Event:
    return Event(values={"site": f"s{rng.randrange(SITES)}"}, type=f"t{zipf(rng, TYPES)}")


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


def steady(n: int, share: float, events: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    graph = geometric(n, 4.0, rng)
    routers = sorted(graph)
    subs = {r: subscriptions(rng) for r in rng.sample(routers, max(1, round(share * len(routers))))}
    view = MeshInterests(max_routers=len(routers))
    for r in routers:
        view.put(r, graph[r], Interest.of(subs.get(r, [])))
    m_int = m_ref = m_flood = 0
    for _ in range(events):
        source, ev = rng.choice(routers), event(rng)
        wanting = {r for r, fs in subs.items() if any(f.matches(ev) for f in fs)}
        m_int += walk(view, graph, source, ev)
        m_ref += reference(tree_parent(graph, source), wanting)
        m_flood += walk(None, graph, source, ev) if _ < 20 else 0
    edges = sum(len(v) for v in graph.values()) // 2
    return {
        "routers": len(routers),
        "links": edges,
        "interest": m_int / events,
        "tree": m_ref / events,
        "flood": m_flood / min(events, 20),
        "summary": 2 * edges - (len(routers) - 1),  # one control flood per change
    }


def death(n: int, share: float, seed: int, duration: float = 2.5) -> dict[str, float]:
    rng = random.Random(seed)
    graph = geometric(n, 4.0, rng)
    routers = sorted(graph)
    subs = {r: subscriptions(rng) for r in rng.sample(routers, max(1, round(share * len(routers))))}
    interests = {r: Interest.of(subs.get(r, [])) for r in routers}
    old = MeshInterests(max_routers=len(routers))
    for r in routers:
        old.put(r, graph[r], interests[r])
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
    new = MeshInterests(max_routers=len(routers))
    for r in routers:
        new.put(r, graph[r] if r == dead else new_graph[r], interests[r])
    delay = {}
    for a, ps in graph.items():
        for b in ps:
            if a < b:
                delay[a, b] = delay[b, a] = rng.uniform(0.0005, 0.0015)
    t0 = 0.5
    # When each router hears each of the dead router's neighbours tell (Dijkstra per teller).
    first = dict.fromkeys(new_graph, math.inf)
    last = dict.fromkeys(new_graph, 0.0)
    for teller in graph[dead]:
        at = {teller: t0}
        heap = [(t0, teller)]
        while heap:
            t, v = heapq.heappop(heap)
            if t > at.get(v, math.inf):
                continue
            for w in new_graph[v]:
                tw = t + delay[v, w]
                if tw < at.get(w, math.inf):
                    at[w] = tw
                    heapq.heappush(heap, (tw, w))
        for r in new_graph:
            first[r] = min(first[r], at.get(r, math.inf))
            last[r] = max(last[r], at.get(r, math.inf))
    settled = {r: last[r] + SETTLE_TIME for r in new_graph}

    def rule(me: str, source: str, came: str | None, ev: Event, t: float) -> list[str] | None:
        if t < first.get(me, math.inf):
            return old.forward(me, source, came, ev)
        if t < settled[me]:
            return None
        return new.forward(me, source, came, ev)

    heap: list[tuple[float, int, str, str | None, tuple[str, ...], int]] = []
    seq = 0
    got: dict[int, set[str]] = {}
    evs: dict[int, tuple[Event, float]] = {}
    k = 0
    t = 0.0
    while t < duration:
        source = sources[k % len(sources)]
        ev = event(rng)
        evs[k] = (ev, t)
        heap.append((t, seq, source, None, (), k))
        seq += 1
        k += 1
        t += 0.001
    heapq.heapify(heap)
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
        ev, _born = evs[ek]
        targets = rule(me, path[0], came, ev, t)
        if targets is None:
            targets = [p for p in graph[me] if p not in path]
        for w in targets:
            if t >= t0 and (w == dead or me == dead):
                continue  # the link is gone
            messages += 1
            heapq.heappush(heap, (t + delay[me, w], seq, w, me, path, ek))
            seq += 1
    through = other = 0
    for ek, (ev, born) in evs.items():
        wanting = {r for r, fs in subs.items() if r != dead and any(f.matches(ev) for f in fs)}
        missed = wanting - got.get(ek, set())
        if missed:
            if born < t0:
                through += 1
            else:
                other += 1
    return {
        "routers": len(routers),
        "events": len(evs),
        "lost_through": through,
        "lost_other": other,
        "converged": max(settled.values()) - t0,
        "messages": messages / len(evs),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    p.add_argument("--events", type=int, default=300)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    print(
        "| routers | links | subscribers | msgs/event interest | tree | flood | "
        "interest/tree | summary msgs/change |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for n in args.sizes:
        for share in (0.01, 0.10):
            r = steady(n, share, args.events, args.seed)
            ratio = r["interest"] / max(r["tree"], 1e-9)
            print(
                f"| {r['routers']} | {r['links']} | {share:.0%} | {r['interest']:.1f} | "
                f"{r['tree']:.1f} | {r['flood']:.0f} | {ratio:.2f} | {r['summary']} |",
                flush=True,
            )
    print()
    print(
        "| routers | subscribers | events | lost (through it) | lost (other) | "
        "converged after (s) | msgs/event |"
    )
    print("|---|---|---|---|---|---|---|")
    for n in args.sizes:
        for share in (0.01, 0.10):
            d = death(n, share, args.seed)
            print(
                f"| {d['routers']} | {share:.0%} | {d['events']} | {d['lost_through']} | "
                f"{d['lost_other']} | {d['converged']:.2f} | {d['messages']:.1f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
