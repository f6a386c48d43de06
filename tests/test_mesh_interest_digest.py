"""Repeats of an unchanged summary are digests (its version only), with real routers on
loopback, a line r0 - r1 - r2, summaries repeated every 0.2 s (`FAST`):

- a repeat costs a few bytes on the wire instead of the whole summary;
- a router that lacks the version a digest names asks the peer it came from, and gets the
  summary whole without its router flooding it again;
- a digest that claims a version never sent costs only its router: the others send it
  everything, nobody floods, and they ask about it at most once per `ASK_INTERVAL`;
- a peer that asks in a loop is answered `ASK_ANSWERS` times per `ASK_INTERVAL`.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
from support import FAST, line, mesh, routing_by_interest, wait_for

from aa.mesh import Interest, InterestFilter
from aa.mesh.protocol import Control
from aa.router.links import interests as interests_module
from aa.router.links.interests import (
    ASK_ANSWERS,
    ASK_TOPIC,
    DIGEST_TOPIC,
    INTEREST_TOPIC,
)
from aa.router.links.peerlink import PeerLink

INTEREST = dataclasses.replace(FAST, routing="interest")
#: A router's subscriptions: a few (a summary about as small as a digest's envelope), and
#: many (a summary of about a KB, within the caps).
FEW = ['type == "hot" and site == "north"', 'type == "cold" and depth > 3', 'type == "warm"']
MANY = [f'type == "t{i}" and site == "s{i % 7}"' for i in range(40)]


@pytest.fixture
def frames(monkeypatch):
    """(topic, origin, frame bytes) of every interest control a link writes."""
    sent: list[tuple[str, str, int]] = []
    send = PeerLink.send

    def counting(self, msg):
        if isinstance(msg, Control) and msg.topic in (INTEREST_TOPIC, DIGEST_TOPIC):
            sent.append((msg.topic, msg.path[0], len(self.codec.send(msg))))
        send(self, msg)

    monkeypatch.setattr(PeerLink, "send", counting)
    return sent


@pytest.mark.parametrize("patterns", [FEW, MANY], ids=["few", "many"])
async def test_a_repeat_costs_a_few_bytes_instead_of_the_whole_summary(frames, patterns):
    async with mesh(3, line(3), config=INTEREST) as routers:
        r0, r1, r2 = routers
        for pattern in patterns:
            r0.subscribe(pattern, lambda event: None)
        await wait_for(lambda: routing_by_interest(routers), 10)
        frames.clear()
        digests = r0.mesh.counters["interest_digests_sent"]
        await wait_for(lambda: r0.mesh.counters["interest_digests_sent"] >= digests + 5, 10)
        mine = [(topic, size) for topic, origin, size in frames if origin == r0.id]
        whole = [size for topic, size in mine if topic == INTEREST_TOPIC]
        repeats = [size for topic, size in mine if topic == DIGEST_TOPIC]
        assert repeats and not whole  # nothing changed: every repeat is a digest
        summary = r0.mesh.interests
        full = Control(
            id="x" * 20,
            ttl=32,
            path=(r0.id,),
            topic=INTEREST_TOPIC,
            body={
                "v": summary.version,
                "peers": sorted(r0.mesh.peer_ids()),
                "interest": summary.interest.to_wire(),
                "interval": summary.repeat_interval(),
                **summary._listening_wire(),
            },
        )
        before = len(r0.mesh.links[r1.id].codec.send(full))  # what each repeat was
        print(f"\nrepeat bytes, {len(patterns)} patterns: whole {before}, digest {repeats}")
        # The envelope (id, ttl, path, topic) is most of a digest: what it saves is the summary.
        assert max(repeats) < before
        if patterns is MANY:
            assert max(repeats) * 2 < before, (repeats, before)
        # Repeats still keep the summary alive and confirmed everywhere.
        assert r2.mesh.interests.table.view.interest(r0.id) == summary.interest


async def test_a_router_that_lacks_the_version_asks_and_gets_the_whole():
    async with mesh(3, line(3), config=INTEREST) as routers:
        r0, r1, r2 = routers
        r0.subscribe('type == "hot"', lambda event: None)
        hot = Interest.of([InterestFilter(type="hot")])
        await wait_for(lambda: routing_by_interest(routers), 10)
        whole = r0.mesh.counters["interest_sent"]
        r2.mesh.interests.table.forget(r0.id, time.monotonic())  # as if it missed the flood
        await wait_for(lambda: r2.mesh.interests.table.view.interest(r0.id) == hot, 5)
        assert r2.mesh.counters["interest_asks_sent"] >= 1
        assert r0.mesh.counters["interest_sent"] == whole  # r0 flooded nothing whole again
        await wait_for(lambda: routing_by_interest(routers), 10)


async def test_a_digest_of_a_version_never_sent_costs_only_its_router():
    async with mesh(3, line(3), config=INTEREST) as routers:
        r0, r1, r2 = routers
        r0.subscribe('type == "hot"', lambda event: None)
        await wait_for(lambda: routing_by_interest(routers), 10)
        asks = r2.mesh.counters["interest_asks_sent"]
        lie = r0.mesh.interests.version + 100
        for _ in range(50):  # a liar's digests, in a loop
            r0.mesh.flood_control(DIGEST_TOPIC, {"v": lie, "interval": 0.2})
        table = r2.mesh.interests.table
        await wait_for(lambda: table.view.interest(r0.id) == Interest.ANYTHING, 5)
        assert routing_by_interest(routers)  # nobody floods for it
        # Its real summary and digests (an older version) do not narrow it again.
        version = r0.mesh.interests.version
        r0.subscribe('type == "cold"', lambda event: None)
        await wait_for(lambda: r0.mesh.interests.version > version, 5)
        newer = r0.mesh.interests.version
        await wait_for(lambda: table.heard[r0.id][0] >= newer, 5)
        assert table.view.interest(r0.id) == Interest.ANYTHING
        assert r2.mesh.interests.listening_of(r0.id) == Interest.ANYTHING
        # One ask per second at most, however many digests came.
        assert r2.mesh.counters["interest_asks_sent"] - asks <= 2
        got = r0.mesh.counters["events_in"]
        assert r2.publish({"n": 1}, type="never-wanted") is not None
        await wait_for(lambda: r0.mesh.counters["events_in"] > got, 5)  # what the lie costs


async def test_a_peer_that_asks_in_a_loop_is_answered_a_few_times(monkeypatch):
    monkeypatch.setattr(interests_module, "ASK_INTERVAL", 30.0)  # one window for the test
    async with mesh(2, line(2), config=INTEREST) as routers:
        r0, r1 = routers
        await wait_for(lambda: routing_by_interest(routers), 10)
        synced = r0.mesh.counters["interest_sync_sent"]
        for _ in range(100):
            r1.mesh.send_control(r0.id, ASK_TOPIC, {"o": [r0.id, r1.id]})
        await wait_for(lambda: r0.mesh.counters["interest_asks_refused"] >= 100 - ASK_ANSWERS, 5)
        assert r0.mesh.counters["interest_sync_sent"] - synced == ASK_ANSWERS
