"""A router's reach in its view, kept up to date one summary at a time
(`aa.mesh.interest_reach`), is always what a whole walk of the view says, and an interest
table built on it awaits the same routers as one that walks the whole view per summary."""

import random

import pytest

from aa.mesh import Event, Interest, InterestTable, MeshInterests
from aa.mesh.interest_reach import Reach


def _claims(rng: random.Random, rid: str, names: list[str]) -> list[str]:
    """Random links for *rid*: often a few, sometimes none, sometimes many (a hub)."""
    others = [n for n in names if n != rid]
    return rng.sample(others, min(len(others), rng.choice([0, 1, 2, 2, 3, 3, 4, 8])))


@pytest.mark.parametrize("seed", range(40))
def test_the_reach_kept_per_summary_equals_a_whole_walk(seed):
    rng = random.Random(seed)
    names = [f"r{i}" for i in range(rng.choice([4, 8, 16, 30]))]
    view = MeshInterests()
    reach = Reach("r0", view)
    before = set()
    for step in range(300):
        rid = rng.choice(names)
        links = view.peers(rid)
        roll = rng.random()
        if roll < 0.1:
            view.drop(rid)
        elif roll < 0.4 and rid in view:  # one link more or fewer: what a heal or cut does
            mine = set(view.peers(rid))
            w = rng.choice([n for n in names if n != rid])
            mine.symmetric_difference_update({w})
            view.put(rid, mine, Interest.NOTHING)
        else:
            view.put(rid, _claims(rng, rid, names), Interest.NOTHING)
        gained, lost = reach.changed(rid, links)
        whole = view.reachable("r0")
        assert reach.routers == whole, (seed, step)
        assert (gained, lost) == (whole - before, before - whole), (seed, step)
        before = whole


def test_a_table_awaits_the_routers_that_come_back_after_a_cut():
    """A line a-b-c-d: cut between b and c, c changes meanwhile, the link comes back: a
    awaits c and d until it hears from them again, whatever order the news comes in."""
    table = InterestTable("a")
    nothing = Interest.NOTHING
    table.local(["b"], nothing, now=0.0)
    table.receive("b", 1, ["a", "c"], nothing, now=0.0)
    table.receive("c", 1, ["b", "d"], nothing, now=0.0)
    table.receive("d", 1, ["c"], nothing, now=0.0)
    assert table.waiting == set() and table.unconfirmed == set()
    table.receive("b", 2, ["a"], nothing, now=1.0)  # b lost its link to c
    assert table.unconfirmed == {"c", "d"} and table.waiting == set()
    table.receive("b", 3, ["a", "c"], nothing, now=5.0)  # and has it again
    assert table.waiting == {"c", "d"}
    assert table.targets("a", None, _event(), now=6.5) is None  # settled, still awaiting
    table.sync("c", 2, ["b", "d"], nothing, now=5.1, age=0.0)
    table.sync("d", 1, ["c"], nothing, now=5.1, age=0.0)
    assert table.waiting == set() and table.unconfirmed == set()
    assert table.targets("a", None, _event(), now=6.5) == []


def _event():
    return Event(values={}, type="x")
