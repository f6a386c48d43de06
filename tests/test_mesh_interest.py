"""Interest summaries and the forwarding rule (`aa.mesh.interest`), without sockets: merged
and covered summaries, caps a peer cannot pass, and the rule that sends an event only
toward routers that may want it, yet reaches every one of them on any graph."""

import random

import pytest

from aa.mesh import Event, Interest, InterestFilter, InterestTable, InvalidValue, MeshInterests
from aa.mesh import interest as interest_module
from aa.mesh.interest import (
    CACHED,
    MAX_CONSTRAINTS,
    MAX_DECODED,
    MAX_FILTERS,
    MAX_SHARED_ANSWERS,
    MAX_TYPE_ANSWERS,
    MAX_TYPES,
    PERSISTED,
)

HOT = InterestFilter(type="hot")


def ev(type=None, meta=None, **values):
    return Event(values=values, type=type, meta=meta or {})


def test_many_equal_or_covered_subscriptions_make_one_filter():
    filters = [HOT] * 1000 + [InterestFilter.make(type="hot", eq=[("site", "a")])]
    filters += [InterestFilter.make(eq=[("site", "b")]), InterestFilter.make(has=["site"])]
    interest = Interest.of(filters)
    assert interest.types == {"hot"}
    assert interest.filters == {InterestFilter(has=("site",))}  # covers site == "b"


def test_a_filter_that_accepts_everything_makes_anything():
    assert Interest.of([HOT, InterestFilter()]) is Interest.ANYTHING
    assert Interest.ANYTHING.covers(Interest.of([HOT]))
    assert not Interest.of([HOT]).covers(Interest.ANYTHING)


def test_filters_say_may_match_as_the_index_compares():
    f = InterestFilter.make(type="t", eq=[("n", 1)])
    assert f.matches(ev("t", n=1.0)) and f.matches(ev("t", n=True))
    assert not f.matches(ev("t", n="1"))
    assert not f.matches(ev("t", n=[1]))  # a list equals no constant
    assert not f.matches(ev("t"))
    assert not f.matches(ev("u", n=1))
    store = InterestFilter(flags=PERSISTED)
    assert store.matches(ev(meta={"persist": True})) and not store.matches(ev())
    cache = InterestFilter(flags=CACHED)
    assert cache.matches(ev()) and not cache.matches(ev(meta={"mesh_cache": False}))


def test_past_the_caps_a_summary_widens_and_never_grows():
    typed = [InterestFilter.make(type=f"t{i % 3}", eq=[("x", i)]) for i in range(MAX_FILTERS + 1)]
    assert Interest.of(typed) == Interest.of([InterestFilter(type=f"t{i}") for i in range(3)])
    untyped = [InterestFilter.make(eq=[("x", i)]) for i in range(MAX_FILTERS + 1)]
    widened = Interest.of(untyped)  # each needs a value "x": so does the widened summary
    assert widened.filters == {InterestFilter(has=("x",))} and not widened.anything
    assert widened.may_match(Event(values={"x": 9999}, type="any"))
    assert not widened.may_match(Event(values={"y": 1}, type="any"))
    cached = [InterestFilter.make(eq=[("x", i)], flags=CACHED) for i in range(MAX_FILTERS + 1)]
    assert Interest.of(cached).filters == {InterestFilter(has=("x",), flags=CACHED)}
    names = [InterestFilter.make(eq=[(f"n{i}", 1)]) for i in range(2 * MAX_FILTERS + 2)]
    assert Interest.of(names) is Interest.ANYTHING  # too many names even once widened
    many_types = [InterestFilter(type=f"t{i}") for i in range(MAX_TYPES + 1)]
    assert Interest.of(many_types) is Interest.ANYTHING
    long = InterestFilter.make(type="t", eq=[(f"n{i}", i) for i in range(10)])
    assert len(long.eq) == MAX_CONSTRAINTS  # fewer conditions: accepts more, still sound
    assert InterestFilter.make(type="x" * 1000).universal  # a type too long: any type


