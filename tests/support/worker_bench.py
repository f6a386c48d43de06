"""A pattern worker (`aa.router.patterns.workers.child.Worker`) driven in this process: the
CPU each evaluation is charged, without a router or a worker process around it.

Run as a script it is the micro-benchmark of the evaluation loop (the thread's CPU per event
over batches of a cheap script, the charge to each instance included), for a paired
comparison of two trees:

    PYTHONPATH=tests ./.venv/bin/python -m support.worker_bench
"""

from __future__ import annotations

import mmap
import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aa.mesh import Event
from aa.mesh.protocol import event_to_wire, pack
from aa.router.patterns.workers.child import Worker
from aa.router.patterns.workers.wire import SLOT_BYTES, FrameReader

COSTLY = "total = 0\nfor i in range(1000):\n    total += i * n\nif total >= 0:\n    forward()"
CHEAP = "if n >= 0:\n    forward()"

FACTS: dict[str, Any] = {
    "router_id": "r",
    "router_name": "r",
    "time_budget": 0.05,
    "max_state_bytes": 1 << 20,
    "max_sequence": 100_000,
    "client_burst": 0.03,
    "kill_after": 0.04,
    "compile_deadline": 2.0,
    "memory": 512 * 1024 * 1024,
}


@contextmanager
def in_process_worker() -> Iterator[tuple[Worker, list[Any]]]:
    """A worker whose replies are decoded into a list; the CPU limit it arms on this
    process (its kernel backstop) is put back afterwards."""
    limit = resource.getrlimit(resource.RLIMIT_CPU)
    reader = FrameReader()
    replies: list[Any] = []

    def write(data: bytes) -> None:
        reader.feed(data)
        while (reply := reader.next()) is not None:
            replies.append(reply)

    with mmap.mmap(-1, SLOT_BYTES) as slot:
        try:
            yield Worker(FACTS, slot, write), replies
        finally:
            resource.setrlimit(resource.RLIMIT_CPU, limit)


def subscribe(worker: Worker, wkey: int, source: str, client: str) -> None:
    """*client*'s script *source* as subscription *wkey* (its instance id is *wkey* too)."""
    worker.handle(["sub", wkey, wkey, "python", "script", source, {}, client])


def batch(worker: Worker, seq: int, count: int) -> None:
    events = [event_to_wire(Event(values={"n": n})) for n in range(count)]
    worker.handle(["batch", seq, 0, pack(events)])


def charged(replies: list[Any]) -> dict[int, int]:
    """Nanoseconds charged per instance, summed over the batches answered in *replies*."""
    total: dict[int, int] = {}
    for reply in replies:
        if reply[0] == "done":
            spent = reply[5]
            for iid, ns in zip(spent[::2], spent[1::2]):
                total[iid] = total.get(iid, 0) + ns
    return total


def main() -> None:
    rounds, per_batch, batches = 7, 200, 50
    with in_process_worker() as (worker, replies):
        subscribe(worker, 1, CHEAP, "a")
        batch(worker, 0, per_batch)  # warm
        results = []
        for r in range(rounds):
            replies.clear()
            start = time.thread_time_ns()
            for seq in range(batches):
                batch(worker, seq + 1, per_batch)
            results.append((time.thread_time_ns() - start) / (per_batch * batches))
            print(f"round {r}: {results[-1]:8.0f} ns CPU per event", file=sys.stderr)
    results.sort()
    print(f"median {results[rounds // 2]:.0f} ns CPU per event, best {results[0]:.0f}")


if __name__ == "__main__":
    main()
