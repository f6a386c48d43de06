"""The pool's records (`pool.py`): a subscriber or standalone matcher placed on a worker,
a distinct pattern on one worker, a place in the pool, and a dry run waiting for its answer.
Data only; the pool holds the logic."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from aa.mesh import Event, PatternSpec

if TYPE_CHECKING:
    from .process import WorkerProcess

__all__ = ["Sub", "Inst", "Slot", "Probe", "SUBSCRIBER", "MATCHER", "close_result", "join_answers"]

#: What a placed pattern is to its worker: a subscriber (in the worker's engine: shared
#: instance, group, round-robin) or a standalone matcher (a client cache's: its own bucket
#: and state; it "accepts" an event when it matches or forwards anything, and the router
#: is handed the event itself).
SUBSCRIBER, MATCHER = 0, 1


class Sub:
    __slots__ = ("key", "wkey", "spec", "params", "client", "inst", "kind", "held", "scope")

    def __init__(
        self,
        key: Hashable,
        wkey: int,
        spec: PatternSpec,
        params: dict[str, Any],
        client: str,
        inst: Inst,
        kind: int,
    ) -> None:
        self.key, self.wkey, self.spec, self.params, self.client, self.inst = (
            key,
            wkey,
            spec,
            params,
            client,
            inst,
        )
        self.kind = kind
        #: Its params as its worker holds them (frozen): they change when the update is
        #: sent, not when it is queued, so a kill blames the bucket the worker was running.
        self.held: Any = None
        #: The event types its pattern may see (`aa.router.patterns.scope`); None: any.
        self.scope: list[str] | None = None


class Inst:
    """One distinct pattern on one worker (its group lives there whole). On a probation
    worker (`probation.py`): since when, and over how many events it ran there."""

    __slots__ = (
        "iid",
        "spec_key",
        "worker",
        "subs",
        "client",
        "since",
        "trial",
        "next_try",
        "params",
        "cpu_ns",
    )

    def __init__(
        self, iid: int, spec_key: tuple[str, str, str], worker: Slot, client: str, since: float
    ) -> None:
        self.iid, self.spec_key, self.worker, self.client = iid, spec_key, worker, client
        self.subs: dict[int, Sub] = {}
        self.since = since
        self.trial = 0
        self.next_try = 0  # events of trial before the next try to move it (its state would not go)
        #: Its subscribers' params (frozen: `buckets.freeze`) → how many have them.
        self.params: dict[Any, int] = {}
        #: CPU its evaluations took in the worker, in ns, as the worker reports per batch.
        self.cpu_ns = 0


class Probe:
    """A dry run of one placed pattern over some events (quench prototypes, stored events
    for a history replay, a one-shot query): queued in its worker's order like a batch, and
    answered with one bool per event."""

    __slots__ = ("sub", "events", "needs", "future")

    def __init__(
        self, sub: Sub, events: list[Event], needs: list[bool], future: asyncio.Future[list[bool]]
    ) -> None:
        self.sub, self.events, self.needs, self.future = sub, events, needs, future

    def answer(self, results: list[bool] | None) -> None:
        """Resolve it (None: the pattern is gone, nothing matches)."""
        if not self.future.done():
            self.future.set_result(
                list(results) if results is not None else [False] * len(self.events)
            )


class Slot:
    """A place in the pool: the current process serving it, and what it must be sent."""

    def __init__(self, number: int, probation: bool = False) -> None:
        self.number = number
        #: A probation worker: new patterns run here first (`probation.py`).
        self.probation = probation
        #: Items ever queued here (a graduation's state is good only if none came since).
        self.epoch = 0
        #: The graduation asked of this worker: (seq, instances, epoch then), or None.
        self.asking: tuple[int, list[Inst], int] | None = None
        self.proc: WorkerProcess | None = None
        #: bytes (a control frame), list[Event] (a batch), a Probe, or an int (events dropped
        #: here: the backlog was full), in dispatch order.
        self.queue: deque[Any] = deque()
        self.queued_events = 0
        #: (seq, the batch's events or the Probe) awaiting the worker's answer.
        self.in_flight: tuple[int, Any] | None = None
        #: Client → how many of its subscribers (and matchers) are placed here.
        self.clients: dict[str, int] = {}
        self.instances: dict[int, Inst] = {}
        self.suspect: tuple[int, int, float] | None = None
        self.delivering = False  # a reply's deliveries are still being handed on
        self.retried = False  # the batch in flight was already resent after a crash

    def requeue(self, sub_frames: list[bytes], batch: int) -> None:
        """The queue for a fresh process: every live subscriber re-created (*sub_frames*, in
        subscription order, with current params), then the unanswered batch and the queued
        events (in batches of *batch*), then the dry runs still waiting. A dry run the dead
        worker was running is answered "no match"."""
        events: list[Event] = []
        probes: list[Any] = []  # dry runs, and counts of dropped events (kept after the events)
        if self.in_flight is not None:
            if type(self.in_flight[1]) is Probe:
                self.in_flight[1].answer(None)
            else:
                events.extend(self.in_flight[1])
            self.in_flight = None
        for item in self.queue:
            if type(item) is list:
                events.extend(item)
            elif type(item) is Probe or type(item) is int:
                probes.append(item)
        self.queue.clear()
        if not self.instances:
            for probe in probes:
                if type(probe) is Probe:
                    probe.answer(None)
            self.queued_events = 0
            return
        self.queue.extend(sub_frames)
        for start in range(0, len(events), batch):
            self.queue.append(events[start : start + batch])
        self.queue.extend(probes)
        self.queued_events = len(events)

    def answer_probes(self) -> None:
        """Answer every waiting dry run "no match" (the pool is shutting down)."""
        if self.in_flight is not None and type(self.in_flight[1]) is Probe:
            self.in_flight[1].answer(None)
        for item in self.queue:
            if type(item) is Probe:
                item.answer(None)

    def stuck(self, now: int, kill_cpu: float) -> bool:
        """The watchdog's look (at monotonic ns *now*): is the process stuck in one
        evaluation past its limit, and has it burnt *kill_cpu* more seconds of CPU since the
        last look that found it so? Then it is killed (the pool replaces it)."""
        proc = self.proc
        if proc is None or proc.gone or proc.killed_for is not None:
            return False
        iid, started, limit = proc.read_slot()
        if not started or now - started <= limit:
            return False
        cpu = proc.cpu_seconds()
        if cpu is None:
            return False
        suspect = self.suspect
        if suspect is None or suspect[:2] != (iid, started):
            self.suspect = (iid, started, cpu)
            return False
        if cpu - suspect[2] < kill_cpu:
            return False
        proc.kill(("timeout", iid, limit))
        return True


def join_answers(
    whole: asyncio.Future[list[bool]], parts: asyncio.Future[list[list[bool]]]
) -> None:
    """Resolve *whole* with the answers of a dry run sent in *parts*."""
    if not whole.done():
        whole.set_result([b for part in parts.result() for b in part])


def close_result(task: asyncio.Task[Any]) -> None:
    """Once *task* is done: kill the worker process (or close the zygote) it made."""
    if not task.cancelled() and task.exception() is None and task.result() is not None:
        result = task.result()
        (result.kill if hasattr(result, "kill") else result.close)()
