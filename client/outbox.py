"""The publisher's outbox: events waiting for a router, in flight, and recently acknowledged.

Every event is kept as its bytes (`packed_event`, made once when it is published): a frame
is those bytes joined (`Connection.send_publish`), and the outbox holds no objects the
publisher's collector would walk. As `Event` objects (an event and its two maps), the
tens of thousands of events a fast publisher keeps waiting would be promoted to the oldest
generation and walked by every full pass, and packing each frame again would cost as much
once more.

An event stays here until a router acknowledged it, so a router lost mid-way costs nothing:
what no router acknowledged is resent to the next router under the same ids, and the mesh
drops the ones it had already seen. What was acknowledged only moments ago is resent too
(`REPLAY_WINDOW_SECONDS`): an ack means "dispatched and flooded", and a router killed before
its floods left could still have taken some with it; the mesh drops the second copies.

Pure bookkeeping (no I/O): the `AsyncClient` sends the batches this hands out and reports
the acks; `room` and `drained` are the events its publishers wait on.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Mapping
from itertools import accumulate, islice
from pathlib import Path
from typing import Any

from aa.mesh import MAX_ID_LENGTH, Event, InvalidValue, Value, Values, check_values, load_pyx
from aa.mesh.protocol import MAX_FRAME_BYTES, MAX_FRAME_VALUES, packed_event, packed_fields

from .config import (
    BATCH_BYTES,
    BATCH_EVENTS,
    MAX_INFLIGHT_FRAMES,
    REPLAY_WINDOW_EVENTS,
    REPLAY_WINDOW_SECONDS,
)

__all__ = ["Outbox", "check_fits", "packed_publish"]


class Outbox:
    """Events published and not yet acknowledged, and the window of recent acks; each
    event as its bytes."""

    def __init__(self, max_events: int) -> None:
        self.max_events = max_events
        self._queue: deque[bytes] = deque()
        self._inflight: deque[tuple[int, list[bytes]]] = deque()
        self._inflight_events = 0
        #: Acknowledged: (when, the batch's events). The window holds up to 20,000 events for
        #: 10 s; as objects, every full pass of the collector would walk them, a stall of the
        #: client's loop.
        self._recent: deque[tuple[float, list[bytes]]] = deque()
        self._recent_events = 0
        self._seq = 0
        #: Set when an ack made room (publishers waiting on a full outbox go on).
        self.room = asyncio.Event()
        #: Set while nothing waits for an acknowledgement.
        self.drained = asyncio.Event()
        self.drained.set()

    @property
    def pending(self) -> int:
        """Events published and not yet acknowledged by a router."""
        return len(self._queue) + self._inflight_events

    @property
    def full(self) -> bool:
        return self.pending >= self.max_events

    @property
    def waiting(self) -> bool:
        """Whether events wait to be sent."""
        return bool(self._queue)

    def add(self, event: Event) -> None:
        """Queue *event*'s bytes."""
        self.add_packed(packed_event(event))

    def add_packed(self, data: bytes) -> None:
        """Queue an event given as its bytes (`packed_publish`)."""
        self._queue.append(data)
        self.drained.clear()

    def take(self, pending: deque[bytes]) -> int:
        """Queue events' bytes from the left of *pending*, as many as there is room for;
        returns how many (a blocking `Client` hands over what its caller published)."""
        n = min(len(pending), self.max_events - self.pending)
        if n <= 0:
            return 0
        popleft = pending.popleft
        self._queue.extend([popleft() for _ in range(n)])
        self.drained.clear()
        return n

    def next_batch(self) -> tuple[int, list[bytes]] | None:
        """The next frame to send, (seq, the events' bytes), now counted in flight; None when
        nothing waits or `MAX_INFLIGHT_FRAMES` frames are unacknowledged already."""
        queue = self._queue
        if not queue or len(self._inflight) >= MAX_INFLIGHT_FRAMES:
            return None
        # At most BATCH_EVENTS events and BATCH_BYTES bytes, but never none (C loops: this
        # runs for every event a publisher sends).
        sizes = list(accumulate(map(len, islice(queue, BATCH_EVENTS))))
        n = max(1, bisect_right(sizes, BATCH_BYTES))
        batch = [queue.popleft() for _ in range(n)]
        self._seq += 1
        self._inflight.append((self._seq, batch))
        self._inflight_events += n
        return self._seq, batch

    def acked(self, seq: int, now: float) -> None:
        """A router acknowledged every frame up to *seq* (acks are cumulative)."""
        inflight = self._inflight
        while inflight and inflight[0][0] <= seq:
            _, events = inflight.popleft()
            self._inflight_events -= len(events)
            self._recent.append((now, events))
            self._recent_events += len(events)
        self._trim_recent(now)
        self.room.set()
        if not inflight and not self._queue:
            self.drained.set()

    def reconnected(self, now: float) -> None:
        """A new router: what no router acknowledged, and what was acknowledged only moments
        ago, goes first again, in order and under the same ids."""
        while self._inflight:
            _, events = self._inflight.pop()
            self._queue.extendleft(reversed(events))
        self._inflight_events = 0
        self._trim_recent(now)
        while self._recent:
            _, events = self._recent.pop()
            self._queue.extendleft(reversed(events))
        self._recent_events = 0
        if self._queue:
            self.drained.clear()

    def _trim_recent(self, now: float) -> None:
        recent = self._recent
        while recent and (
            self._recent_events - len(recent[0][1]) >= REPLAY_WINDOW_EVENTS
            or now - recent[0][0] > REPLAY_WINDOW_SECONDS
        ):
            self._recent_events -= len(recent.popleft()[1])