def test_the_wire_round_trips_and_refuses_what_is_over_the_caps():
    interest = Interest.of([HOT, InterestFilter.make(eq=[("site", "a")], flags=PERSISTED)])
    assert Interest.from_wire(interest.to_wire()) == interest
    assert Interest.from_wire(Interest.ANYTHING.to_wire()) is Interest.ANYTHING
    bad = [
        "x",
        {"types": "hot"},
        {"types": [f"t{i}" for i in range(MAX_TYPES + 1)]},
        {"f": [[None, [], [], 0]] * (MAX_FILTERS + 1)},
        {"f": [[None, [["n", [1]]], [], 0]]},
        {"f": [[None, [], [], 64]]},
        {"f": [[1, [], [], 0]]},
    ]
    for data in bad:
        with pytest.raises(InvalidValue):
            Interest.from_wire(data)


def test_a_summary_handed_over_by_many_peers_is_decoded_once_and_shared():
    wire = Interest.of([HOT, InterestFilter.make(eq=[("site", "a")])]).to_wire()
    first = Interest.from_wire_shared(wire)
    again = Interest.from_wire_shared(Interest.from_wire(wire).to_wire())  # another peer's copy
    assert again is first and first == Interest.from_wire(wire)
    # Constants that compare equal but match differently stay apart.
    forms = [Interest.from_wire_shared({"f": [[None, [["n", c]], [], 0]]}) for c in (1, True, 1.0)]
    assert [next(iter(i.filters)).eq[0][1] for i in forms] == [1, True, 1.0]
    assert [type(next(iter(i.filters)).eq[0][1]) for i in forms] == [int, bool, float]
    for data in ["x", {"f": [[1, [], [], 0]]}, {"f": [[None, [["n", object()]], [], 0]]}]:
        for _ in range(2):  # refused every time: a refused form is not kept
            with pytest.raises(InvalidValue):
                Interest.from_wire_shared(data)
    # A peer sending ever new summaries fills the cache only to its bound.
    for i in range(MAX_DECODED + 10):
        Interest.from_wire_shared({"types": [f"t{i}"]})
    assert len(interest_module._decoded.interests) <= MAX_DECODED


def ring(n):
    """r1..rn in a ring: router -> its peers."""
    ids = [f"r{i}" for i in range(1, n + 1)]
    return {r: [ids[i - 1], ids[(i + 1) % n]] for i, r in enumerate(ids)}


def walk(view, graph, source, event):
    """Carry *event* from *source* by the rule; flood where the rule says so. Returns
    (routers reached, link messages)."""
    reached = {source}
    messages = 0
    queue = [(source, None, [source])]
    while queue:
        me, came_from, path = queue.pop(0)
        targets = view.forward(me, source, came_from, event)
        if targets is None:
            targets = [p for p in graph[me] if p not in path]
        for t in targets:
            messages += 1
            if t not in reached:
                reached.add(t)
                queue.append((t, me, [*path, t]))
    return reached, messages


def test_the_ring_of_the_issue_carries_hot_to_r3_and_cold_nowhere():
    graph = ring(6)
    view = MeshInterests()
    for rid, peers in graph.items():
        view.put(rid, peers, Interest.of([HOT]) if rid == "r3" else Interest.NOTHING)
    reached, messages = walk(view, graph, "r1", ev("hot"))
    assert reached == {"r1", "r2", "r3"} and messages == 2
    reached, messages = walk(view, graph, "r1", ev("cold"))
    assert reached == {"r1"} and messages == 0


def test_an_incomplete_view_or_a_copy_off_the_tree_floods():
    graph = ring(4)
    view = MeshInterests()
    for rid, peers in graph.items():
        view.put(rid, peers, Interest.NOTHING)
    assert view.forward("r1", "r1", None, ev("x")) == []
    # r3's parent in r1's tree is r2 (the smaller id): a copy from r4 is off the tree.
    assert view.forward("r3", "r1", "r2", ev("x")) == []
    assert view.forward("r3", "r1", "r4", ev("x")) is None
    view.put("r4", ["r1", "r3", "r9"], Interest.NOTHING)  # r9 has told us nothing
    assert not view.complete
    assert view.forward("r1", "r1", None, ev("x")) is None


