"""When a client's publish is acknowledged: the one rule, and the one place that keeps it.

The rule
--------
A client's `Publish` frame (sequence number *seq*) is acknowledged once, in this order:

1. **durable where asked**: every event of the frame that asked to be persisted here
   (``meta["persist"]``) is committed to the store (`EventStore.flush()` returned), so it
   survives ``kill -9`` of the router;
2. **flooded**: the frame's events, already dispatched here, are in the kernel's socket
   buffers for every peer link (the bytes the links had written when the frame was handled
   have left our buffers), so a router killed after acknowledging loses nothing the client
   will not resend — the kernel sends on after the process is gone;
3. **in order**: acks are cumulative, so an ack never overtakes an earlier frame of the
   same session. While a persisted frame waits for the store, that session's later frames
   (persisted or not) queue behind it.

A session with nothing waiting takes the direct path: no queue, no task, no timer. While a
peer's socket is congested, acks wait: the publisher's window of unacknowledged frames is
the mesh's backpressure. But no peer may hold every publisher's acks: a link whose bytes an
ack has waited on for `stall_after` seconds (the mesh keep-alive window) is cut — a peer
that does not read, or a cable cut that TCP has not noticed — and tried again later with the
poison list's back-off; the ack then goes, the events having reached every other peer. A frame whose
events the store refused (full, gone) is still acknowledged — they were delivered and flooded —
after an ``Error(code="not-persisted")`` that says what was not kept. A store flush that fails
closes the session, so the client publishes again elsewhere.

Who calls what: the router hands every handled publish frame to `publish_handled`; the
peer links call `release` when bytes may have drained or a link went away; a timer polls
while acks wait on congested links (transports tell nobody when their buffers drain).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Final, Protocol

from aa.mesh.protocol import Error

from .seams import ClientPort

__all__ = ["Acknowledgements", "FloodMarks", "Durable", "ACK_POLL_INTERVAL"]

log = logging.getLogger("aa.router.acks")

#: Seconds between checks of held acknowledgements while a peer's socket is congested: the
#: added ack latency under load (deliveries are not delayed by it).
ACK_POLL_INTERVAL: Final = 0.002


class FloodMarks(Protocol):
    """The peer links, as the ack rule sees them (`aa.router.links.MeshService`)."""

    def flush(self) -> None:
        """Write every link's queued floods now."""

    def marks(self, *, all_links: bool) -> Sequence[tuple[Any, int]]:
        """(link, bytes written so far) for every link (or only those with bytes unsent)."""

    def unsent(self, link: Any, mark: int) -> bool:
        """Whether some of the first *mark* bytes written on *link* are still ours to send."""

    def cut(self, link: Any, reason: str) -> None:
        """Break *link* (it is tried again later): it held acknowledgements too long."""


class Durable(Protocol):
    """The persistent store, as the ack rule sees it (`aa.router.store.StoreService`)."""

    async def flush(self) -> None:
        """Return once everything queued so far is committed."""


class Acknowledgements:
    """The acknowledgement rule of one router (see the module docstring)."""

    def __init__(
        self, floods: FloodMarks, store: Durable | None = None, *, stall_after: float = 5.0
    ) -> None:
        self._floods = floods
        self._store = store
        self.stall_after = stall_after
        # Acks waiting for the links' bytes to leave: (session, seq, [(link, mark)], since),
        # in order.
        self._held: deque[tuple[ClientPort, int, Sequence[tuple[Any, int]], float]] = deque()
        # Per session: [seq, ready] of frames waiting for a store flush, in order.
        self._durable: dict[ClientPort, deque[list[Any]]] = {}
        self._poll: asyncio.TimerHandle | None = None

    def use_store(self, store: Durable | None) -> None:
        """The store persisted frames wait for (None: this router keeps none)."""
        self._store = store

    def publish_handled(
        self, session: ClientPort, seq: int, *, persisted: bool, refused: int = 0
    ) -> None:
        """Frame *seq* of *session* is dispatched; acknowledge it when the rule allows.
        *persisted*: an event of it asked to be kept here; *refused*: how many of its events
        the store refused (the client is told before the ack)."""
        if persisted and refused:
            session.send(
                Error(
                    code="not-persisted",
                    message=f"the store refused {refused} event(s) of this publish "
                    f"(store full or unavailable): they were delivered but are not kept",
                )
            )
        chain = self._durable.get(session)
        if chain is None:
            if not persisted or self._store is None:
                self._when_flooded(session, seq)
                return
            chain = self._durable[session] = deque()
        entry = [seq, not persisted]
        chain.append(entry)
        if persisted and self._store is not None:
            self._floods.flush()  # the floods go now; only the ack waits
            fut = asyncio.ensure_future(self._store.flush())
            fut.add_done_callback(lambda f: self._committed(session, entry, f))

    def _committed(self, session: ClientPort, entry: list[Any], fut: asyncio.Future[None]) -> None:
        chain = self._durable.get(session)
        if chain is None:
            return  # closed meanwhile
        if fut.cancelled() or fut.exception() is not None:
            exc = None if fut.cancelled() else fut.exception()
            log.error(
                "store flush failed; closing %s so it publishes again: %s", session.client_id, exc
            )
            del self._durable[session]
            session.fail("store-unavailable", f"the event store cannot write: {exc}")
            return
        entry[1] = True
        last = None
        while chain and chain[0][1]:
            last = chain.popleft()[0]
        if not chain:
            del self._durable[session]
        if last is not None:
            self._when_flooded(session, last)

    def _when_flooded(self, session: ClientPort, seq: int) -> None:
        floods = self._floods
        floods.flush()
        if self._held:
            marks = floods.marks(all_links=True)
        else:
            marks = floods.marks(all_links=False)
            if not marks:
                session.ack(seq)
                return
        self._held.append((session, seq, marks, time.monotonic()))
        self.release()
        self._arm_poll()

    def release(self, *, force: bool = False) -> None:
        """Send every held ack whose links' bytes have left (all of them with *force*)."""
        held = self._held
        unsent = self._floods.unsent
        while held:
            session, seq, marks, _ = held[0]
            if not force and any(unsent(link, mark) for link, mark in marks):
                return
            held.popleft()
            session.ack(seq)

    def _cut_stalled(self, now: float) -> None:
        """Cut every link the oldest held ack has waited on for `stall_after` seconds."""
        if not self._held:
            return
        _, _, marks, since = self._held[0]
        if now - since < self.stall_after:
            return
        unsent = self._floods.unsent
        for link, mark in marks:
            if unsent(link, mark):
                self._floods.cut(link, f"it has not taken our floods for {now - since:.1f} s")

    def _arm_poll(self) -> None:
        if self._held and self._poll is None:
            self._poll = asyncio.get_running_loop().call_later(ACK_POLL_INTERVAL, self._on_poll)

    def _on_poll(self) -> None:
        self._poll = None
        self.release()
        self._cut_stalled(time.monotonic())
        self._arm_poll()

    def waiting_for_store(self) -> bool:
        """Whether some ack waits for a store flush (shutdown flushes the store first)."""
        return bool(self._durable)

    def session_closed(self, session: ClientPort) -> None:
        self._durable.pop(session, None)

    def close(self) -> None:
        """The links are flushed and closed: release what waits on them, stop the timer."""
        self.release(force=True)
        if self._poll is not None:
            self._poll.cancel()
            self._poll = None
        self._durable.clear()
