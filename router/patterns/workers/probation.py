"""Probation: a worker-tier pattern's first events run on a worker kept for new patterns.

Why: a worker runs the patterns placed on it one after another, so a pattern that strikes
(an evaluation only the tick budget stops, or a call into C only a kill ends) delays every
other pattern on its worker. Fairness inside a worker bounds what one *client* costs the
others (package docstring), but a stranger can open many connections: many new clients
striking at once would hold another client's script deliveries for seconds. Two processes, though,
run side by side: the kernel does not wait for one to finish an evaluation. So a new
pattern goes to a probation worker (`WorkerConfig.probation_workers`, as many as the
regular ones by default; a client's new patterns share one), and moves to a regular worker
once it has run `probation_events` events over `probation_seconds` there without being
stopped (a source longer than `GRADUATE_MAX_SOURCE` stays: compiling it again would hold the
regular worker's other patterns). A newcomer's first strike then delays other newcomers only, and
patterns that have proved themselves run beside patterns that have too. A pattern that later gets a
regular worker killed sends its client's other patterns there back to probation (they
are re-created anyway, their state lost with the process).

Moving keeps the pattern's state. When a probation worker has answered every batch and
nothing waits for it, the pool asks it for the states of the patterns due to move
(`carry.py`); the answer counts only if still nothing has been queued for that worker (else
the pool asks again at its next quiet moment). The regular worker then re-creates each
pattern from its source, with its subscribers' params and that state, behind the events
already queued for it: no event missed or seen twice, each subscriber's deliveries in order.
A state that cannot be carried (an event view, a generator kept in it) keeps the pattern
on probation, to be asked again after as many events again. Under a load that never lets a
probation worker go quiet, its patterns stay there and are served there: probation only
decides who runs beside whom.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..index import freeze
from .slots import SUBSCRIBER, Inst, Slot, Sub
from .wire import encode

if TYPE_CHECKING:
    from .config import WorkerConfig

__all__ = ["Probation", "count"]

#: Most patterns one graduation moves (their states travel in one message).
GRADUATE_AT_ONCE = 64
#: Longest source that leaves probation, and the most source one graduation moves, in
#: characters: the regular worker compiles what joins it (about 8 µs a character), and its
#: other patterns wait meanwhile: at most ~16 ms per quiet moment of the probation worker.
GRADUATE_MAX_SOURCE = 2048
#: Longest carried state the pool passes on, in bytes (the sandbox caps a state at
#: `max_state_bytes` of memory; its bytes on the wire are fewer).
MAX_CARRIED_BYTES = 4 * 1024 * 1024


class Probation:
    """The pool's placement across probation and regular workers (a part of `WorkerPool`,
    split out for length: it uses the pool's records and queues)."""

    config: WorkerConfig
    counters: dict[str, int]
    _slots: list[Slot]
    _client_slot: dict[tuple[str, bool], Slot]
    _seq: itertools.count[int]
    _by_wkey: dict[int, Any]
    _subs: dict[Any, Any]
    _on_missed: Callable[[list[Any], int], None]
    _instances: dict[tuple[tuple[str, str, str], bool], Inst]

    def _start(self, slot: Slot) -> None:  # the pool's
        raise NotImplementedError

    def _sub_frame(self, sub: Any, state: bytes = b"") -> bytes:  # the pool's
        raise NotImplementedError

    def _control(self, slot: Slot, frame: Any) -> None:  # the pool's
        raise NotImplementedError

    def _report(self, keys: list[Any], code: str, message: str) -> None:  # the pool's
        raise NotImplementedError

    def stats(self) -> dict[str, int]:
        """For `Router.stats` (`/health`): processes of each kind, patterns on probation, and
        the counters (kills, crashes, replacements, drops, graduations, demotions)."""
        on_trial = sum(len(s.instances) for s in self._slots if s.probation)
        regular = sum(1 for s in self._slots if not s.probation)
        return {
            "regular_workers": regular,
            "probation_workers": len(self._slots) - regular,
            "patterns_on_probation": on_trial,
            **self.counters,
        }

    def _stop_inst(self, inst: Inst, code: str, message: str) -> None:
        self._stop_subs(list(inst.subs.values()), code, message)

    def _stop_subs(self, subs: list[Sub], code: str, message: str) -> None:
        for sub in subs:
            inst = sub.inst
            self._forget(sub)
            if inst.worker.proc is not None:
                self._control(inst.worker, encode(["unsub", sub.wkey]))
        if subs:
            self._report([s.key for s in subs], code, message)

    def _mates(self, slot: Slot, inst: Inst, blamed: Sub | None) -> list[Sub]:
        """Whom a kill of *slot* stops: the bucket it was evaluating — the subscribers of
        *blamed*'s params (as the worker keys them: `freeze` tells 1, 1.0 and True apart),
        *blamed* alone if it is a cache's matcher (a bucket of its own); params as the worker
        holds them (`Sub.held`: an update queued behind the batch is not yet); the whole
        instance if it was compiling (*blamed* None)."""
        if blamed is None:
            return list(inst.subs.values())
        if blamed.kind != SUBSCRIBER:
            return [blamed]
        return [s for s in inst.subs.values() if s.kind == SUBSCRIBER and s.held == blamed.held]

    def _instance_for(
        self, spec_key: tuple[str, str, str], params: Any, client: str
    ) -> Inst | None:
        """The instance a new subscriber of *spec_key* with (frozen) *params* joins, if any:
        the proven one where these params run already (nothing new runs there), else the
        one on probation (new params are new behaviour: they prove themselves first)."""
        proven = self._instances.get((spec_key, False))
        if proven is not None and (not self.config.probation_count or params in proven.params):
            return proven
        return self._instances.get((spec_key, True))

    def _forget(self, sub: Sub) -> None:
        """Subscriber *sub* is gone (unsubscribed, or its pattern stopped)."""
        del self._subs[sub.key]
        del self._by_wkey[sub.wkey]
        inst = sub.inst
        del inst.subs[sub.wkey]
        count(inst.params, freeze(sub.params), -1)
        if not inst.subs:
            if self._instances.get((inst.spec_key, inst.worker.probation)) is inst:
                del self._instances[(inst.spec_key, inst.worker.probation)]
            inst.worker.instances.pop(inst.iid, None)
        self._left(sub.client, inst.worker)

    def _home(self, client: str, probation: bool) -> Slot:
        """Where *client*'s new pattern goes: its worker of that kind, else a new worker
        while the pool has room, else the one serving the fewest clients."""
        slot = self._client_slot.get((client, probation))
        if slot is not None:
            return slot
        kind = [s for s in self._slots if s.probation == probation]
        if len(kind) < (self.config.probation_count if probation else self.config.workers):
            slot = Slot(len(self._slots), probation)
            self._slots.append(slot)
            self._start(slot)
            return slot
        return min(kind, key=lambda s: (len(s.clients), len(s.instances), s.number))

    def _ran(self, slot: Slot, events: int) -> None:
        """A probation worker answered a batch of *events*: its patterns ran them."""
        for inst in slot.instances.values():
            inst.trial += events

    def _quiet(self, slot: Slot) -> None:
        """*slot* answered everything and nothing waits for it: ask for the states of its
        patterns due to move (at most `GRADUATE_AT_ONCE`)."""
        if (
            not slot.probation
            or slot.asking is not None
            or slot.queue
            or slot.in_flight is not None
            or slot.delivering
        ):
            return
        if slot.proc is None or slot.proc.gone:
            return
        config, now = self.config, time.monotonic()
        due: list[Inst] = []
        size = 0
        for i in slot.instances.values():
            if (
                i.trial >= max(config.probation_events, i.next_try)
                and now - i.since >= config.probation_seconds
            ):
                n = len(i.spec_key[2])
                if n > GRADUATE_MAX_SOURCE:
                    continue  # stays: re-compiling it would hold a regular worker
                size += n
                if (size > GRADUATE_MAX_SOURCE and due) or len(due) >= GRADUATE_AT_ONCE:
                    break
                due.append(i)
        if due:
            seq = next(self._seq)
            slot.asking = (seq, due, slot.epoch)
            slot.proc.send(encode(["export", seq, [w for i in due for w in sorted(i.subs)]]))

    def _exported(self, slot: Slot, seq: int, states: list[Any]) -> None:
        """The probation worker's answer: [wkey, state bytes or None (not portable)]..."""
        asking, slot.asking = slot.asking, None
        if asking is None or asking[0] != seq:
            return
        _, due, epoch = asking
        if slot.epoch != epoch or slot.queue or slot.in_flight is not None or slot.delivering:
            self._quiet(slot)  # something came meanwhile: the states are stale
            return
        carried = {
            w: b
            for w, b in states
            if b is None or (type(b) is bytes and len(b) <= MAX_CARRIED_BYTES)
        }
        for inst in due:
            if inst.worker is not slot or not inst.subs:
                continue  # stopped or gone meanwhile
            if any(carried.get(w) is None for w in inst.subs):
                inst.next_try = inst.trial + self.config.probation_events
                continue
            self._move(inst, False, carried)
            self.counters["graduated"] += 1

    def _move(
        self, inst: Inst, probation: bool, states: Mapping[int, bytes | None] | None = None
    ) -> None:
        """Re-place *inst* on a worker of the other kind: gone from its worker now,
        re-created there behind what is queued (with its carried *states*, by wkey; else an
        empty state): on the pattern's instance of that kind if it has one, else on its
        client's worker of that kind (`_home`)."""
        old = inst.worker
        del old.instances[inst.iid]
        if self._instances.get((inst.spec_key, old.probation)) is inst:
            del self._instances[(inst.spec_key, old.probation)]
        subs = sorted(inst.subs.values(), key=lambda s: s.wkey)
        if old.proc is not None and not old.proc.gone:
            for sub in subs:
                self._control(old, encode(["unsub", sub.wkey]))
        there = self._instances.get((inst.spec_key, probation))
        to = there.worker if there is not None else self._home(inst.client, probation)
        if there is not None:
            for sub in subs:
                sub.inst = there
                there.subs[sub.wkey] = sub
                count(there.params, freeze(sub.params), 1)
        else:
            inst.worker = to
            to.instances[inst.iid] = inst
            self._instances[(inst.spec_key, to.probation)] = inst
            inst.since, inst.trial, inst.next_try = time.monotonic(), 0, 0
        for sub in subs:
            count(to.clients, sub.client, 1)
            self._left(sub.client, old)
            self._client_slot.setdefault((sub.client, to.probation), to)
            self._control(to, self._sub_frame(sub, (states or {}).get(sub.wkey) or b""))

    def _left(self, client: str, slot: Slot) -> None:
        """A subscriber of *client*'s left *slot*: was it the client's last one there?"""
        count(slot.clients, client, -1)
        if client not in slot.clients:
            if self._client_slot.get((client, slot.probation)) is slot:
                del self._client_slot[(client, slot.probation)]

    def _demote(self, slot: Slot, culprit: str) -> None:
        """A pattern of *culprit*'s got regular worker *slot* killed: its other patterns
        there go back to probation (re-created there; their state died with the process, and
        the events the process had not answered are not sent to them again: they are told
        how many, as `Missed`)."""
        if slot.probation or not self.config.probation_count:
            return
        moved = [i for i in slot.instances.values() if i.client == culprit]
        flight = (
            slot.in_flight[1]
            if slot.in_flight is not None and type(slot.in_flight[1]) is list
            else ()
        )
        missed = len(flight) + slot.queued_events  # sent again to the new process, not to these
        for inst in moved:
            self._move(inst, True)
            self.counters["demoted"] += 1
        keys = [s.key for i in moved for s in i.subs.values()]
        if keys and missed:
            self._on_missed(keys, missed)


def count(counts: dict[Any, int], key: Any, n: int) -> None:
    """Add *n* to *counts*[*key*], forgetting a key that reaches 0."""
    left = counts.get(key, 0) + n
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
