"""Sharing interests across the mesh, and asking them where an event goes: one
`InterestService` per router (`router.mesh.interests`); the rules are `aa.mesh.interest`.

Every router floods a control of topic ``interest``: ``{"v": version, "peers": [router ids
of its links], "interest": Interest.to_wire(), "interval": seconds}``, plus ``"listen"``: what
its subscriptions alone want (with the names their patterns declare they need), when that
differs from the interest (a store or caches) — quenching answers from it
(`aa.router.quench.summaries`), so that a publisher learns of a subscriber with its summary —

- **at once** when one of its links comes up or goes away: the safety argument of
  `aa.mesh.interest` needs the news to travel ahead of the events relayed after it;
- as soon as the loop is free after its subscriptions or its client caches' patterns change
  (a new subscription's events start to come once the summary has crossed the mesh), then
  at most once per `SUMMARY_DEBOUNCE`, so a burst of subscribes costs one or two floods;
  within `SUMMARY_REFRESH` of any other change (the store);
- every `MeshConfig.info_interval` with the same version (stretched in a mesh of more than
  `REPEAT_ROUTERS`: `MeshConfig.repeat_interval`), so a summary nobody repeats is forgotten
  three of its sender's intervals later. A repeat is a *digest* (topic ``interest-digest``:
  ``{"v": version, "interval": seconds}``, a few bytes): "my summary is still this
  version". A router that holds that version takes it as the summary heard again; one that
  holds an older one (it missed the flood) or none asks the peer the digest came from for
  the whole (topic ``interest-ask``: ``{"o": [router ids]}``, answered as a hand-over) and
  meanwhile takes the sender to want anything, so it forwards too much rather than too
  little. A router joining the mesh gets every summary whole in the hand-over on link up.

When a link comes up, each end also hands the other every summary it holds, its own and
the others' (topic ``interest-sync``, for that peer only: ``{"s": [[origin, version, peers,
interest, interval, age, listen], ...]}``, in chunks of `SYNC_CHUNK`), and each router hands on to
its other peers the summaries that are news to it (`InterestTable.sync`). So after a
partition heals, each side learns the other's summaries in a round trip and one flood
rather than at their periodic repeats, and a router whose old summaries of the far side may
be stale floods until they are confirmed (`aa.mesh.interest`, "confirmed").

A digest is input too. One that claims a version its router never sent makes the others
send that router everything (it costs the liar and the links toward it; it makes nobody
flood), and the claim holds until a whole summary of at least that version comes, so a
peer that answers the ask with an older version does not narrow it again. Asks are
bounded both ways: a router asks for one router's summary at most once per `ASK_INTERVAL`,
and answers at most `ASK_ANSWERS` asks per peer per `ASK_INTERVAL` (a peer that asks in a
loop gets no more); what it remembers of asks and claims is bounded by the view's room.

Routers always share their summaries, whatever their own `MeshConfig.routing`: a flooding
router still lets its interest-routing neighbours complete their view. The version orders
one router's summaries (a stale one is ignored); a summary over the caps of
`aa.mesh.interest` counts as "anything" for its router (a warning, `interest_refused`). On a
TLS mesh controls only travel over mutual-TLS peer links, so only the mesh CA's routers'
summaries count; a router that lies about its interest gets more events, or makes others
flood — a peer that forges another router's summary could starve that router, as it could
already drop its events.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, cast

from aa.mesh import MAX_PEERS, Control, Event, Interest, InterestTable, InvalidValue

from .config import ROUTER_INFO_INTERVAL, summary_interval

if TYPE_CHECKING:
    from .meshservice import MeshService

__all__ = [
    "InterestService",
    "INTEREST_TOPIC",
    "SYNC_TOPIC",
    "DIGEST_TOPIC",
    "ASK_TOPIC",
    "ASK_INTERVAL",
    "ASK_ANSWERS",
    "SYNC_CHUNK",
    "SUMMARY_DEBOUNCE",
    "SUMMARY_REFRESH",
]

log = logging.getLogger("aa.router.links")

#: Control topic of the interest summaries.
INTEREST_TOPIC: Final = "interest"
#: Control topic of the summaries handed over to one peer (a link came up, or news).
SYNC_TOPIC: Final = "interest-sync"
#: Control topic of the repeats of an unchanged summary: its version only.
DIGEST_TOPIC: Final = "interest-digest"
#: Control topic of a request for whole summaries, sent to one peer (it answers on
#: `SYNC_TOPIC`).
ASK_TOPIC: Final = "interest-ask"
#: Least seconds between two asks for one router's summary, and the window of
#: `ASK_ANSWERS`: a digest is repeated every few seconds at most, so one ask per second
#: keeps up with any honest router and bounds what a digest sent in a loop can make us send.
ASK_INTERVAL: Final = 1.0
#: Asks answered per peer per `ASK_INTERVAL`, in asks (each of at most `SYNC_CHUNK` router
#: ids): an honest peer asks after missing a flood, a handful at a time.
ASK_ANSWERS: Final = 4
#: Summaries in one hand-over message, in summaries: a summary is a few KB at most (the caps
#: of `aa.mesh.interest`), so a message stays far below the frame cap; a view of 1,024
#: routers takes 32 messages.
SYNC_CHUNK: Final = 32
#: Least seconds between two summaries made for changes of subscriptions: the first change
#: after a quiet spell is flooded at once, the rest of a burst waits and goes as one flood.
#: Interest changes need no settling (`aa.mesh.interest`).
SUMMARY_DEBOUNCE: Final = 0.02
#: A summary made for changes waits at least this many times as long as the last one took to
#: make, so summaries take at most about a fifth of the loop: one is made from every
#: subscription and client cache, and thousands of caches registering one after another
#: (each a change) would otherwise have the loop make little else.
SUMMARY_COST_FACTOR: Final = 4.0
#: Seconds between two checks of the summary without a hook (client caches, the store).
SUMMARY_REFRESH: Final = 1.0
#: Seconds between two warnings about refused summaries.
_WARN_INTERVAL: Final = 60.0


class InterestService:
    """This router's summary, everyone else's, and the forwarding rule over them."""

    def __init__(self, mesh: MeshService) -> None:
        self.mesh = mesh
        self.config = mesh.config
        self.table = InterestTable(mesh.id, max_routers=self.config.max_routers)
        #: Makes this router's interest (set by the router; `aa.router.links.wants`).
        self.collect: Callable[[], Interest] = lambda: Interest.ANYTHING
        #: Makes what this router's subscriptions alone may want (quenching answers from it;
        #: `Wants.listening`), read right after `collect`; None: the same as the interest.
        self.collect_listening: Callable[[], Interest] | None = None
        self.interest = Interest.ANYTHING
        self.listening = Interest.ANYTHING
        #: Each other router's subscriptions' interest, for the routers of the view.
        self.listeners: dict[str, Interest] = {}
        #: Called with a router's id when what its subscriptions want may have changed: a
        #: summary of it was taken, or it was forgotten (`listening_of` is then None).
        self.on_listening: list[Callable[[str], None]] = []
        self.version = 0
        self.counters = mesh.counters
        self._intervals: dict[str, float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._made_at = -SUMMARY_DEBOUNCE  # loop time of the last summary made for a change
        self._cost = 0.0  # seconds the last summary made for a change took to make
        self._next_refresh = 0.0
        self._next_send = 0.0
        self._last_warning = -_WARN_INTERVAL
        self._flooded = -1  # the version last flooded whole
        #: Router id → the version its digest claimed that we lack: until a summary of at
        #: least that version comes, it is taken to want anything.
        self._claimed: dict[str, int] = {}
        self._asked: dict[str, float] = {}  # router id → when we last asked for its summary
        self._answered: dict[str, tuple[float, int]] = {}  # peer → (window start, answers)
        mesh.relay.on_control(INTEREST_TOPIC, self.on_summary)
        mesh.relay.on_control(SYNC_TOPIC, self.on_sync)
        mesh.relay.on_control(DIGEST_TOPIC, self.on_digest)
        mesh.relay.on_control(ASK_TOPIC, self.on_ask)

    @property
    def routes(self) -> bool:
        """Whether this router forwards by interest (else it floods)."""
        return self.config.routing == "interest"

    # -- this router's summary --------------------------------------------------------------

    def changed(self) -> None:
        """Subscriptions changed: make and flood the summary once the loop is free, or
        `SUMMARY_DEBOUNCE` after the last one made so."""
        if self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            gap = max(SUMMARY_DEBOUNCE, SUMMARY_COST_FACTOR * self._cost)
            wait = max(0.0, self._made_at + gap - loop.time())
            self._timer = loop.call_later(wait, self._debounced)

    def caches_changed(self) -> None:
        """A client cache's pattern came or went (here, or flooded from another router):
        flood rather than route until the mesh has the new summaries, and make ours soon.
        Every router holds every cache, so each hears of it in one flood and floods its
        events meanwhile."""
        self.table.unsettle(time.monotonic())
        self.changed()

    def _debounced(self) -> None:
        self._timer = None
        self._made_at = asyncio.get_running_loop().time()
        start = time.monotonic()
        self.refresh(start)
        self._cost = time.monotonic() - start

    def links_changed(self) -> None:
        """A link came up or went: flood the summary now, ahead of any further event."""
        self.refresh(time.monotonic())

    def refresh(self, now: float) -> None:
        """Make the summary; flood it if it changed."""
        self._next_refresh = now + SUMMARY_REFRESH
        try:
            interest = self.collect()
        except Exception:  # a bug here must not stop the flood: want anything
            log.exception("making this router's interest failed")
            interest = Interest.ANYTHING
        # An unchanged summary keeps the object made before: a new one, made just after
        # thousands of client caches went, would live on among their freed blocks and keep
        # Python's allocator from giving those arenas back.
        if interest == self.interest:
            interest = self.interest
        self.interest = interest
        listening = interest
        if self.collect_listening is not None:
            try:
                listening = self.collect_listening()
            except Exception:  # as above: want anything rather than fall silent
                log.exception("making this router's subscriptions' interest failed")
                listening = Interest.ANYTHING
        listened = listening != self.listening
        if not listened:
            listening = self.listening
        self.listening = listening
        if self.table.local(self.mesh.peer_ids(), interest, now) or listened:
            self.version += 1
            self.send(now)

    def repeat_interval(self) -> float:
        """Seconds between repeats of our unchanged summary (`MeshConfig.repeat_interval`
        over the routers we hold summaries of, and us)."""
        return self.config.repeat_interval(len(self.table.heard) + 1)

    def send(self, now: float) -> None:
        every = self.repeat_interval()
        self._next_send = now + every
        if self.mesh.links and self._flooded == self.version:
            self.mesh.flood_control(DIGEST_TOPIC, {"v": self.version, "interval": every})
            self.counters["interest_digests_sent"] += 1
        elif self.mesh.links:
            self._flooded = self.version
            self.mesh.flood_control(
                INTEREST_TOPIC,
                {
                    "v": self.version,
                    "peers": sorted(self.mesh.peer_ids()),
                    "interest": self.interest.to_wire(),
                    "interval": every,
                    **self._listening_wire(),
                },
            )
            self.counters["interest_sent"] += 1

    def _listening_wire(self) -> dict[str, Any]:
        """The ``listen`` key of our summary: only when it differs from the interest."""
        if self.listening == self.interest:
            return {}
        return {"listen": self.listening.to_wire()}

    def tick(self, now: float) -> float:
        """Housekeeping (the mesh's loop calls it): refresh, repeat, forget the silent.
        Returns when it wants to be called again."""
        if now >= self._next_refresh:
            self.refresh(now)
        if now >= self._next_send:
            self.send(now)
        for rid, (_, at) in list(self.table.heard.items()):
            if now - at > 3 * self._intervals.get(rid, ROUTER_INFO_INTERVAL):
                self.table.forget(rid, now)
                self._intervals.pop(rid, None)
                self._claimed.pop(rid, None)
                self._listened(rid, None)
        return min(self._next_refresh, self._next_send)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- the others' ------------------------------------------------------------------------

    def on_summary(self, control: Control) -> None:
        """A router's summary arrived (once per flood)."""
        origin = control.path[0] if control.path else None
        body = control.body
        version, peers = body.get("v"), body.get("peers")
        if (
            origin is None
            or type(version) is not int
            or type(peers) is not list
            or len(peers) > MAX_PEERS
            or not all(type(p) is str for p in peers)
        ):
            self.counters["interest_malformed"] += 1
            return
        now = time.monotonic()
        interest = self._interest(origin, body.get("interest"), now)
        self._intervals[origin] = summary_interval(body.get("interval"))
        claimed = self._short_of_claim(origin, version)
        if claimed:
            interest = Interest.ANYTHING
        if self.table.receive(origin, version, cast(list[str], peers), interest, now):  # checked
            listening = self._listening(origin, body, interest, now)
            self._listened(origin, Interest.ANYTHING if claimed else listening)

    def _short_of_claim(self, origin: str, version: int) -> bool:
        """Whether *version* is older than one *origin*'s digest claimed (we take it to want
        anything meanwhile); a summary of the claimed version or newer ends the claim."""
        claimed = self._claimed.get(origin)
        if claimed is None:
            return False
        if version >= claimed:
            del self._claimed[origin]
            return False
        return True

    def on_digest(self, control: Control) -> None:
        """A router's repeat of an unchanged summary (once per flood): its version only."""
        origin = control.path[0] if control.path else None
        version = control.body.get("v")
        if origin is None or type(version) is not int:
            self.counters["interest_malformed"] += 1
            return
        if origin == self.mesh.id:
            return
        now = time.monotonic()
        if self.table.confirm(origin, version, now):
            self._intervals[origin] = summary_interval(control.body.get("interval"))
            self.counters["interest_digests_taken"] += 1
            return
        held = self.table.heard.get(origin)
        if held is not None and version < held[0]:
            return  # stale: a newer summary came already
        self.counters["interest_digests_lacking"] += 1
        if origin in self.table.view:
            if self._claimed.get(origin, -1) < version:
                self._claimed[origin] = version
            if self.table.widen(origin):
                self._listened(origin, Interest.ANYTHING)
        self._ask(control.path[-1], origin, now)

    def _ask(self, peer_id: str, origin: str, now: float) -> None:
        """Ask *peer_id* for *origin*'s whole summary, unless we did lately."""
        if now - self._asked.get(origin, -ASK_INTERVAL) < ASK_INTERVAL:
            return
        if len(self._asked) >= self.config.max_routers:
            self._asked = {o: t for o, t in self._asked.items() if now - t < ASK_INTERVAL}
            if len(self._asked) >= self.config.max_routers:
                return  # asked for that many in the last second: flood toward them instead
        self._asked[origin] = now
        if self.mesh.send_control(peer_id, ASK_TOPIC, {"o": [origin]}):
            self.counters["interest_asks_sent"] += 1

    def on_ask(self, control: Control) -> None:
        """A peer asks for whole summaries: answer with those we hold, as a hand-over, at
        most `ASK_ANSWERS` times per `ASK_INTERVAL`."""
        if control.ttl != 0 or len(control.path) != 1 or control.to != self.mesh.id:
            self.counters["interest_malformed"] += 1
            return  # only from the router at the other end of a link, for us
        sender = control.path[0]
        wanted = control.body.get("o")
        if (
            type(wanted) is not list
            or len(wanted) > SYNC_CHUNK
            or not all(type(rid) is str for rid in wanted)
        ):
            self.counters["interest_malformed"] += 1
            return
        now = time.monotonic()
        start, answers = self._answered.get(sender, (now, 0))
        if now - start >= ASK_INTERVAL:
            start, answers = now, 0
        if answers >= ASK_ANSWERS:
            self.counters["interest_asks_refused"] += 1
            return
        if sender not in self._answered and len(self._answered) >= MAX_PEERS:
            peers = set(self.mesh.peer_ids())
            self._answered = {p: w for p, w in self._answered.items() if p in peers}
        self._answered[sender] = (start, answers + 1)
        entries: list[list[Any]] = []
        for rid in dict.fromkeys(cast(list[str], wanted)):  # checked
            if rid == self.mesh.id:
                entries.append(self._own_entry())
            elif (held := self.table.heard.get(rid)) is not None:
                entries.append(self._entry(rid, held[0], held[1], now))
        self._send_sync(sender, entries)

    def _listening(
        self, origin: str, body: Mapping[str, Any], interest: Interest, now: float
    ) -> Interest:
        """What *origin*'s subscriptions want, by its summary *body*: its ``listen`` key, else
        its whole interest (a router that sends none says its interest is its listening)."""
        wire = body.get("listen")
        return interest if wire is None else self._interest(origin, wire, now)

    def listening_of(self, router_id: str) -> Interest | None:
        """What *router_id*'s subscriptions may want, by its last summary; None when it is
        not in the view (unknown, forgotten, or no room for it)."""
        if router_id not in self.table.view:
            return None
        return self.listeners.get(router_id)

    def _listened(self, origin: str, listening: Interest | None) -> None:
        if listening is None or origin not in self.table.view:
            if self.listeners.pop(origin, None) is None:
                return
        elif self.listeners.get(origin) == listening:
            return
        else:
            self.listeners[origin] = listening
        for hook in self.on_listening:
            try:
                hook(origin)
            except Exception:  # a listener's bug must not stop the summaries
                log.exception("a listener of %s's interest failed", origin)

    def hand_over(self, peer_id: str) -> None:
        """A link with *peer_id* came up (after our new summary was flooded): send it every
        summary we hold, so that its side of the mesh need not wait for their repeats."""
        now = time.monotonic()
        entries: list[list[Any]] = [self._own_entry()]
        for rid, (version, at) in self.table.heard.items():
            entries.append(self._entry(rid, version, at, now))
        self._send_sync(peer_id, entries)

    def _own_entry(self) -> list[Any]:
        return [
            self.mesh.id,
            self.version,
            sorted(self.mesh.peer_ids()),
            self.interest.to_wire(),
            self.repeat_interval(),
            0.0,
            self.listening.to_wire(),
        ]

    def _entry(self, rid: str, version: int, at: float, now: float) -> list[Any]:
        view = self.table.view
        interest = view.interest(rid) or Interest.ANYTHING
        return [
            rid,
            version,
            list(view.peers(rid)),
            interest.to_wire(),
            self._intervals.get(rid, ROUTER_INFO_INTERVAL),
            round(max(0.0, now - at), 3),
            (self.listeners.get(rid) or interest).to_wire(),
        ]

    def _send_sync(self, peer_id: str, entries: list[list[Any]]) -> None:
        for start in range(0, len(entries), SYNC_CHUNK):
            if not self.mesh.send_control(
                peer_id, SYNC_TOPIC, {"s": entries[start : start + SYNC_CHUNK]}
            ):
                return
            self.counters["interest_sync_sent"] += 1

    def on_sync(self, control: Control) -> None:
        """Summaries a peer handed over: take each (stale ones are ignored), and hand on
        those that were news here to the other peers."""
        if control.ttl != 0 or len(control.path) != 1 or control.to != self.mesh.id:
            self.counters["interest_malformed"] += 1
            return  # only from the router at the other end of a link, for us
        sender = control.path[0]
        entries = control.body.get("s")
        if type(entries) is not list or len(entries) > SYNC_CHUNK:
            self.counters["interest_malformed"] += 1
            return
        now = time.monotonic()
        news: list[list[Any]] = []
        for entry in entries:
            taken = self._take_entry(entry, now)
            if taken is not None:
                news.append(taken)
        if news:
            for peer_id in self.mesh.peer_ids():
                if peer_id != sender:
                    self._send_sync(peer_id, news)

    def _take_entry(self, entry: object, now: float) -> list[Any] | None:
        """One handed-over summary: the entry to hand on if it was news, else None."""
        if type(entry) is not list or len(entry) not in (6, 7):
            self.counters["interest_malformed"] += 1
            return None
        origin, version, peers, wire, interval, age = entry[:6]
        listen = entry[6] if len(entry) == 7 else None
        if (
            type(origin) is not str
            or type(version) is not int
            or type(peers) is not list
            or len(peers) > MAX_PEERS
            or not all(type(p) is str for p in peers)
            or isinstance(age, bool)
            or not isinstance(age, (int, float))
            or not age >= 0.0
        ):
            self.counters["interest_malformed"] += 1
            return None
        if origin == self.mesh.id:
            return None
        every = summary_interval(interval)
        if age > 3 * every:
            return None  # we would forget it at once
        interest = self._interest(origin, wire, now)
        listening = self._listening(origin, {"listen": listen}, interest, now)
        # What we hand on is what the summary says; what we take may be wider (a claim).
        claimed = self._short_of_claim(origin, version)
        taken = Interest.ANYTHING if claimed else interest
        if not self.table.sync(origin, version, cast(list[str], peers), taken, now, age):
            return None
        self._intervals[origin] = every
        self.counters["interest_synced"] += 1
        self._listened(origin, Interest.ANYTHING if claimed else listening)
        return [origin, version, peers, interest.to_wire(), every, age, listening.to_wire()]

    def _interest(self, origin: str, wire: object, now: float) -> Interest:
        """A peer's wire interest, or "anything" (and a warning) past the caps."""
        try:
            return Interest.from_wire_shared(wire)
        except InvalidValue as exc:
            self.counters["interest_refused"] += 1
            if now - self._last_warning >= _WARN_INTERVAL:
                self._last_warning = now
                log.warning(
                    "router %s sent an interest over the caps (%s): sending it everything",
                    origin,
                    exc,
                )
            return Interest.ANYTHING  # flood toward it: never too little

    # -- the rule ---------------------------------------------------------------------------

    def targets(
        self, source: str, came_from: str | None, event: Event, now: float
    ) -> list[str] | None:
        """Peers to send *event* to, or None: flood (flooding routers always flood)."""
        if self.config.routing != "interest":
            return None
        return self.table.targets(source, came_from, event, now)

    def targets_many(
        self, source: str, came_from: str | None, events: Sequence[Event], now: float
    ) -> list[tuple[str, ...]] | None:
        """`targets` for each of *events*, all from *source* and received from *came_from*
        (events that go the same way share one tuple), or None: flood them all."""
        if self.config.routing != "interest":
            return None
        return self.table.targets_many(source, came_from, events, now)

    def info(self) -> dict[str, Any]:
        """What `aa mesh` may show of interest routing here."""
        now = time.monotonic()
        return {
            "routing": self.config.routing,
            "settled": self.table.settled(now),
            "awaited": len(self.table.waiting) if not self.table.caught_up(now) else 0,
            "complete": self.table.view.complete,
            "routers": len(self.table.view),
            "interest": self.interest.to_wire(),
        }
