"""Flooding rules as pure code: a simulated mesh where every router runs `FloodRules`."""

from __future__ import annotations

import gc
import random
from collections import Counter, deque
from dataclasses import dataclass, field

import pytest

from aa.mesh import DEFAULT_TTL, MAX_TTL, FloodRules, Hop, MalformedFrame, SeenIds, UsageError
from aa.mesh.flood import check_flood_meta

# -- SeenIds -------------------------------------------------------------------------------


def test_seen_ids_new_then_duplicate() -> None:
    seen = SeenIds()
    assert seen.check("a", 0.0)
    assert not seen.check("a", 0.0)
    assert not seen.check("a", 100.0)
    assert "a" in seen and "b" not in seen


def test_seen_ids_bounded_by_age() -> None:
    seen = SeenIds(max_ids=1000, max_age=10.0)
    assert seen.check("a", 0.0)
    # Kept at least max_age / 2 ...
    assert not seen.check("a", 4.9)
    # ... and never longer than max_age.
    assert seen.check("a", 10.0)


def test_seen_ids_age_limit_holds_across_rotations() -> None:
    seen = SeenIds(max_ids=1000, max_age=10.0)
    for t in range(0, 100):
        now = t * 0.7
        seen.check(f"id-{t}", now)
        # every id remembered is younger than max_age; every id younger than max_age/2 is kept
        for u in range(t + 1):
            age = now - u * 0.7
            if age < 5.0:
                assert f"id-{u}" in seen, (t, u)
            if age >= 10.0:
                assert f"id-{u}" not in seen, (t, u)


def test_seen_ids_bounded_by_count() -> None:
    seen = SeenIds(max_ids=100, max_age=1e9)
    for i in range(1000):
        assert seen.check(str(i), 0.0)
        assert len(seen) <= 100
        # the last max_ids / 2 ids are always remembered
        assert all(str(j) in seen for j in range(max(0, i - 49), i + 1))


def test_seen_ids_keep_exactly_their_window_and_stay_out_of_the_collector() -> None:
    """A generation moves at exactly max_ids / 2 ids (whatever it holds besides them), its
    ids are counted, nothing else is, and neither generation is walked by the collector."""
    seen = SeenIds(max_ids=100, max_age=1e9)
    for i in range(100):
        assert seen.check(f"id-{i}", 0.0)
    assert len(seen) == 100 and "id-0" in seen
    assert seen.check("id-100", 0.0)  # the oldest generation goes whole
    assert len(seen) == 51 and "id-49" not in seen and "id-50" in seen
    assert seen.check_many(["id-50", "id-101"], 0.0) == [False, True] and len(seen) == 52
    assert seen.check(0, 0.0) and seen.check(None, 0.0)  # ids of other types are ids too
    assert not any(gc.is_tracked(g) for g in (seen._current, seen._previous))


def test_seen_ids_check_many_says_what_check_of_each_says() -> None:
    """A relayed group's ids checked in one call: the same answers and the same memory as one
    call per id, across generations moving (by count and by age) inside a group."""
    rng = random.Random(7)
    one, many = SeenIds(max_ids=40, max_age=5.0), SeenIds(max_ids=40, max_age=5.0)
    now = 0.0
    for _ in range(300):
        now += rng.random()
        ids = [f"e{rng.randrange(120)}" for _ in range(rng.randrange(1, 12))]
        assert many.check_many(ids, now) == [one.check(i, now) for i in ids]
        assert all((i in many) == (i in one) for i in (f"e{k}" for k in range(120)))
    rules = FloodRules("me")
    assert rules.first_many(["a", "b", "a"], 0.0) == [True, True, False]
    assert rules.first_many(["b", "c"], 0.0) == [False, True]


def test_seen_ids_expire_when_idle() -> None:
    seen = SeenIds(max_ids=100, max_age=10.0)
    seen.check("a", 0.0)
    seen.expire(6.0)
    assert "a" in seen  # moved to the older generation
    seen.expire(20.0)
    assert "a" not in seen and len(seen) == 0


