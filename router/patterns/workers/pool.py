"""`WorkerPool`: the router's side of the worker tier. Places patterns on worker processes,
sends them the events in batches, hands back their deliveries, watches their deadlines and
replaces the ones that die. Runs in the router's event loop and never waits on a worker.

Per worker, one queue of items in dispatch order: control messages (subscribe, update,
unsubscribe) and batches of events. One batch is in flight at a time; its reply sends the
next, so events that arrive while a worker is busy form the next batch by themselves. A
control message closes the batch being filled, so an update takes effect between two events
exactly where the router applied it: no event missed, none doubled.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from aa.mesh import Event, PatternSpec, UsageError
from aa.mesh.protocol import event_from_wire, event_to_wire, pack, unpack

from ..index import freeze
from ..sandbox import MAX_ERROR_TEXT, MAX_LINE_TEXT, ErrorNotice, HostFacts, SandboxLimits
from .config import (
    MAX_BACKLOG_EVENTS,
    MAX_BATCH_EVENTS,
    MAX_STOP_MESSAGE,
    PRECHECK_MAX_SOURCE,
    WATCH_INTERVAL,
    WorkerConfig,
)
from .hooks import missed_each
from .probation import Probation, count
from .process import ROUTER_DIR, ZYGOTE_BOOT, WorkerProcess
from .slots import SUBSCRIBER, Inst, Probe, Slot, Sub, close_result, join_answers
from .wire import encode
from .zygote import Zygote

__all__ = ["WorkerPool"]

log = logging.getLogger("aa.router.patterns.workers")

Deliveries = list[tuple[Hashable, Event]]

#: Deliveries handed on per turn of the router's loop (about 1 ms of work).
DELIVERY_CHUNK = 2000
#: Error notices read from one worker reply: a worker sends at most one per bucket a
#: second, so more in one reply is a broken worker, not news.
MAX_NOTICES_PER_REPLY = 10_000
#: Most CPU one reply may charge one pattern, in ns: a batch of a worker is killed long
#: before a minute, so a larger figure is a broken worker's, and is not added.
_MAX_BATCH_CPU_NS = 60 * 10**9


class WorkerPool(Probation):
    """Worker-tier patterns of one router. `deliver(items)` gets each reply's deliveries,
    in order; `on_stop(keys, code, message)` gets the subscribers of a stopped pattern;
    `on_errors(keys, notice)` gets the subscribers of a pattern that raised (`sandbox/runerrors.py`:
    counted and rate-limited in the worker); `on_missed(keys, count)` gets the subscribers of
    a worker that dropped *count* events
    unmatched (its backlog was full, or it died twice on a batch): `hooks.missed_each` tells
    each key (`missed_events`: a client hears it as a `Missed(count)` frame)."""

    def __init__(
        self,
        *,
        host: HostFacts,
        limits: SandboxLimits,
        config: WorkerConfig,
        deliver: Callable[[Deliveries], None],
        on_stop: Callable[[list[Hashable], str, str], None],
        on_missed: Callable[[list[Hashable], int], None] = missed_each,
        on_errors: Callable[[list[Hashable], ErrorNotice], None] | None = None,
    ) -> None:
        self.config = config
        self._on_errors = on_errors
        self.host = host
        self.facts = {
            "router_id": host.router_id,
            "router_name": host.router_name,
            "time_budget": limits.time_budget,
            "max_state_bytes": limits.max_state_bytes,
            "max_sequence": limits.max_sequence,
            "client_burst": config.client_burst,
            "kill_after": config.kill_after,
            "compile_deadline": config.compile_deadline,
            "memory": config.memory,
        }
        self._deliver = deliver
        self._on_stop = on_stop
        self._on_missed = on_missed
        self._loop = asyncio.get_running_loop()
        self._slots: list[Slot] = []
        self._subs: dict[Hashable, Sub] = {}
        self._by_wkey: dict[int, Sub] = {}
        #: ((kernel, format, source), on probation?) → the instance: a pattern may run in two
        #: places, proven buckets on a regular worker and new ones on probation (`probation.py`).
        self._instances: dict[tuple[tuple[str, str, str], bool], Inst] = {}
        self._client_slot: dict[tuple[str, bool], Slot] = {}  # (client, probation) → its worker
        self._wkeys = itertools.count(1)
        self._iids = itertools.count(1)
        self._seq = itertools.count(1)
        self._numbers = itertools.count(1)
        self._spare: asyncio.Task[WorkerProcess] | None = None
        self._zygote: asyncio.Task[Zygote | None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._pump_scheduled = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self.closed = False
        #: Counters: batches, events sent, kills, crashes, replacements, dropped events.
        self.counters: dict[str, int] = dict.fromkeys(
            (
                "batches",
                "events",
                "kills",
                "crashes",
                "replaced",
                "dropped",
                "graduated",
                "demoted",
            ),
            0,
        )

    # -- subscribers -----------------------------------------------------------------------

    def subscribe(
        self,
        key: Hashable,
        spec: PatternSpec,
        params: Mapping[str, Any],
        client: str,
        kind: int = SUBSCRIBER,
        *,
        scope: tuple[str, ...] | None = None,
    ) -> None:
        """Place *key*'s pattern: a subscriber (`SUBSCRIBER`: its deliveries, to `key`), or a
        standalone matcher (`MATCHER`: each event it accepts is delivered to `key` as is).
        With *scope* the worker runs it only over the event types the scope admits
        (`aa.router.patterns.scope`), in an instance shared only with that scope."""
        spec_key: tuple[Any, ...] = (spec.kernel, spec.format, spec.source)
        if scope is not None:
            spec_key = (*spec_key, tuple(scope))
        inst = self._instance_for(spec_key, freeze(dict(params)), client)
        if inst is None:
            probation = self.config.probation_count > 0
            slot = self._home(client, probation)
            inst = Inst(next(self._iids), spec_key, slot, client, time.monotonic())
            self._instances[(spec_key, probation)] = inst
            slot.instances[inst.iid] = inst
            if self._spare is not None:
                self._prime(self._spare, [spec_key])
        slot = inst.worker
        count(slot.clients, client, 1)
        self._client_slot.setdefault((client, slot.probation), slot)
        sub = Sub(key, next(self._wkeys), spec, dict(params), client, inst, kind)
        sub.scope = None if scope is None else list(scope)
        self._subs[key] = sub
        self._by_wkey[sub.wkey] = sub
        inst.subs[sub.wkey] = sub
        count(inst.params, freeze(sub.params), 1)
        self._control(slot, self._sub_frame(sub))

    def update(self, key: Hashable, params: Mapping[str, Any]) -> None:
        sub = self._subs.get(key)
        if sub is not None:
            count(sub.inst.params, freeze(sub.params), -1)
            sub.params = {**sub.params, **params}
            count(sub.inst.params, freeze(sub.params), 1)  # the worker holds them once sent:
            self._control(
                sub.inst.worker,
                (encode(["update", sub.wkey, dict(params)]), sub, freeze(sub.params)),
            )

    def unsubscribe(self, key: Hashable) -> None:
        sub = self._subs.get(key)
        if sub is None:
            return
        self._forget(sub)
        self._control(sub.inst.worker, encode(["unsub", sub.wkey]))
        if not self._subs:
            self._shut_down()

    def __len__(self) -> int:
        return len(self._subs)

    def __contains__(self, key: object) -> bool:  # a placed subscriber or matcher
        return key in self._subs

    def probe(
        self, key: Hashable, events: list[Event], needs: list[bool] | None = None
    ) -> asyncio.Future[list[bool]]:
        """Dry-run *key*'s pattern in its worker over *events*: one bool each, as
        `PatternEngine.matches_prototype` there (*needs*[i]: its `needs_names` for event i).
        The answer is the future's result (all False if the pattern is stopped meanwhile).
        Sent in chunks of `MAX_BATCH_EVENTS` between batches: a long history delays the
        worker's other patterns one chunk at a time. Raises `UsageError` for an unknown key."""
        sub = self._subs.get(key)
        if sub is None:
            raise UsageError(f"no worker-tier pattern {key!r}")
        flags = list(needs) if needs is not None else [False] * len(events)
        parts = []
        for start in range(0, len(events), MAX_BATCH_EVENTS):
            parts.append(future := self._loop.create_future())
            end = start + MAX_BATCH_EVENTS
            sub.inst.worker.queue.append(Probe(sub, events[start:end], flags[start:end], future))
        self._control(sub.inst.worker, b"")
        if len(parts) == 1:
            return parts[0]
        whole: asyncio.Future[list[bool]] = self._loop.create_future()
        gathered = asyncio.gather(*parts)
        gathered.add_done_callback(lambda g: join_answers(whole, g))
        return whole

    @property
    def warm(self) -> bool:
        """Every worker has a live process with nothing queued, and the spare is ready."""
        spare = self._spare
        return (spare is None or spare.done()) and all(
            s.proc is not None and not s.proc.gone and s.in_flight is None and not s.queue
            for s in self._slots
        )

    def _sub_frame(self, sub: Sub, state: bytes = b"") -> bytes:
        s, sub.held = sub.spec, freeze(sub.params)
        return encode(
            [
                "sub",
                sub.wkey,
                sub.inst.iid,
                s.kernel,
                s.format,
                s.source,
                sub.params,
                sub.client,
                sub.kind,
                state,
                sub.scope,
            ]
        )

    # -- placement -------------------------------------------------------------------------

    def _start(self, slot: Slot) -> None:
        """Give *slot* a process: the warm spare if there is one, else a new one."""
        slot.proc = None
        spare, self._spare = self._spare, None
        task = self._loop.create_task(self._take(slot, spare))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if self._watch is None:
            self._watch = self._loop.create_task(self._watchdog())

    async def _take(self, slot: Slot, spare: asyncio.Task[WorkerProcess] | None) -> None:
        proc: WorkerProcess | None = None
        if spare is not None:
            try:
                proc = await spare
            except Exception:
                proc = None
        while proc is None and not self.closed:
            try:
                proc = await self._spawn()
            except (OSError, TimeoutError) as exc:
                log.error("cannot start a pattern worker: %s", exc)
                await asyncio.sleep(1.0)  # retry; events queue (capped) meanwhile
        if self.closed or slot not in self._slots:
            if proc is not None:
                proc.kill()
            return
        assert proc is not None
        proc.on_exit = lambda p: self._exited(slot, p)
        proc.on_message = lambda p, m: self._message(slot, p, m)
        slot.proc = proc
        if proc.gone:  # died between ready and now
            self._exited(slot, proc)
            return
        if self._spare is None:
            self._spare = self._loop.create_task(self._spawn())
            self._spare.add_done_callback(self._prime)
        self._pump_slot(slot)

    async def _spawn(self) -> WorkerProcess:
        zygote = await self._the_zygote()
        proc = WorkerProcess(next(self._numbers), lambda p, m: None, lambda p: None)
        await proc.start(self.facts, self.config.start_timeout, zygote)
        return proc

    async def _the_zygote(self) -> Zygote | None:
        """The zygote that forks workers (`zygote.py`), started on first use and again if
        it died; None if it cannot start (workers are then spawned one by one)."""
        task = self._zygote
        if task is None or (
            task.done() and (task.cancelled() or (zygote := task.result()) is None or zygote.gone)
        ):
            task = self._zygote = self._loop.create_task(
                Zygote.started(ZYGOTE_BOOT, ROUTER_DIR, self.config.start_timeout)
            )
        return await asyncio.shield(task)

    # -- events ----------------------------------------------------------------------------

    def dispatch(self, event: Event) -> None:
        """Queue *event* for every worker that holds patterns (called once per event)."""
        for slot in self._slots:
            if not slot.instances:
                continue
            if slot.queued_events >= MAX_BACKLOG_EVENTS:
                # Dropped, counted at its place in the queue: told to the subscribers in order.
                self.counters["dropped"] += 1
                if slot.queue and type(slot.queue[-1]) is int:
                    slot.queue[-1] += 1
                else:
                    slot.queue.append(1)
                continue
            queue = slot.queue
            slot.epoch += 1
            last = queue[-1] if queue else None
            if type(last) is list and len(last) < MAX_BATCH_EVENTS:
                last.append(event)
            else:
                queue.append([event])
            slot.queued_events += 1
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self._loop.call_soon(self._pump)

    def _control(self, slot: Slot, frame: Any) -> None:
        slot.epoch += 1
        if frame:
            slot.queue.append(frame)
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self._loop.call_soon(self._pump)

    def _pump(self) -> None:
        self._pump_scheduled = False
        for slot in self._slots:
            self._pump_slot(slot)

    def _pump_slot(self, slot: Slot) -> None:
        """Send *slot*'s control messages up to and including its next batch."""
        proc = slot.proc
        if proc is None or proc.gone or slot.in_flight is not None or slot.delivering:
            return
        queue = slot.queue
        while queue:
            item = queue.popleft()
            if type(item) is bytes:
                proc.send(item)
                continue
            if type(item) is tuple:  # an update: (frame, subscriber, its params frozen)
                proc.send(item[0])
                item[1].held = item[2]
                continue
            if type(item) is int:
                self._notice(slot, item, "its worker fell behind")
                continue
            if type(item) is Probe:
                if self._subs.get(item.sub.key) is not item.sub:
                    item.answer(None)
                    continue
                seq = next(self._seq)
                slot.in_flight = (seq, item)
                blob = pack([event_to_wire(e) for e in item.events])
                proc.send(encode(["probe", seq, item.sub.wkey, item.needs, blob]))
                return
            slot.queued_events -= len(item)
            seq = next(self._seq)
            slot.in_flight = (seq, item)
            blob = pack([event_to_wire(e) for e in item])
            proc.send(encode(["batch", seq, self.host.peer_count(), blob]))
            self.counters["batches"] += 1
            self.counters["events"] += len(item)
            return

    def _message(self, slot: Slot, proc: WorkerProcess, msg: list[Any]) -> None:
        op = msg[0]
        if op == "done":
            _, seq, flat, derived_blob, stops, *cpu = msg
            flight, slot.in_flight = slot.in_flight, None
            slot.retried = False
            if flight is None or flight[0] != seq:
                proc.kill("protocol")
                return
            events = flight[1]
            if type(events) is Probe:
                proc.kill("protocol")
                return
            if slot.probation:
                self._ran(slot, len(events))
            derived = (
                [event_from_wire(w) for w in unpack(derived_blob)] if len(derived_blob) > 1 else []
            )
            by_wkey = self._by_wkey
            out: Deliveries = []
            for i in range(0, len(flat), 2):
                sub = by_wkey.get(flat[i])
                if sub is not None and sub.inst.worker is slot:  # a worker speaks for its own only
                    ref = flat[i + 1]
                    out.append((sub.key, events[ref] if ref >= 0 else derived[-1 - ref]))
            if cpu:
                self._charge(slot, cpu[0])
            for wkeys, code, message in stops:
                self._stop_wkeys(slot, wkeys, code, message)
            self._deliver_chunks(slot, out, 0)
        elif op == "probed":
            _, seq, results, stops = msg
            flight, slot.in_flight = slot.in_flight, None
            if (
                flight is None
                or flight[0] != seq
                or type(flight[1]) is not Probe
                or len(results) != len(flight[1].events)
            ):
                proc.kill("protocol")
                return
            for wkeys, code, message in stops:
                self._stop_wkeys(slot, wkeys, code, message)
            flight[1].answer([r is True for r in results])
            self._pump_slot(slot)
        elif op == "refused":
            sub = self._by_wkey.get(msg[1])
            if sub is not None and sub.inst.worker is slot:
                self._stop_inst(sub.inst, msg[2], msg[3])
        elif op == "stop":
            self._stop_wkeys(slot, msg[1], msg[2], msg[3])
        elif op == "errors":
            self._errors(slot, msg[1])
        elif op == "exported":
            self._exported(slot, msg[1], msg[2])

    def _charge(self, slot: Slot, flat: Any) -> None:
        """Add a batch's CPU, ``[iid, ns, iid, ns, ...]``, to the instances of *slot* (a
        worker speaks for its own only; anything else in the list is ignored)."""
        if type(flat) is not list:
            return
        instances = slot.instances
        for i in range(0, len(flat) - 1, 2):
            inst, ns = instances.get(flat[i]), flat[i + 1]
            if inst is not None and type(ns) is int and 0 < ns < _MAX_BATCH_CPU_NS:
                inst.cpu_ns += ns

    def spec_keys(self) -> set[tuple[Any, ...]]:
        """The patterns placed on the workers (their engine keys: kernel, format, source and
        a scope where there is one)."""
        return {inst.spec_key for inst in self._instances.values()}

    def cpu_ns(self, spec_key: tuple[Any, ...]) -> int:
        """CPU the workers reported for the pattern of *spec_key* (on probation and off), ns."""
        return sum(
            inst.cpu_ns
            for probation in (False, True)
            if (inst := self._instances.get((spec_key, probation))) is not None
        )

    def _deliver_chunks(self, slot: Slot, out: Deliveries, start: int) -> None:
        """Deliver *out* a chunk per turn of the loop (a script may forward thousands of
        copies per event to its own subscriber: that must not hold up anybody else), then
        send the worker its next batch. A chunk ends between two events: the router writes
        between chunks, and a client drops a second frame holding the same event."""
        end = start + DELIVERY_CHUNK
        if end < len(out):  # never split one event's deliveries: a client takes each once
            last = out[end - 1][1]
            while end < len(out) and out[end][1] is last:
                end += 1
        if start or end < len(out):
            part = out[start:end]
        else:
            part = out
        if part:
            self._deliver(part)
        if end < len(out):
            slot.delivering = True
            self._loop.call_soon(self._deliver_chunks, slot, out, end)
            return
        slot.delivering = False
        self._pump_slot(slot)
        self._quiet(slot)

    # -- stops, kills and replacements -----------------------------------------------------
    def _stop_wkeys(self, slot: Slot, wkeys: list[int], code: str, message: str) -> None:
        keys = []
        for w in wkeys:
            sub = self._by_wkey.get(w)
            if sub is not None and sub.inst.worker is slot:
                self._forget(sub)
                keys.append(sub.key)
        if keys:
            self._report(keys, code, message)

    def _errors(self, slot: Slot, notices: list[Any]) -> None:
        """A worker's notices of patterns that raised: [[wkey...], error, count, line, text]
        each; checked as any worker reply (a worker speaks for its own subscribers only)."""
        if self._on_errors is None or type(notices) is not list:
            return
        for item in notices[:MAX_NOTICES_PER_REPLY]:
            try:
                wkeys, error, count, line, text = item
                notice = ErrorNotice(
                    error=str(error)[:MAX_ERROR_TEXT],
                    count=int(count),
                    line=int(line),
                    text=str(text)[:MAX_LINE_TEXT],
                )
                subs = [self._by_wkey.get(w) for w in wkeys]
            except (TypeError, ValueError):
                continue
            keys = [s.key for s in subs if s is not None and s.inst.worker is slot]
            if keys:
                try:
                    self._on_errors(keys, notice)
                except Exception:
                    log.exception("reporting a pattern's errors failed")

    def _report(self, keys: list[Hashable], code: str, message: str) -> None:
        if len(message) > MAX_STOP_MESSAGE:
            message = message[: MAX_STOP_MESSAGE - 3] + "..."
        try:
            self._on_stop(keys, code, message)
        except Exception:
            log.exception("reporting a stopped pattern failed")

    async def _watchdog(self) -> None:
        """Kill a worker stuck in one evaluation (or compilation) past its limit and still
        burning CPU: it is in a call no tick can interrupt."""
        kill_cpu = self.config.kill_cpu
        while not self.closed:
            await asyncio.sleep(WATCH_INTERVAL)
            now = time.monotonic_ns()
            for slot in self._slots:
                if slot.stuck(now, kill_cpu):
                    self.counters["kills"] += 1

    def _exited(self, slot: Slot, proc: WorkerProcess) -> None:
        """A worker is gone: blame the pattern it was running, re-create the others on a
        fresh worker, and send it what the dead one had not answered."""
        if self.closed or slot.proc is not proc:
            return
        slot.suspect = slot.asking = None
        self.counters["crashes"] += proc.killed_for is None
        iid, code, why = proc.blame()
        blamed = self._by_wkey.get(-iid) if iid < 0 else None
        inst = slot.instances.get(iid) if blamed is None else blamed.inst
        if inst is not None and inst.worker is slot:
            # The bucket it was evaluating (the subscribers with those params), else the
            # instance it was compiling.
            mates = self._mates(slot, inst, blamed)
            self._stop_subs(mates, code, f"pattern stopped: {why}; its worker process was replaced")
            self._demote(slot, blamed.client if blamed is not None else inst.client)
        elif slot.in_flight is not None and type(slot.in_flight[1]) is not Probe:
            # No culprit known (killed from outside, or between two evaluations): the batch
            # is sent to the next worker once; if that one dies on it too, the batch may be
            # what kills them, and its events are dropped for this worker's patterns.
            if slot.retried:
                self._notice(slot, len(slot.in_flight[1]), "its worker process failed")
                slot.in_flight = None
            slot.retried = not slot.retried
        self.counters["replaced"] += 1
        self._rebuild(slot)

    def _rebuild(self, slot: Slot) -> None:
        """New queue for a fresh process (`Slot.requeue`), then a process (the spare, whose
        compile cache has the sources: `_prime`; what it holds for others, it drops)."""
        subs = sorted(
            (s for i in slot.instances.values() for s in i.subs.values()), key=lambda s: s.wkey
        )
        slot.requeue(
            [self._sub_frame(sub) for sub in subs] + [encode(["uncache"])], MAX_BATCH_EVENTS
        )
        self._start(slot)

    def _prime(self, spare: asyncio.Task[WorkerProcess], specs: Any = None) -> None:
        """Have the spare compile every short source placed (or *specs*) ahead of need, so
        a replacement re-creates its patterns from its cache, not by compiling them."""
        if (
            spare is self._spare
            and spare.done()
            and not spare.cancelled()
            and spare.exception() is None
        ):
            for kernel, fmt, source, *_scope in specs or {k for k, _ in self._instances}:
                if (
                    kernel == "python" and len(source) <= PRECHECK_MAX_SOURCE
                ):  # bounded work: no watchdog here
                    spare.result().send(encode(["precompile", kernel, fmt, source]))

    # -- notices and closing ---------------------------------------------------------------

    def _notice(self, slot: Slot, n: int, why: str) -> None:
        keys = [s.key for i in slot.instances.values() for s in i.subs.values()]
        log.warning("%d events dropped for %d pattern subscribers: %s", n, len(keys), why)
        if keys:
            try:
                self._on_missed(keys, n)
            except Exception:
                log.exception("telling subscribers of dropped events failed")

    def _shut_down(self) -> None:
        """No worker-tier subscriber left: stop every process (and the spare)."""
        for slot in self._slots:
            slot.answer_probes()
            if slot.proc is not None:
                slot.proc.on_exit = lambda p: None
                slot.proc.kill()
        self._slots.clear()
        self._client_slot.clear()
        if self._spare is not None:
            self._spare.add_done_callback(close_result)
            self._spare = None
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self._zygote is not None:
            self._zygote.add_done_callback(close_result)
            self._zygote = None

    async def aclose(self) -> None:
        """Stop every worker. Idempotent."""
        self._shut_down()
        self.closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
