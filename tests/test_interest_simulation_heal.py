"""A partition heals in the simulation that runs every router's own interest code
(`tests/bench/sim_handover.py`: one real `InterestService` per router over a fake mesh, on
the simulation's clock): no event published after the heal is lost, and every router routes
by its view again about `SETTLE_TIME` later; without the hand-over on link up, a short
partition leaves routers routing on a stale view once the catch-up wait runs out."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "bench"))

import bench_interest

from aa.mesh.interest import CATCH_UP_TIME, SETTLE_TIME
from aa.router.links import interests as interests_module
from aa.router.links.interests import InterestService


@pytest.mark.parametrize("short", [False, True], ids=["long", "short"])
def test_after_a_heal_nothing_is_lost_and_routers_route_again_within_the_settle_time(short):
    h = bench_interest.heal("geometric", 40, 0.10, 4, 0.005, short)
    assert h["cut"] > 0 and h["synced"] > 0
    assert h["lost"] == 0
    assert h["waited_out"] == 0  # every summary came back: none waited out the catch-up
    assert SETTLE_TIME <= h["converged"] < SETTLE_TIME + 0.2
    assert interests_module.time is time  # the simulation's clock is gone again


def test_without_the_hand_over_a_short_partition_loses_events(monkeypatch):
    monkeypatch.setattr(InterestService, "hand_over", lambda self, peer_id: None)
    h = bench_interest.heal("geometric", 40, 0.10, 4, 0.005, True)
    assert h["waited_out"] > 0
    assert h["converged"] >= CATCH_UP_TIME
    assert h["lost"] > 0  # the new type of the far side, routed on the stale view (seed 4)