@pytest.mark.parametrize("kwargs", [{"max_ids": 1}, {"max_age": 0}, {"max_ids": 2.5}])
def test_seen_ids_rejects_bad_limits(kwargs: dict) -> None:
    with pytest.raises(UsageError):
        SeenIds(**kwargs)


# -- FloodRules, one router ---------------------------------------------------------------


def test_originate_and_receive() -> None:
    a, b = FloodRules("A"), FloodRules("B")
    hop = a.originate("e1", 0.0)
    assert hop == Hop(DEFAULT_TTL, ["A"])
    assert a.originate("e1", 0.0) is None  # re-published after a fail-over: a duplicate
    assert a.forward_to(hop, ["B", "C"]) == ["B", "C"]
    got = b.receive("e1", hop.ttl, hop.path, 0.0)
    assert got == Hop(DEFAULT_TTL - 1, ["A", "B"])
    assert b.forward_to(got, ["A", "C"]) == ["C"]
    assert b.receive("e1", hop.ttl, ["A", "C"], 0.0) is None


def test_own_id_on_path_is_dropped_even_when_forgotten() -> None:
    b = FloodRules("B", seen=SeenIds(max_ids=10, max_age=1.0))
    assert b.receive("e1", 5, ["A"], 0.0) is not None
    # Much later the id is forgotten; a copy that went round a cycle still carries B.
    assert b.receive("e1", 3, ["A", "B", "C"], 100.0) is None


def test_ttl_exhausted_is_dispatched_not_forwarded() -> None:
    b = FloodRules("B")
    hop = b.receive("e1", 1, ["A"], 0.0)
    assert hop is not None and hop.ttl == 0
    assert b.forward_to(hop, ["C"]) == []
    broken = b.receive("e2", 0, ["A"], 0.0)  # a peer forwarded a spent copy
    assert broken is not None and broken.ttl == 0


def test_ttl_from_peer_is_clamped() -> None:
    hop = FloodRules("B").receive("e1", 10**12, ["A"], 0.0)
    assert hop is not None and hop.ttl == MAX_TTL - 1


def test_forward_to_skips_came_from() -> None:
    hop = Hop(3, ["A", "B"])
    assert FloodRules.forward_to(hop, ["A", "C", "X"], came_from="X") == ["C"]


@pytest.mark.parametrize(
    "ttl, path",
    [("1", ["A"]), (True, ["A"]), (1, "A"), (1, []), (1, [1]), (1, ["x" * 65]), (1, ["A"] * 300)],
)
def test_check_flood_meta_rejects(ttl: object, path: object) -> None:
    with pytest.raises(MalformedFrame):
        check_flood_meta(ttl, path)


def test_bad_rules_config() -> None:
    with pytest.raises(UsageError):
        FloodRules("")
    with pytest.raises(UsageError):
        FloodRules("A", initial_ttl=MAX_TTL + 1)


# -- a simulated mesh --------------------------------------------------------------------


@dataclass
class Mesh:
    """Routers joined by links; copies queued and delivered one at a time."""

    links: dict[str, set[str]]
    initial_ttl: int = DEFAULT_TTL
    rng: random.Random | None = None  # None: first in, first out; else random order
    lifo: bool = False  # last in, first out: copies race down detours first
    rules: dict[str, FloodRules] = field(init=False)
    dispatched: Counter = field(default_factory=Counter)  # (router, id) -> times
    messages: int = 0
    duplicates: int = 0
    now: float = 0.0

    def __post_init__(self) -> None:
        self.rules = {r: FloodRules(r, initial_ttl=self.initial_ttl) for r in self.links}
        self.queue: deque[tuple[str, str, str, int, list[str]]] = deque()

    def publish(self, router: str, id: str) -> None:
        hop = self.rules[router].originate(id, self.now)
        assert hop is not None
        self._accept(router, id, hop, came_from=None)

    def _accept(self, router: str, id: str, hop: Hop, came_from: str | None) -> None:
        self.dispatched[router, id] += 1
        for peer in self.rules[router].forward_to(hop, sorted(self.links[router]), came_from):
            self.messages += 1
            self.queue.append((peer, router, id, hop.ttl, hop.path))

    def run(self) -> None:
        while self.queue:
            if self.lifo:
                item = self.queue.pop()
            elif self.rng is None:
                item = self.queue.popleft()
            else:
                i = self.rng.randrange(len(self.queue))
                self.queue[i], self.queue[-1] = self.queue[-1], self.queue[i]
                item = self.queue.pop()
            router, sender, id, ttl, path = item
            self.now += 0.001
            check_flood_meta(ttl, path)
            hop = self.rules[router].receive(id, ttl, path, self.now)
            if hop is None:
                self.duplicates += 1
            else:
                self._accept(router, id, hop, came_from=sender)

    @property
    def edges(self) -> int:
        return sum(len(v) for v in self.links.values()) // 2


