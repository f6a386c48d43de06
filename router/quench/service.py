"""Quenching across the mesh (Å §4.4): `router.quench`, one `QuenchService` per router.

A publisher registers an event *prototype* (`aa.mesh.protocol.quench_messages.Quench`); the router
holding its session — the registration's *owner* — checks its own subscriptions against it
and tells the publisher of each that starts or stops matching, by id. Other routers answer
one of two ways:

- **Under interest routing** (`use_summaries`, the default): from the interest summaries the
  owner already holds (`aa.router.quench.summaries`). Nothing of quenching floods; a router
  whose subscriptions may want the prototype is one line, subscription id ``*``, told when
  its summary arrives and gone when a summary says otherwise or the router is forgotten.
- **Under flood routing** (Å's way, below): the owner floods the registration, every router
  checks its subscriptions against it and reports which match, by id.

What floods under flood routing (control topic ``quench``, body ``{"op", ...}``)
---------------------------------------------------------------------------------
==============  =========================================================================
op              meaning
==============  =========================================================================
``register``    ``regs``: registrations (`Registration.body`) of the sending router's
                publishers. Sent when one is made, again every `QuenchConfig.keepalive`
                (the keep-alive), and at once when a router this one has not heard of
                appears in the mesh (its first router-info summary), so a router that
                joins later is told without waiting for the next keep-alive.
``remove``      ``regs``: ids; the publisher unregistered or its session ended. Only the
                router that owns a registration can remove it.
``report``      ``router``, ``items``: [[reg, [subscription ids]]] — the full set of the
                reporting router's subscriptions matching each registration, sent with
                `to` = the publisher's client id whenever the set changes, and in answer to
                each keep-alive while it is not empty. Only the owner acts on it.
==============  =========================================================================

Matching: a subscription matches a registration when its pattern lets the prototype through
(`PatternEngine.matches_prototype`, scripts dry-run on a copy of their state), or when the
pattern declares the value names it needs and the prototype carries all of them
(`aa.mesh.protocol.quench_messages.declared_needs`: the answer to §4.4's narrow-pattern weakness). A
registration made with ``mentioned_only`` ignores catch-all patterns that mention none of
the prototype's names. Subscriptions are checked against every registration when they are
added or updated, and leave when they are removed, stopped, or their session ends.

Lifetimes: a registration lives as long as its publisher's session; other routers drop it
when its keep-alives stop for `QuenchConfig.timeout` (its owner went away). The owner drops a
router's reported interest when that router has not confirmed it for the same timeout (it
left, crashed, or the mesh split) and tells the publisher those subscriptions are gone. A
publisher that fails over registers again on its new router, under the same id.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

from aa.mesh import MAX_PEERS, Control, Event, InvalidValue, PatternSpec, UsageError
from aa.mesh.protocol import (
    MAX_NOTICE_CHANGES,
    Error,
    Quench,
    Quenched,
    QuenchNotice,
    Unquench,
    declared_needs,
)

from ..links import ROUTER_INFO_TOPIC, summary_interval
from ..patterns import PatternEngine
from ..seams import Controls
from .config import MAX_QUENCH_TIMEOUT, QuenchConfig
from .registrations import Change, QuenchTable, Registration, parse_registrations, parse_report
from .summaries import SUMMARY_SUB, Listening, summary_answers

if TYPE_CHECKING:
    from ..seams import ClientPort as ClientSession

__all__ = ["QuenchService", "QUENCH_TOPIC"]

log = logging.getLogger("aa.router.quench")

#: Control topic of quench floods.
QUENCH_TOPIC: Final = "quench"
#: Registrations per ``register`` control: keeps each flood a few tens of KiB.
REGS_PER_FLOOD: Final = 100


class QuenchService:
    """Quench registrations and notifications of one router; see the module docstring."""

    def __init__(
        self,
        router_id: str,
        config: QuenchConfig,
        *,
        engine: PatternEngine,
        controls: Controls,
    ) -> None:
        self.router_id = router_id
        #: Read when used: a test may replace it before `start()`.
        self.config: QuenchConfig = config
        self._engine = engine
        self._controls = controls
        self.table = QuenchTable(router_id)
        self.counters: Counter[str] = Counter()
        self._sessions: dict[str, ClientSession] = {}  # owned reg id → publisher's session
        #: Publisher's session → the ids of its owned registrations (`_sessions` inverted),
        #: so that a registration counts its publisher's and a closing session finds its own
        #: without a walk over every registration.
        self._owned: dict[ClientSession, set[str]] = {}
        self._dry_runs = 0  # dry runs asked whose answers have yet to come
        #: Owned registration id → (prototype, mentioned_only, its matches) when it was
        #: unquenched: a publisher that registers the same prototype again, in a loop, gets
        #: them back without a scan of the subscriptions. Emptied whenever a subscription
        #: comes, changes or goes, or a worker's dry run answers (so it holds no key of a
        #: subscription that went); at most `QuenchTable.max_registrations` entries.
        self._scans: dict[str, tuple[Event, bool, frozenset[Hashable]]] = {}
        self._sids: dict[Hashable, str] = {}  # subscriber key → subscription id in reports
        self._sid_taken: set[str] = set()
        self._sid_seq = itertools.count(1)
        self._needs: dict[tuple[str, str, str], frozenset[str]] = {}
        self._routers_seen: dict[str, float] = {}  # router id → monotonic time to forget it
        self._dirty: dict[str, Registration] = {}  # registrations whose match set changed
        self._outbox: dict[str, list[list[Any]]] = {}  # client id → report items to flood
        self._scheduled = False
        self._reflood = False
        self._task: asyncio.Task[None] | None = None
        #: Under interest routing, the other routers' summaries: remote answers come from
        #: them and nothing of quenching floods (`use_summaries`); None: flood as in Å.
        self._summaries: Listening | None = None
        #: Bumped whenever another router's summary says something new (`_listening_changed`):
        #: an answer made at the same version still holds.
        self._listening_version = 0
        #: Owned registration id → (listening version, prototype, the routers whose summaries
        #: wanted it) of its last answer from the summaries: a publisher that registers the same
        #: prototype again, in a loop or after an unquench, is answered from it without a
        #: summary check per router. At most `QuenchTable.max_registrations` entries.
        self._answers: dict[str, tuple[int, Event, frozenset[str]]] = {}
        #: Called (no arguments) whenever a subscription comes, changes or goes: the one
        #: place the router's subscriptions are watched, for quenching and interest routing.
        self.on_change: list[Callable[[], None]] = []
        controls.on_control(QUENCH_TOPIC, self._on_control)
        controls.on_control(ROUTER_INFO_TOPIC, self._on_router_info)

    def use_summaries(self, summaries: Listening) -> None:
        """Answer for other routers from their interest summaries (`aa.router.quench.summaries`)
        instead of flooding registrations: a publisher hears of a router's subscriptions
        when that router's summary arrives, and of their going when the next one does, or
        when the router is forgotten. Call before any registration is made."""
        self._summaries = summaries
        summaries.on_listening.append(self._listening_changed)

    def _listening_changed(self, router_id: str) -> None:
        if router_id == self.router_id:
            return
        self._listening_version += 1
        now = time.monotonic()
        for reg in self.table.owned():
            self._answer_remote(reg, router_id, now)

    def _answer_remote(self, reg: Registration, router_id: str, now: float) -> None:
        assert self._summaries is not None
        listening = self._summaries.listening_of(router_id)
        wants = summary_answers(listening, reg.prototype)
        subs = frozenset((SUMMARY_SUB,)) if wants else frozenset()
        self._notify(reg.reg, self.table.report(reg.reg, router_id, subs, now))

    # -- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"aa-quench-{self.router_id}"
        )

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.config.keepalive)
            try:
                self.tick(time.monotonic())
            except Exception:  # a bug here must not end keep-alives for good
                log.exception("quench housekeeping failed")

    def tick(self, now: float) -> None:
        """Keep-alive floods of owned registrations; sweep lapsed registrations and interest.
        With summaries nothing floods, and a router's answer lasts as long as its summary."""
        if self._summaries is None:
            self._flood_owned()
        self.table.expire(now)
        if self._summaries is None:
            for reg_id, changes in self.table.expire_interest(now, self.config.timeout).items():
                self._notify(reg_id, changes)
        for rid, until in list(self._routers_seen.items()):
            if until < now:
                del self._routers_seen[rid]

    # -- publishers (requests from sessions) ------------------------------------------------

    def handle_request(self, session: ClientSession, msg: Any) -> None:
        if type(msg) is Quench:
            self._register(session, msg)
        elif type(msg) is Unquench:
            reg_id = _reg_id(session, msg.reg)
            if self._sessions.get(reg_id) is session:
                self._remember_scan(reg_id)
                self._drop_owned([reg_id])

    def _register(self, session: ClientSession, msg: Quench) -> None:
        client = session.client_id or "?"
        reg_id = _reg_id(session, msg.reg)
        held = len(self._owned.get(session, ()))
        if reg_id not in self._sessions and held >= self.config.max_per_client:
            session.send(
                Error(
                    code="limit",
                    message=f"at most {self.config.max_per_client} quench registrations per client",
                    ref=msg.reg,
                )
            )
            return
        old = self.table.registrations.get(reg_id)
        prototype = Event(values=dict(msg.values), type=msg.type)
        # The same registration again (a publisher re-sending it): its answers are kept
        # current as subscriptions and summaries change, so they are not worked out anew.
        again = (
            self._sessions.get(reg_id) is not None
            and old is not None
            and old.expires is None
            and old.prototype == prototype
            and old.mentioned_only == msg.mentioned_only
            and self._summaries is not None
        )
        if again:
            self._own(reg_id, session)
            self.counters["registered_again"] += 1
            session.send(Quenched(reg=msg.reg))
            known = self.table.interested(reg_id)
            if known:
                self._send_notice(session, msg.reg, known)
            return
        reg = Registration(
            reg=reg_id,
            client=client,
            number=msg.reg,
            owner=self.router_id,
            prototype=prototype,
            mentioned_only=msg.mentioned_only,
            timeout=self.config.timeout,
            expires=None,
        )
        try:
            reg = self.table.add_owned(reg)
        except InvalidValue as exc:
            session.send(Error(code="limit", message=str(exc), ref=msg.reg))
            return
        self._own(reg_id, session)
        self.counters["registered"] += 1
        session.send(Quenched(reg=msg.reg))
        known = self.table.interested(reg_id)
        if known:  # the publisher came back to us: tell it what still holds
            self._send_notice(session, msg.reg, known)
        reg.matches = self._scanned(reg)
        self._dirty[reg_id] = reg
        self._schedule()
        if self._summaries is None:
            self._flood_registrations([reg])
            return
        self._answer_all_remote(reg)

    def _answer_all_remote(self, reg: Registration) -> None:
        """Answer *reg* for every other router from its summary, or from the last answer for
        the same prototype while no summary has changed since."""
        assert self._summaries is not None
        now = time.monotonic()
        version = self._listening_version
        last = self._answers.get(reg.reg)
        if last is not None and last[0] == version and last[1] == reg.prototype:
            for router_id in last[2]:
                self._notify(
                    reg.reg, self.table.report(reg.reg, router_id, frozenset((SUMMARY_SUB,)), now)
                )
            return
        for router_id in list(self._summaries.listeners):
            if router_id != self.router_id:
                self._answer_remote(reg, router_id, now)
        if len(self._answers) >= self.table.max_registrations:
            self._answers.clear()
        wanting = self.table.interest.get(reg.reg, {})
        self._answers[reg.reg] = (
            version,
            reg.prototype,
            frozenset(r for r in wanting if r != self.router_id),
        )

    def session_closed(
        self, session: ClientSession, subscriptions: Iterable[Hashable] = ()
    ) -> None:
        """A client's connection closed: its *subscriptions* and its registrations go."""
        for sub in list(subscriptions):
            self.unsubscribed(sub)
        owned = list(self._owned.get(session, ()))
        for reg_id in owned:
            self._answers.pop(reg_id, None)
        self._drop_owned(owned)

    def _drop_owned(self, reg_ids: list[str]) -> None:
        gone = []
        for reg_id in reg_ids:
            self._disown(reg_id)
            reg = self.table.registrations.get(reg_id)
            if reg is not None and reg.expires is None:  # still ours (not failed over elsewhere)
                self.table.remove(reg_id)
                self._dirty.pop(reg_id, None)
                gone.append(reg_id)
        if self._summaries is not None:
            return  # never flooded
        for i in range(0, len(gone), REGS_PER_FLOOD):
            self._controls.flood_control(
                QUENCH_TOPIC, {"op": "remove", "regs": gone[i : i + REGS_PER_FLOOD]}
            )

    # -- subscriptions (the router's hooks) -------------------------------------------------

    def subscribed(self, key: Hashable) -> None:
        """A subscription was added: check it against every registration."""
        self.updated(key)

    def updated(self, key: Hashable) -> None:
        """A subscription's params changed: it may match other prototypes now."""
        self._scans.clear()
        later = []
        for reg in list(self.table.registrations.values()):
            now_in = self._matches(reg, key)
            if now_in is None:
                later.append(reg)
            else:
                self._set(reg, key, now_in)
        if later:
            self._dry_run(key, later)
        self._schedule()
        self._changed()

    def _changed(self) -> None:
        for hook in self.on_change:
            hook()

    def _set(self, reg: Registration, key: Hashable, now_in: bool) -> None:
        if now_in != (key in reg.matches):
            (reg.matches.add if now_in else reg.matches.discard)(key)
            self._dirty[reg.reg] = reg

    def _dry_run(self, key: Hashable, regs: list[Registration]) -> None:
        """Ask *key*'s worker whether its pattern lets each of *regs*' prototypes through
        (`WorkerPool.probe`); the answer, when it comes, updates the match sets. Answers
        come in the order asked, so the last check of a key wins; a registration or a
        subscription gone meanwhile is left alone."""
        pool = self._engine.workers
        if pool is None or key not in pool:
            return
        try:
            future = pool.probe(key, [r.prototype for r in regs], [r.mentioned_only for r in regs])
        except UsageError:
            return
        self._dry_runs += 1

        def answered(f: asyncio.Future[list[bool]]) -> None:
            self._dry_runs -= 1
            self._scans.clear()  # a scan kept before this answer may lack it
            if f.cancelled() or key not in pool:
                return
            for reg, ok in zip(regs, f.result()):
                if self.table.registrations.get(reg.reg) is reg:
                    self._set(reg, key, ok)
            self._schedule()

        future.add_done_callback(answered)

    def unsubscribed(self, key: Hashable) -> None:
        """A subscription was removed, stopped, or its session ended."""
        self._scans.clear()
        for reg in self.table.registrations.values():
            if key in reg.matches:
                reg.matches.discard(key)
                self._dirty[reg.reg] = reg
        sid = self._sids.pop(key, None)
        if sid is not None:
            self._sid_taken.discard(sid)
        self._schedule()
        self._changed()

    def _own(self, reg_id: str, session: ClientSession) -> None:
        """*session* holds owned registration *reg_id* (maybe taken over from another)."""
        if self._sessions.get(reg_id) is not session:
            self._disown(reg_id)
            self._sessions[reg_id] = session
            self._owned.setdefault(session, set()).add(reg_id)

    def _disown(self, reg_id: str) -> None:
        session = self._sessions.pop(reg_id, None)
        if session is not None:
            ids = self._owned[session]
            ids.discard(reg_id)
            if not ids:
                del self._owned[session]

    def _remember_scan(self, reg_id: str) -> None:
        """Keep what owned registration *reg_id* matches as it goes (unless a dry run's
        answer is still to come): `_scanned` gives it back while no subscription changed."""
        self._scans.pop(reg_id, None)
        reg = self.table.registrations.get(reg_id)
        if reg is None or reg.expires is not None or self._dry_runs:
            return
        if len(self._scans) >= self.table.max_registrations:
            self._scans.clear()
        self._scans[reg_id] = (reg.prototype, reg.mentioned_only, frozenset(reg.matches))

    def _scanned(self, reg: Registration) -> set[Hashable]:
        """`_scan`, or the matches *reg*'s id had when it was unquenched, if its prototype is
        the same and no subscription changed since."""
        last = self._scans.pop(reg.reg, None)
        if last is not None and last[0] == reg.prototype and last[1] == reg.mentioned_only:
            self.counters["scans_saved"] += 1
            return set(last[2])
        return self._scan(reg)

    def _scan(self, reg: Registration) -> set[Hashable]:
        """The local subscriptions matching *reg*; those whose pattern runs in a worker are
        dry-run there and join later (`_dry_run`). A dry run that breaks the sandbox stops a
        pattern (and all its subscribers) mid-scan: only those still subscribed count."""
        engine = self._engine
        found = set()
        for key in engine.keys():  # noqa: SIM118 (a PatternEngine, not a mapping)
            now_in = self._matches(reg, key)
            if now_in is None:
                self._dry_run(key, [reg])
            elif now_in:
                found.add(key)
        return found & set(engine.keys())

    def _matches(self, reg: Registration, key: Hashable) -> bool | None:
        """Does *key*'s pattern match *reg*? None: its pattern is code in a worker, and
        does not declare needs the prototype meets: to be dry-run there (`_dry_run`)."""
        engine = self._engine
        try:
            needs = self._declared(engine.pattern_of(key))
            if needs and needs <= reg.prototype.values.keys():
                return True
            pool = engine.workers
            if pool is not None and key in pool:
                return None  # never run here
            return engine.matches_prototype(key, reg.prototype, needs_names=reg.mentioned_only)
        except UsageError:
            return False  # gone meanwhile (a dry run may stop a pattern that breaks the rules)
        except Exception:  # never let quenching break a subscribe or an unsubscribe
            log.exception("checking a subscription against quench registration %s failed", reg.reg)
            return False

    def _declared(self, spec: PatternSpec) -> frozenset[str]:
        k = (spec.kernel, spec.format, spec.source)
        needs = self._needs.get(k)
        if needs is None:
            if len(self._needs) > 4 * max(len(self._engine), 1024):
                self._needs.clear()
            needs = self._needs[k] = declared_needs(spec)
        return needs

    def _sid(self, key: Hashable) -> str:
        sid = self._sids.get(key)
        if sid is None:
            client = getattr(key, "client_id", None) or "local"
            number = getattr(key, "sub_id", None)
            sid = f"{client}#{number}" if number is not None else f"{client}#{next(self._sid_seq)}"
            if sid in self._sid_taken:  # the same client id on two sessions at once
                sid = f"{sid}~{next(self._sid_seq)}"
            self._sids[key] = sid
            self._sid_taken.add(sid)
        return sid

    # -- reporting --------------------------------------------------------------------------

    def _schedule(self) -> None:
        if not self._scheduled and (self._dirty or self._reflood):
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Report every registration whose match set changed since the last flush (one
        batch per client), and re-flood registrations if a new router appeared."""
        self._scheduled = False
        dirty, self._dirty = self._dirty, {}
        for reg in dirty.values():
            if self.table.registrations.get(reg.reg) is reg:
                self._report(reg)
        self._send_reports()
        if self._reflood:
            self._reflood = False
            self._flood_owned()

    def _report(self, reg: Registration) -> None:
        subs = sorted(self._sid(k) for k in reg.matches)
        if reg.expires is None:  # ours: no flood needed
            self._notify(
                reg.reg,
                self.table.report(reg.reg, self.router_id, frozenset(subs), time.monotonic()),
            )
        else:
            self._outbox.setdefault(reg.client, []).append([reg.reg, subs])

    def _send_reports(self) -> None:
        outbox, self._outbox = self._outbox, {}
        for client, items in outbox.items():
            for i in range(0, len(items), REGS_PER_FLOOD):
                self._controls.flood_control(
                    QUENCH_TOPIC,
                    {
                        "op": "report",
                        "router": self.router_id,
                        "items": items[i : i + REGS_PER_FLOOD],
                    },
                    to=client,
                )
                self.counters["reports_out"] += 1

    def _notify(self, reg_id: str, changes: list[Change]) -> None:
        session = self._sessions.get(reg_id)
        reg = self.table.registrations.get(reg_id)
        if changes and session is not None and reg is not None:
            self._send_notice(session, reg.number, changes)

    def _send_notice(self, session: ClientSession, number: int, changes: list[Change]) -> None:
        for i in range(0, len(changes), MAX_NOTICE_CHANGES):
            session.send(
                QuenchNotice(reg=number, changes=tuple(changes[i : i + MAX_NOTICE_CHANGES]))
            )
        self.counters["notices"] += len(changes)

    def _flood_owned(self) -> None:
        self._flood_registrations(self.table.owned())

    def _flood_registrations(self, regs: list[Registration]) -> None:
        for i in range(0, len(regs), REGS_PER_FLOOD):
            body = {"op": "register", "regs": [r.body() for r in regs[i : i + REGS_PER_FLOOD]]}
            self._controls.flood_control(QUENCH_TOPIC, body)

    # -- from the mesh ----------------------------------------------------------------------

    def _on_control(self, control: Control) -> None:
        body = control.body
        op = body.get("op")
        origin = control.path[0] if control.path else ""
        try:
            if op == "register":
                self._remote_register(
                    parse_registrations(body, owner=origin, max_timeout=MAX_QUENCH_TIMEOUT)
                )
            elif op == "remove":
                regs = body.get("regs")
                for reg_id in regs if type(regs) is list else ():
                    if type(reg_id) is not str:
                        continue
                    reg = self.table.registrations.get(reg_id)
                    if reg is not None and reg.owner == origin and reg.expires is not None:
                        self.table.remove(reg_id)
                        self._dirty.pop(reg_id, None)
            elif op == "report":
                if control.to is None or not self._sessions:
                    return  # only the router holding the publisher's session acts on it
                router_id, items = parse_report(body)
                now = time.monotonic()
                for reg_id, subs in items:
                    if reg_id in self._sessions:
                        self._notify(reg_id, self.table.report(reg_id, router_id, subs, now))
        except ValueError as exc:  # InvalidValue too: a malformed body from a peer
            self.counters["malformed"] += 1
            log.debug("ignoring a malformed quench control from %s: %s", origin, exc)

    def _remote_register(self, regs: list[Registration]) -> None:
        now = time.monotonic()
        for reg in regs:
            try:
                entry, new = self.table.upsert(reg, now)
            except InvalidValue as exc:
                self.counters["refused"] += 1
                log.warning("quench registration %s not kept: %s", reg.reg, exc)
                continue
            if entry.reg in self._sessions and entry.expires is not None:
                self._disown(entry.reg)  # its publisher failed over elsewhere
            if new:
                entry.matches = self._scan(entry)
                if entry.matches:
                    self._dirty[entry.reg] = entry
            elif entry.matches:
                self._dirty[entry.reg] = entry  # a keep-alive: confirm our interest
        self._schedule()

    def _on_router_info(self, control: Control) -> None:
        origin = control.path[0] if control.path else None
        if origin is None:
            return
        if origin not in self._routers_seen:
            if (
                len(self._routers_seen) >= MAX_PEERS
            ):  # bounded like the mesh view: forget the oldest
                del self._routers_seen[min(self._routers_seen, key=self._routers_seen.__getitem__)]
            if self._summaries is None and self.table.owned():
                self._reflood = True  # a router we had not heard of: tell it our registrations
                self._schedule()
        # Kept three of the intervals it repeats its summary at (stretched in a big mesh).
        every = summary_interval(control.body.get("interval"))
        self._routers_seen[origin] = time.monotonic() + 3 * every

    # -- introspection ----------------------------------------------------------------------

    def registrations(self) -> list[dict[str, Any]]:
        """Every registration this router knows, for `aa mesh` and tests."""
        return [
            {
                "reg": r.reg,
                "owner": r.owner,
                "values": dict(r.prototype.values),
                "type": r.prototype.type,
                "matches": len(r.matches),
                "owned": r.expires is None,
            }
            for r in self.table.registrations.values()
        ]

    def interest(self, reg_id: str) -> Mapping[str, frozenset[str]]:
        """For a registration owned here: router id → its matching subscription ids."""
        return {rid: subs for rid, (subs, _) in self.table.interest.get(reg_id, {}).items()}


def _reg_id(session: ClientSession, number: int) -> str:
    """The mesh-wide id of *session*'s registration *number*: its authenticated user, its
    client id and the number. The client id is a name the client picks, so without the user
    another user's client that claims it would replace the registration (here, or from
    another router as a fail-over) and hear what was meant for its publisher."""
    return f"{session.identity.user}/{session.client_id or '?'}/{number}"