def random_geometric(n, degree, rng):
    """A connected random geometric graph of about *degree* mean degree."""
    import math

    while True:
        pts = {f"r{i:04d}": (rng.random(), rng.random()) for i in range(n)}
        radius = math.sqrt(degree / (math.pi * n))
        graph = {r: [] for r in pts}
        ids = list(pts)
        for i, a in enumerate(ids):
            for b in ids[i + 1 :]:
                if math.dist(pts[a], pts[b]) < radius:
                    graph[a].append(b)
                    graph[b].append(a)
        seen, stack = {ids[0]}, [ids[0]]
        while stack:
            for w in graph[stack.pop()]:
                if w not in seen:
                    seen.add(w)
                    stack.append(w)
        if len(seen) == n:
            return graph


@pytest.mark.parametrize("seed", range(5))
def test_every_interested_router_is_reached_on_random_graphs(seed):
    rng = random.Random(seed)
    graph = random_geometric(60, 4, rng)
    wanting = set(rng.sample(sorted(graph), 6))
    view = MeshInterests()
    for rid, peers in graph.items():
        view.put(rid, peers, Interest.of([HOT]) if rid in wanting else Interest.NOTHING)
    edges = sum(len(p) for p in graph.values()) // 2
    for source in rng.sample(sorted(graph), 10):
        reached, messages = walk(view, graph, source, ev("hot"))
        assert wanting <= reached
        assert messages == len(reached) - 1 < edges  # a tree: one message per router reached
        assert walk(view, graph, source, ev("cold")) == ({source}, 0)


@pytest.mark.parametrize("seed", range(3))
def test_a_batch_gets_the_answers_each_of_its_events_would(seed):
    """A router asks for a whole batch at once: the same peers, event by event, as one
    event at a time, with type-only summaries (answered per type) and with filters."""
    rng = random.Random(seed)
    graph = random_geometric(40, 4, rng)
    pool = [HOT, InterestFilter(type="cold"), InterestFilter.make(type="hot", eq=[("site", "a")])]
    pool.append(InterestFilter.make(eq=[("site", "b")]))
    for kinds in (pool[:2], pool):
        view = MeshInterests()
        for rid, peers in graph.items():
            view.put(rid, peers, Interest.of(rng.sample(kinds, rng.randint(0, 2))))
        batch = [ev(rng.choice(["hot", "cold", "warm", None]), site=rng.choice("ab"))]
        batch += [ev(rng.choice(["hot", "cold", "warm"]), site="b") for _ in range(30)]
        for source in rng.sample(sorted(graph), 5):
            for me in sorted(graph):
                came = view.tree(source).parent.get(me)  # the tree's way, and off it
                for came_from in {came, rng.choice(graph[me])}:
                    one_by_one = [view.forward(me, source, came_from, e) for e in batch]
                    many = view.forward_many(me, source, came_from, batch)
                    if None in one_by_one:  # off the tree: flood, for the whole batch
                        assert many is None and set(one_by_one) == {None}
                    else:
                        assert many == [tuple(peers or ()) for peers in one_by_one]
    # A publisher of ever new types: the answers kept per type stay bounded, and right.
    view = MeshInterests()
    for rid, peers in {"a": ["b"], "b": ["a"]}.items():
        view.put(rid, peers, Interest.of([HOT]) if rid == "b" else Interest.NOTHING)
    batch = [ev(f"t{i}") for i in range(MAX_TYPE_ANSWERS + 10)] + [ev("hot")]
    assert view.forward_many("a", "a", None, batch) == [()] * (len(batch) - 1) + [("b",)]
    assert len(view.tree("a").plans["a"][1]) <= MAX_TYPE_ANSWERS
    table = InterestTable("a", settle=1.0)
    table.local(["b"], Interest.NOTHING, now=0.0)
    table.receive("b", 1, ["a"], Interest.of([HOT]), now=0.0)
    batch = [ev("hot"), ev("cold"), ev("hot")]
    assert table.targets_many("a", None, batch, now=0.5) is None  # settling: flood them all
    assert table.targets_many("a", None, batch, now=1.0) == [("b",), (), ("b",)]