def _graph(edges: list[tuple[int, int]], n: int) -> dict[str, set[str]]:
    links: dict[str, set[str]] = {f"R{i}": set() for i in range(n)}
    for a, b in edges:
        links[f"R{a}"].add(f"R{b}")
        links[f"R{b}"].add(f"R{a}")
    return links


def line(n: int) -> dict[str, set[str]]:
    return _graph([(i, i + 1) for i in range(n - 1)], n)


def ring(n: int) -> dict[str, set[str]]:
    return _graph([(i, (i + 1) % n) for i in range(n)], n)


def full(n: int) -> dict[str, set[str]]:
    return _graph([(i, j) for i in range(n) for j in range(i + 1, n)], n)


def random_graph(n: int, extra: int, seed: int) -> dict[str, set[str]]:
    """A random spanning tree (so it is connected) plus *extra* random links (cycles)."""
    rng = random.Random(seed)
    edges = {(rng.randrange(i), i) for i in range(1, n)}
    while len(edges) < n - 1 + extra:
        a, b = sorted(rng.sample(range(n), 2))
        edges.add((a, b))
    return _graph(sorted(edges), n)


def _diameter(links: dict[str, set[str]]) -> int:
    worst = 0
    for start in links:
        dist = {start: 0}
        todo = deque([start])
        while todo:
            r = todo.popleft()
            for p in links[r]:
                if p not in dist:
                    dist[p] = dist[r] + 1
                    todo.append(p)
        assert len(dist) == len(links)
        worst = max(worst, max(dist.values()))
    return worst


def assert_exactly_once(mesh: Mesh, ids: list[str]) -> None:
    for router in mesh.links:
        for id in ids:
            assert mesh.dispatched[router, id] == 1, (router, id)
    n = len(mesh.links)
    # Cost: at least a spanning tree, at most one copy per direction of each link.
    assert len(ids) * (n - 1) <= mesh.messages <= len(ids) * 2 * mesh.edges
    assert mesh.messages - mesh.duplicates == len(ids) * (n - 1)


def test_line_each_link_once() -> None:
    mesh = Mesh(line(10))
    mesh.publish("R0", "e1")
    mesh.run()
    assert_exactly_once(mesh, ["e1"])
    assert mesh.messages == 9 and mesh.duplicates == 0


def test_line_from_the_middle() -> None:
    mesh = Mesh(line(9))
    mesh.publish("R4", "e1")
    mesh.run()
    assert_exactly_once(mesh, ["e1"])
    assert mesh.messages == 8


@pytest.mark.parametrize("n", [3, 4, 7, 10])
def test_ring(n: int) -> None:
    mesh = Mesh(ring(n))
    mesh.publish("R0", "e1")
    mesh.run()
    assert_exactly_once(mesh, ["e1"])
    # Both ways round: the origin sends two, every other router forwards one to its other
    # neighbour; where the two fronts meet, two copies are duplicates.
    assert mesh.messages == n + 1 and mesh.duplicates == 2


