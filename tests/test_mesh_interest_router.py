"""What a router says it wants (`aa.router.links.Wants`), from its real pattern engine, store
and caches; the routing switch; a peer's summary over the caps."""

from __future__ import annotations

import dataclasses
import time

import pytest
from support import FAST, mesh, wait_for

from aa.mesh import (
    CACHE_INTEREST,
    STORE_INTEREST,
    Control,
    Interest,
    InterestFilter,
    UsageError,
)
from aa.mesh.interest import MAX_TYPES
from aa.router import MeshConfig, Router, RouterConfig
from aa.router.links import INTEREST_TOPIC, wants
from aa.router.links.config import REPEAT_ROUTERS
from aa.router.patterns.predicates import plans


def test_the_plan_names_held_by_wants_are_the_pattern_rooms() -> None:
    assert (wants.VALUE, wants.TYPE, wants.EQ) == (plans.VALUE, plans.TYPE, plans.EQ)


def interest_of(router: Router, *patterns: str) -> Interest:
    for p in patterns:
        router.subscribe(p)
    return router.mesh.interests.collect()


@pytest.mark.parametrize(
    ("pattern", "filters"),
    [
        ('type == "hot"', [InterestFilter(type="hot")]),
        ('type in ("a", "b")', [InterestFilter(type="a"), InterestFilter(type="b")]),
        ('site == "x" and t > 3', [InterestFilter(eq=(("site", "x"),))]),
        ("t > 3", [InterestFilter(has=("t",))]),
        ("x == limit", None),  # params: see below
        ("# needs: depth\nif depth > 3:\n    forward()", [InterestFilter(has=("depth",))]),
        ("if x:\n    forward()", [InterestFilter()]),
        ("True", [InterestFilter()]),
        ('meta["k"] == 1', [InterestFilter()]),
    ],
)
async def test_patterns_say_what_they_may_want(pattern: str, filters) -> None:  # type: ignore[no-untyped-def]
    router = Router(RouterConfig(port=0, mesh=MeshConfig(cache_interest=False)))
    if filters is None:
        router.subscribe(pattern, params={"limit": 7})
        got = router.mesh.interests.collect()
        assert got.may_match(_ev(x=7)) and not got.may_match(_ev(x=8))
        return
    fmt = "script" if "forward" in pattern else "expr"
    router.subscribe(pattern, format=fmt)
    got = router.mesh.interests.collect()
    assert got == Interest.of(filters)


def _ev(type=None, **values):  # type: ignore[no-untyped-def]
    from aa.mesh import Event

    return Event(values=values, type=type)


async def test_stores_and_counted_mesh_caches_are_interests(tmp_path) -> None:  # type: ignore[no-untyped-def]
    plain = Router(RouterConfig(port=0))
    assert plain.mesh.interests.collect() == Interest.NOTHING  # mesh cache does not count
    cached = Router(RouterConfig(port=0, mesh=MeshConfig(cache_interest=True)))
    assert cached.mesh.interests.collect() == Interest.of([CACHE_INTEREST])
    stored = Router(RouterConfig(port=0, data_dir=tmp_path))
    await stored.start()
    try:
        assert stored.mesh.interests.collect() == Interest.of([STORE_INTEREST])
    finally:
        await stored.aclose()


def test_routing_is_flood_or_interest() -> None:
    assert MeshConfig().routing == "interest"
    with pytest.raises(UsageError, match="routing"):
        MeshConfig(routing="gossip")
    with pytest.raises(UsageError, match="cache_interest"):
        MeshConfig(cache_interest=1)  # type: ignore[arg-type]


async def test_a_summary_over_the_caps_gets_its_router_everything() -> None:
    config = dataclasses.replace(FAST, routing="interest")
    async with mesh(2, [(0, 1)], config=config) as (a, b):
        table = a.mesh.interests.table
        await wait_for(lambda: b.id in table.view, 5)
        body = {
            "v": 10**6,
            "peers": [a.id],
            "interest": {"types": [f"t{i}" for i in range(MAX_TYPES + 1)]},
            "interval": 1.0,
        }
        a.mesh.interests.on_summary(
            Control(id="forged-1", ttl=1, path=(b.id,), topic=INTEREST_TOPIC, body=body)
        )
        assert a.mesh.counters["interest_refused"] == 1
        assert table.view.interest(b.id) is Interest.ANYTHING


async def test_a_big_mesh_stretches_the_repeats_of_unchanged_summaries() -> None:
    """Each summary crosses every link: in a mesh of more than `REPEAT_ROUTERS` a router
    repeats its own less often, and says so in it, so that receivers wait as long before
    they forget it."""
    config = dataclasses.replace(FAST, routing="interest")
    async with mesh(2, [(0, 1)], config=config) as (a, b):
        every = config.info_interval
        assert a.mesh.interests.repeat_interval() == every
        await wait_for(lambda: b.mesh.view.summary_of(a.id).get("interval") == every, 5)
        far = 2 * REPEAT_ROUTERS  # routers a has heard of, not linked to it
        now = time.monotonic()
        for i in range(far):
            a.mesh.interests.table.receive(f"far-{i}", 1, [], Interest.NOTHING, now)
        stretched = every * (far + 2) / REPEAT_ROUTERS  # and b, and a itself
        assert a.mesh.interests.repeat_interval() == pytest.approx(stretched)
        a.mesh.interests.send(now)  # as a repeat would
        await wait_for(
            lambda: b.mesh.view.summary_of(a.id).get("interval") == pytest.approx(stretched), 10
        )
        await wait_for(lambda: b.mesh.interests._intervals.get(a.id) == pytest.approx(stretched), 5)


def test_aa_router_routing_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from aa.tools.cli import build_parser
    from aa.tools.router_cmd import config_from_args

    def config(*argv: str) -> RouterConfig:
        return config_from_args(build_parser().parse_args(["router", *argv]), environ={})

    assert config().mesh.routing == "interest"
    assert config("--routing", "flood").mesh.routing == "flood"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["router", "--routing", "gossip"])
    err = capsys.readouterr().err
    assert "invalid choice: 'gossip'" in err and "Traceback" not in err
