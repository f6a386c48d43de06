"""A partition heals, simulated with the routers' own interest code: one real
`aa.router.links.InterestService` per router (its `InterestTable`, its summaries, its
hand-over on link up and its hand-on of news), over a fake mesh that carries its controls
and the events on FIFO links (fixed delay each) in one heap on the simulation's clock.

What is not the routers' code: the fake mesh (`SimMesh`: peer ids, a control flood that
forwards a control once to every link but the one it came on, one-peer controls), the clock
(`interests.time` is the simulation's), and the trees of the forwarding: a router that
would route by its view asks a view of the same content shared by every router whose view
is equal (a thousand copies of a thousand trees would not fit), checked equal to its own
the first time. The simulation's own bookkeeping is compact, so that thousands of routers'
views fit: a flood carries only the copies that come first (the others are counted),
one-peer controls (the hand-overs) travel packed, as on the wire, a view's content is its
routers' versions packed (`array`), and equal interests are one object (the routers decode
them with `Interest.from_wire_shared`, as real routers do).
Periodic repeats and forgetting (`InterestService.tick`) are not run: the partition is
healed well within three intervals, or long past (each side then starts without the other).
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from array import array
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import msgpack

from aa.mesh import Control, Event, Interest, MeshInterests
from aa.router.links import interests as interests_module
from aa.router.links.config import MeshConfig
from aa.router.links.interests import INTEREST_TOPIC, InterestService

#: Deliveries between two calls of `HandoverSim.progress`.
PROGRESS_EVERY = 1 << 20


class SimClock:
    """Stands in for the `time` module of `aa.router.links.interests`."""

    now = 0.0

    def monotonic(self) -> float:
        return self.now


class _Relay:
    def __init__(self) -> None:
        self.callbacks: dict[str, Callable[[Control], None]] = {}

    def on_control(self, topic: str, callback: Callable[[Control], None]) -> None:
        self.callbacks[topic] = callback


class SimMesh:
    """What `InterestService` asks of its `MeshService`, for one simulated router."""

    def __init__(self, sim: HandoverSim, rid: str, n: int) -> None:
        self.sim = sim
        self.id = rid
        self.config = MeshConfig(max_routers=max(n, 2))
        self.counters: Counter[str] = Counter()
        self.relay = _Relay()
        self.links: set[str] = set()

    def peer_ids(self) -> list[str]:
        return sorted(self.links)

    def flood_control(self, topic: str, body: Mapping[str, Any]) -> str:
        cid = f"{self.id}/{next(self.sim.ids)}"
        msg = Control(id=cid, ttl=32, path=(self.id,), topic=topic, body=dict(body))
        if topic == INTEREST_TOPIC:
            self.sim.said(self.id, body)
        for w in self.links:
            self.sim.flood(self.id, w, msg)
        return cid

    def send_control(self, peer_id: str, topic: str, body: Mapping[str, Any]) -> bool:
        if peer_id not in self.links:
            return False
        # Packed as on the wire: a link end hands over every summary it holds at once, and
        # thousands of hand-overs in flight as objects would not fit.
        self.sim.send(self.id, peer_id, ("one", (topic, msgpack.packb(body))))
        return True


class HandoverSim:
    """Routers with real `InterestService`s; `run` delivers controls and events in order."""

    def __init__(self, delay: Mapping[tuple[str, str], float], routers: list[str]) -> None:
        self.clock = SimClock()
        self._time = interests_module.time
        interests_module.time = self.clock  # type: ignore[assignment]
        self.delay = delay
        self.ids = itertools.count()
        self.heap: list[tuple[float, int, str, str, Any]] = []
        self.seq = itertools.count()
        self.mesh = {r: SimMesh(self, r, len(routers)) for r in routers}
        self.svc = {r: InterestService(m) for r, m in self.mesh.items()}  # type: ignore[arg-type]
        self.wants: dict[str, Interest] = {}
        for r, s in self.svc.items():
            s.collect = lambda r=r: self.wants[r]  # type: ignore[misc]
        #: (origin, version) → (peers, interest): what each summary said.
        self.content: dict[tuple[str, int], tuple[tuple[str, ...], Interest]] = {}
        self.index = {r: k for k, r in enumerate(routers)}
        self.routers = routers
        #: Flooded control id → per router (by `index`): when its first copy arrives there,
        #: -1 once it did (`flood`).
        self.due: dict[str, array[float]] = {}
        self.first_news: dict[str, float] = {}  # first control after `watch_from`
        self.watch_from = math.inf
        self.controls = 0
        #: Seconds of CPU each router spent in its interest code after `watch_from` (taking
        #: controls, making its summary and hand-overs): what a real router pays per heal,
        #: short of encoding and sending the messages.
        self.cpu: dict[str, float] = {}
        #: A view's content (`_content_key`) → the view of that content the routers share.
        self._shared: dict[bytes, MeshInterests] = {}
        #: Router → (its view's `changes` when keyed, the key): its view's content.
        self._key: dict[str, tuple[int, bytes]] = {}
        self._keys: dict[bytes, bytes] = {}  # one object per key, however many hold it
        self._checked: set[tuple[str, bytes]] = set()
        #: Called with the simulation every `PROGRESS_EVERY` deliveries (a long run's log).
        self.progress: Callable[[HandoverSim], None] | None = None

    def close(self) -> None:
        """Give `aa.router.links.interests` its real clock back."""
        interests_module.time = self._time

    def __enter__(self) -> HandoverSim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the fake mesh's wires --------------------------------------------------------------

    def said(self, origin: str, body: Mapping[str, Any]) -> None:
        svc = self.svc[origin]
        self.content[origin, body["v"]] = (tuple(sorted(body["peers"])), svc.interest)

    def flood(self, a: str, b: str, msg: Control) -> None:
        """Send a copy of the flooded *msg* from *a* to *b*. It is counted, but only a copy that
        would come to *b* first is carried: any later one arrives where the control was
        already taken, and a router drops such a copy unread."""
        due = self.due.get(msg.id)
        if due is None:
            due = self.due[msg.id] = array("d", [math.inf]) * len(self.routers)
        at = self.clock.now + self.delay[a, b]
        k = self.index[b]
        if due[k] <= at:  # taken already (-1), or an earlier copy is on its way
            self.controls += 1
            return
        due[k] = at
        self.send(a, b, ("flood", msg))

    def send(self, a: str, b: str, item: Any) -> None:
        if item[0] != "event":
            self.controls += 1
        heapq.heappush(self.heap, (self.clock.now + self.delay[a, b], next(self.seq), b, a, item))

    def link_up(self, a: str, b: str) -> None:
        """As `MeshService` does when a link comes up: the new summary, then the hand-over."""
        for me, peer in ((a, b), (b, a)):
            self.mesh[me].links.add(peer)
            self._note(me)
            start = time.process_time()
            self.svc[me].links_changed()
            self.svc[me].hand_over(peer)
            self.cpu[me] = self.cpu.get(me, 0.0) + time.process_time() - start

    def _note(self, me: str) -> None:
        if self.clock.now >= self.watch_from:
            self.first_news.setdefault(me, self.clock.now)

    def _control(self, me: str, came: str, kind: str, payload: Any) -> None:
        if kind == "one":
            topic, packed = payload
            cid = f"{came}/{next(self.ids)}"
            body = msgpack.unpackb(packed)
            self._note(me)
            self._take(me, Control(id=cid, ttl=0, path=(came,), topic=topic, body=body, to=me))
            return
        msg: Control = payload
        due = self.due[msg.id]
        k = self.index[me]
        if due[k] < 0:
            return  # superseded on its way: an earlier copy came first
        due[k] = -1.0
        self._note(me)
        self._take(me, msg)
        for w in self.mesh[me].links:
            if w != came and w not in msg.path:
                self.flood(me, w, msg)

    def _take(self, me: str, msg: Control) -> None:
        start = time.process_time()
        self.mesh[me].relay.callbacks[msg.topic](msg)
        self.cpu[me] = self.cpu.get(me, 0.0) + time.process_time() - start

    # -- events -----------------------------------------------------------------------------

    def targets(self, me: str, source: str, came: str | None, ev: Event) -> list[str] | None:
        """The router's own rule (`InterestService.targets`), on a shared view of equal
        content once it would ask its view."""
        svc = self.svc[me]
        table = svc.table
        now = self.clock.now
        if not (table.settled(now) and table.caught_up(now)):
            return svc.targets(source, came, ev, now)  # None, without asking the view
        shared = self._shared_for(me)
        own = table.view
        table.view = shared
        try:
            return svc.targets(source, came, ev, now)
        finally:
            table.view = own

    def _shared_for(self, me: str) -> MeshInterests:
        """The shared view of the content of *me*'s own, checked equal to it (claimed links
        and interests: the graph follows) the first time."""
        key = self._content_key(me)
        shared = self._shared_view(key)
        if (me, key) not in self._checked:
            own = self.svc[me].table.view
            assert len(own) == len(shared), me
            assert all(own.peers(o) == shared.peers(o) for o in shared.routers()), me
            assert all(own.interest(o) == shared.interest(o) for o in shared.routers()), me
            self._checked.add((me, key))
        return shared

    def _content_key(self, me: str) -> bytes:
        """What *me*'s view holds, as the version of each router's summary in it (0: none),
        packed; worked out again only once the view changed."""
        table = self.svc[me].table
        held = self._key.get(me)
        if held is not None and held[0] == table.view.changes:
            return held[1]
        heard = table.heard
        versions = array("q", [heard[o][0] if o in heard else 0 for o in self.routers])
        versions[self.index[me]] = self.svc[me].version
        key = versions.tobytes()
        key = self._keys.setdefault(key, key)  # one object per content
        self._key[me] = (table.view.changes, key)
        return key

    def _shared_view(self, key: bytes) -> MeshInterests:
        """The view of the content *key* says, shared by every router whose view holds it."""
        shared = self._shared.get(key)
        if shared is None:
            shared = self._shared[key] = MeshInterests(max_routers=len(self.mesh))
            for o, v in zip(self.routers, array("q", key), strict=True):
                if v:
                    peers, interest = self.content[o, v]
                    shared.put(o, peers, interest)
        return shared

    def run(
        self, published: list[tuple[float, str, Event]], until: float
    ) -> tuple[dict[int, set[str]], int]:
        """Deliver everything in order of the clock, the events of *published* too: which
        routers got each event, and the event messages sent."""
        for k, (t, source, _ev) in enumerate(published):
            heapq.heappush(self.heap, (t, next(self.seq), source, "", ("event", None, (), k)))
        got: dict[int, set[str]] = {}
        messages = 0
        heap = self.heap
        pops = 0
        while heap and heap[0][0] <= until:
            pops += 1
            if self.progress is not None and pops % PROGRESS_EVERY == 0:
                self.progress(self)
            t, _, me, came, item = heapq.heappop(heap)
            self.clock.now = t
            if item[0] != "event":
                self._control(me, came, item[0], item[1])
                continue
            _, frm, path, ek = item
            seen = got.setdefault(ek, set())
            if me in seen:
                continue
            seen.add(me)
            path = (*path, me)
            ev = published[ek][2]
            links = self.mesh[me].links
            chosen = self.targets(me, path[0], frm, ev)
            if chosen is None:
                chosen = [p for p in links if p not in path]
            for w in chosen:
                if w in links:
                    messages += 1
                    self.send(me, w, ("event", me, path, ek))
        return got, messages

    def sure_at(self, me: str) -> float:
        """When *me* routes by its view again, if nothing changes any more."""
        table = self.svc[me].table
        if not self._shared_for(me).complete:  # as its own view
            return math.inf  # it floods for good
        at = table._settled_at  # the bench reads the table's clock: no public getter
        if table.waiting:
            at = max(at, table._wait_until)
        return at