@pytest.mark.parametrize("n", [2, 5, 12])
def test_full_mesh(n: int) -> None:
    mesh = Mesh(full(n))
    mesh.publish("R0", "e1")
    mesh.run()
    assert_exactly_once(mesh, ["e1"])
    # The origin sends n-1; each other router forwards to the n-2 not on its path.
    assert mesh.messages == (n - 1) + (n - 1) * (n - 2)


@pytest.mark.parametrize("seed", range(20))
def test_random_graphs_with_cycles_any_order(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randrange(5, 40)
    links = random_graph(n, extra=rng.randrange(1, 2 * n), seed=seed)
    assert len(links) <= DEFAULT_TTL + 1  # reach is then guaranteed whatever the order
    mesh = Mesh(links, rng=random.Random(seed + 1000))  # copies delivered in random order
    ids = [f"e{i}" for i in range(10)]
    for id in ids:
        mesh.publish(f"R{rng.randrange(n)}", id)  # ten floods interleaved
    mesh.run()
    assert_exactly_once(mesh, ids)


def test_ttl_bounds_reach() -> None:
    mesh = Mesh(line(20), initial_ttl=5)
    mesh.publish("R0", "e1")
    mesh.run()
    reached = {r for (r, _id) in mesh.dispatched}
    assert reached == {f"R{i}" for i in range(6)}  # the origin and five hops
    assert mesh.messages == 5


def test_ttl_zero_stays_home() -> None:
    mesh = Mesh(full(4), initial_ttl=0)
    mesh.publish("R0", "e1")
    mesh.run()
    assert mesh.messages == 0 and mesh.dispatched["R0", "e1"] == 1


def test_ttl_alone_ends_a_flood_when_ids_are_forgotten() -> None:
    # Routers that remember (almost) nothing: dedup forgets at once, only path and ttl remain.
    mesh = Mesh(full(5), initial_ttl=4)
    for r in mesh.rules:
        mesh.rules[r] = FloodRules(r, seen=SeenIds(max_ids=2, max_age=1e-9), initial_ttl=4)
    mesh.publish("R0", "e1")
    mesh.run()  # terminates: the path and the ttl bound every copy's route
    assert {r for (r, _id) in mesh.dispatched} == set(mesh.links)


def test_duplicate_from_late_copy_after_window_is_caught_by_path() -> None:
    b = FloodRules("B", seen=SeenIds(max_ids=100, max_age=10.0))
    hop = b.receive("e1", 5, ["A"], now=0.0)
    assert hop is not None
    assert b.receive("e1", 5, ["A"], now=3.0) is None  # inside the window
    # A copy that passed B and comes back after the window: B is on its path.
    assert b.receive("e1", 2, ["A", "B", "C"], now=60.0) is None


@pytest.mark.parametrize("seed", range(5))
def test_first_in_first_out_reaches_the_diameter(seed: int) -> None:
    # Copies at equal speed: the first copy comes the short way, so ttl = diameter suffices.
    links = random_graph(60, extra=30, seed=seed)
    mesh = Mesh(links, initial_ttl=_diameter(links))
    mesh.publish("R0", "e1")
    mesh.run()
    assert_exactly_once(mesh, ["e1"])


def test_detour_first_with_a_short_ttl_misses_and_a_long_ttl_does_not() -> None:
    # R0-R1 directly, and a detour R0-R2-R3-R1; beyond R1 a tail R1-R4-R5.
    edges = [(0, 1), (0, 2), (2, 3), (3, 1), (1, 4), (4, 5)]
    short = Mesh(_graph(edges, 6), initial_ttl=3, lifo=True)  # diameter 3, detour taken first
    short.publish("R0", "e1")
    short.run()
    assert short.dispatched["R1", "e1"] == 1
    assert short.dispatched["R5", "e1"] == 0  # R1 heard it with its ttl spent by the detour
    assert all(v <= 1 for v in short.dispatched.values())  # never twice, though
    long = Mesh(_graph(edges, 6), initial_ttl=5, lifo=True)  # n - 1
    long.publish("R0", "e1")
    long.run()
    assert_exactly_once(long, ["e1"])