def test_the_table_floods_while_settling_and_for_stale_or_unknown_senders():
    table = InterestTable("a", settle=1.0)
    table.local(["b"], Interest.NOTHING, now=0.0)
    assert table.targets("a", None, ev("hot"), now=0.1) is None  # our own view is new
    table.receive("b", 2, ["a"], Interest.of([HOT]), now=0.2)
    assert table.targets("a", None, ev("hot"), now=1.1) is None  # b's summary is new
    assert table.targets("a", None, ev("hot"), now=1.2) == ["b"]
    assert not table.receive("b", 1, ["a"], Interest.NOTHING, now=1.3)  # stale: ignored
    assert table.targets("a", None, ev("hot"), now=1.4) == ["b"]
    assert table.receive("b", 3, ["a"], Interest.NOTHING, now=2.0)
    assert table.targets("a", None, ev("hot"), now=2.5) is None
    assert table.targets("a", None, ev("hot"), now=3.0) == []
    assert table.expire(now=10.0, max_age=5.0) == ["b"]
    assert table.targets("a", None, ev("hot"), now=10.5) is None  # b forgotten: settling
    assert table.targets("a", None, ev("hot"), now=11.0) is None  # and b still our peer


def test_a_full_view_leaves_it_incomplete_so_the_router_floods():
    table = InterestTable("a", settle=0.0, max_routers=2)
    table.local(["b", "c"], Interest.NOTHING, now=0.0)
    table.receive("b", 1, ["a"], Interest.NOTHING, now=0.0)
    table.receive("c", 1, ["a"], Interest.NOTHING, now=0.0)  # no room: unknown
    assert table.targets("a", None, ev("hot"), now=1.0) is None