def packed_publish(
    values: Mapping[str, Any], type: str | None, meta: Mapping[str, Any] | None, id: str
) -> bytes:
    """The bytes of the event a publisher gives (`packed_event` of it), checked as
    `Event.checked` and `check_fits` check it: `InvalidValue` outside the value model or for
    an event no router takes. No `Event` is built: the outbox keeps bytes alone, and packing
    now also takes the caller's values as they are at the call."""
    v = values if type_of(values) is dict else dict(values)
    m = (meta if type_of(meta) is dict else dict(meta)) if meta else {}
    if _pack is not None:
        data = _pack(id, type, v, m, MAX_ID_LENGTH)
        if data is not None:  # the usual event, checked and packed in one pass
            return data
    check_values(v)
    if m:
        check_values(m, "meta")
    if type is not None and type_of(type) is not str:
        raise InvalidValue(f"event type must be str or None, not {type_of(type).__name__}")
    if type_of(id) is not str or not 0 < len(id) <= MAX_ID_LENGTH:
        raise InvalidValue(f"event id must be a str of 1 to {MAX_ID_LENGTH} characters")
    data = packed_fields(id, type, v, m)
    if len(data) > BATCH_BYTES:
        check_fits(data, v, m)
    return data


type_of = type

#: The compiled check and pack of the usual event (`_publish.pyx`), or None: the reference
#: path below runs alone (``AA_PURE_PYTHON``, or not built from the source as it is).
_pack: Callable[..., bytes | None] | None = getattr(
    load_pyx(__package__ or "aa.client", Path(__file__).resolve().parent, "_publish"),
    "pack",
    None,
)


def check_fits(data: bytes, values: Values, meta: Values) -> None:
    """Raise `InvalidValue` for an event no router takes, given its bytes *data* and its
    *values* and *meta*: more bytes than a frame holds (`MAX_FRAME_BYTES`), or more values
    in its lists and maps than a router decodes from one frame (`MAX_FRAME_VALUES`; large
    arrays travel as `bytes`). Counted only for events over `BATCH_BYTES`: smaller ones
    cannot hold that many."""
    size = len(data)
    if size <= BATCH_BYTES:
        return
    if size > MAX_FRAME_BYTES - 1024:
        raise InvalidValue(
            f"event of {size} bytes is over the {MAX_FRAME_BYTES} bytes a frame holds"
        )
    items = 0
    todo: list[dict[str, Value] | list[Value]] = [values, meta]
    while todo:
        value = todo.pop()
        items += len(value)
        todo += [
            v
            for v in (value.values() if type(value) is dict else value)
            if type(v) is dict or type(v) is list
        ]
    if items > MAX_FRAME_VALUES - 16:
        raise InvalidValue(
            f"event holds {items} values in its lists and maps, more than the "
            f"{MAX_FRAME_VALUES - 16} "
            "a router takes in one frame: send large arrays as bytes"
        )