def test_a_view_holds_more_than_1024_routers_and_bounds_its_trees(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import aa.mesh.interest as interest

    n = 3000  # past the old cap of 1,024 (a router's view then flooded)
    chain = {f"r{i:04d}": [f"r{j:04d}" for j in (i - 1, i + 1) if 0 <= j < n] for i in range(n)}
    view = MeshInterests()
    for rid, peers in chain.items():
        view.put(rid, peers, Interest.of([HOT]) if rid == "r2999" else Interest.NOTHING)
    assert view.complete and len(view) == n
    assert view.forward("r0001", "r0000", "r0000", ev("hot")) == ["r0002"]
    assert view.forward("r0001", "r0000", "r0000", ev("cold")) == []
    # The trees kept are bounded by their entries, whatever the mesh's size.
    monkeypatch.setattr(interest, "MAX_TREE_ENTRIES", 2 * n)
    for source in list(chain)[:10]:
        assert view.tree(source) is not None
    assert view.trees == 2


def test_max_routers_is_a_checked_mesh_setting() -> None:
    from aa.mesh import MAX_ROUTERS, UsageError
    from aa.router import MeshConfig, Router, RouterConfig

    assert MeshConfig().max_routers == MAX_ROUTERS == 10_000
    for bad in (1, 10**7, "many", True):
        with pytest.raises(UsageError, match="max_routers must be an int"):
            MeshConfig(max_routers=bad)  # type: ignore[arg-type]
    router = Router(RouterConfig(port=0, mesh=MeshConfig(max_routers=50_000)))
    assert router.mesh.interests.table.view.max_routers == 50_000


def test_a_dead_routers_stale_summary_does_not_hold_the_mesh_in_flood():
    graph = ring(6)
    view = MeshInterests()
    for rid, peers in graph.items():
        view.put(rid, peers, Interest.of([HOT]) if rid == "r3" else Interest.NOTHING)
    # r2 dies: r1 and r3 say so; r2's last summary (claiming both) is still held.
    graph = {r: [p for p in peers if p != "r2"] for r, peers in graph.items() if r != "r2"}
    view.put("r1", graph["r1"], Interest.NOTHING)
    view.put("r3", graph["r3"], Interest.of([HOT]))
    assert view.complete
    reached, messages = walk(view, graph, "r1", ev("hot"))
    assert reached == {"r1", "r6", "r5", "r4", "r3"} and messages == 4


@pytest.mark.parametrize("seed", range(4))
def test_a_batch_checked_per_type_gets_what_each_filter_says(seed):
    """A relay answers a batch with checks made once per event type for each link: for
    every shape of filter a subscription, store or cache gives (names present, equalities,
    flags, typed or not, several per link), each event gets the peers `forward` names for
    it alone, with values that are missing, unhashable, or equal across types (1, 1.0, True)."""
    rng = random.Random(seed)
    graph = random_geometric(30, 4, rng)
    pool = [
        HOT,
        InterestFilter.make(has=["x"]),
        InterestFilter.make(has=["x", "y"]),
        InterestFilter.make(eq=[("x", 1)]),
        InterestFilter.make(eq=[("x", "a")]),
        InterestFilter.make(type="hot", eq=[("y", True)]),
        InterestFilter.make(type="cold", has=["y"]),
        InterestFilter.make(eq=[("x", 1.0), ("y", "b")]),
        InterestFilter.make(eq=[("x", "a")], has=["z"]),
        InterestFilter(flags=PERSISTED),
        InterestFilter(type="warm", flags=CACHED),
        InterestFilter.make(has=["z"], flags=CACHED),
    ]
    view = MeshInterests()
    for rid, peers in graph.items():
        view.put(rid, peers, Interest.of(rng.sample(pool, rng.randint(0, 3))))
    anything = [None, 1, 1.0, True, 0, "a", "b", [1], {"k": 1}, False]
    batch = []
    for _ in range(80):
        values = {k: rng.choice(anything) for k in "xyz" if rng.random() < 0.6}
        meta = rng.choice([{}, {"persist": True}, {"mesh_cache": False}, {"persist": 1}])
        values = {k: v for k, v in values.items() if v is not None}
        batch.append(ev(rng.choice(["hot", "cold", "warm", None]), meta=meta, **values))
    for source in rng.sample(sorted(graph), 6):
        tree = view.tree(source)
        for me in sorted(graph):
            came = tree.parent.get(me)
            if me not in tree.parent:
                continue
            one_by_one = [tuple(view.forward(me, source, came, e)) for e in batch]
            assert view.forward_many(me, source, came, batch) == one_by_one
            assert view.forward_many(me, source, came, batch[::-1]) == one_by_one[::-1]


def test_events_that_pick_ever_new_sets_of_links_cost_no_memory():
    """A hub whose neighbours each want events carrying their own name: events choose any
    set of its links by the names they carry. Each still gets what `forward` says, and the
    answers kept to share stay bounded."""
    names = [f"n{i}" for i in range(12)]
    view = MeshInterests()
    view.put("hub", names, Interest.NOTHING)
    for n in names:
        view.put(n, ["hub"], Interest.of([InterestFilter.make(has=[n])]))
    rng = random.Random(5)
    batch = [ev(**{n: 1 for n in names if rng.random() < 0.5}) for _ in range(600)]
    assert len({tuple(view.forward("hub", "hub", None, e)) for e in batch}) > MAX_SHARED_ANSWERS
    answers = view.forward_many("hub", "hub", None, batch)
    assert answers == [tuple(view.forward("hub", "hub", None, e)) for e in batch]
    check = view.tree("hub").plans["hub"][1][None]
    kept = [c.cell_contents for c in check.__closure__ if isinstance(c.cell_contents, dict)]
    assert kept and all(len(k) <= MAX_SHARED_ANSWERS for k in kept)
