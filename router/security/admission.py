"""Connections on the router's port: a deadline to say hello, and caps, so that silent
sockets cannot hold the router's file descriptors (uncut silent sockets up to the usual
1,024 open files would lock every client out).

The router tells `Admission` of each connection it accepts (`opened`); its end (its session's
`closed` future: closed, or handed to the links room) ends it here too. A connection is *pending*
until its first frame made it a client (hello) or a peer link (which leaves the router's sessions).
Then:

- a pending connection is closed after `HELLO_DEADLINE` seconds (TLS connections had a
  handshake guard already, `aa.router.security.listener`; this covers the plaintext port and
  the time after a handshake);
- at most `MAX_PENDING` connections are pending at once: past it the *oldest* is closed to
  make room, so a stranger's silent sockets are the ones that go — a real client says hello
  within milliseconds and is never the oldest;
- at most `max_per_address` connections from one address and `max_total` in all (the
  `SecurityConfig` fields; the total is also kept below the process's open-file limit, minus
  `FD_RESERVE` for the store, the log and the peer links): a connection past either is told
  why (``Error(code="busy")``) and closed.

Pure bookkeeping: the router's loop calls in, `now` is passed in, and closing is the
session's own `fail`. Accept errors the loop logs (EMFILE) are reduced to one line per
`ACCEPT_LOG_INTERVAL` (`RateLimited`), not one per attempt.

And memory: the bytes of frames received in part, across all connections (`PartialFrames`).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections import Counter
from typing import Any, Final, Protocol

__all__ = [
    "Admission",
    "RateLimited",
    "HELLO_DEADLINE",
    "MAX_PENDING",
    "MAX_CONNECTIONS",
    "MAX_CONNECTIONS_PER_ADDRESS",
    "FD_RESERVE",
    "ACCEPT_LOG_INTERVAL",
    "PartialFrames",
    "MAX_PARTIAL_TOTAL",
    "PARTIAL_BLAME",
]

log = logging.getLogger("aa.router.security")

#: Seconds a connection may stay without its first frame (hello, peer-hello, a tool's
#: question): a client says hello within milliseconds of connecting, even on a loaded
#: router; ten seconds leaves room for a slow link.
HELLO_DEADLINE: Final = 10.0
#: Connections without their first frame at once; past it the oldest is closed. A burst of
#: real clients connecting at once says hello within a loop turn or two; well below
#: the usual 1,024 open files of a process.
MAX_PENDING: Final = 512
#: Connections in all (clients, and callers yet to say hello): a router serves thousands of
#: clients; the open-file limit lowers it (`FD_RESERVE`).
MAX_CONNECTIONS: Final = 10_000
#: Connections from one address: a site behind one NAT address may hold many clients.
MAX_CONNECTIONS_PER_ADDRESS: Final = 1_000
#: Open files kept for what is not a client connection (store, log, peer links, the HTTP
#: endpoint's own sockets) when the total is capped by the process's open-file limit.
FD_RESERVE: Final = 128
#: Seconds between two sweeps for connections past their hello deadline.
SWEEP_EVERY: Final = 1.0
#: Seconds between two log lines about failing accepts (EMFILE: a line per attempt would
#: flood the log during an attack).
ACCEPT_LOG_INTERVAL: Final = 30.0


class Session(Protocol):
    """What admission needs of a connection (`aa.router.session.ClientSession`)."""

    client_id: str | None
    host: str
    #: Done when the connection closed or was handed to the links room.
    closed: asyncio.Future[None]

    def fail(self, code: str, message: str) -> None: ...


def open_files_limit() -> int | None:
    """The process's soft limit on open files (None: unlimited or unknown)."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else int(soft)


class Admission:
    """Caps and the hello deadline for the router's connections (see the module docstring)."""

    def __init__(
        self,
        *,
        max_total: int = MAX_CONNECTIONS,
        max_per_address: int = MAX_CONNECTIONS_PER_ADDRESS,
        max_pending: int = MAX_PENDING,
        hello_deadline: float = HELLO_DEADLINE,
        files: int | None = None,
    ) -> None:
        files = open_files_limit() if files is None else files
        if files is not None:
            max_total = max(1, min(max_total, files - FD_RESERVE))
        self.max_total = max_total
        self.max_per_address = max_per_address
        self.max_pending = min(max_pending, max_total)
        self.hello_deadline = hello_deadline
        self._open: set[Any] = set()
        self._per_address: Counter[str] = Counter()
        self._pending: dict[Any, float] = {}  # session -> when it connected, oldest first
        self.counters: Counter[str] = Counter()
        self._timer: asyncio.TimerHandle | None = None

    @property
    def pending(self) -> int:
        return len(self._pending)

    def opened(self, session: Session, now: float | None = None) -> bool:
        """A connection was accepted: False when it was refused (told why and closed)."""
        now = time.monotonic() if now is None else now
        self.sweep(now)
        host = session.host
        if len(self._open) >= self.max_total:
            self.counters["refused_total"] += 1
            session.fail(
                "busy", f"the router serves {self.max_total} connections, its limit; retry later"
            )
            return False
        if self._per_address[host] >= self.max_per_address:
            self.counters["refused_address"] += 1
            session.fail(
                "busy",
                f"{self.max_per_address} connections from {host} already, the limit per address",
            )
            return False
        while len(self._pending) >= self.max_pending:
            oldest = next(iter(self._pending))
            if oldest.client_id is not None:  # said hello since the last sweep: not pending
                del self._pending[oldest]
                continue
            self.counters["evicted_pending"] += 1
            self._drop(oldest)
            oldest.fail(
                "busy", "too many connections waiting to say hello; this one waited longest"
            )
        self._open.add(session)
        self._per_address[host] += 1
        self._pending[session] = now
        session.closed.add_done_callback(
            lambda _: self.closed(session)
        )  # closed, or a peer link now
        self._schedule()
        return True

    def _schedule(self) -> None:
        if self._timer is None and self._pending:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # called outside a loop (a unit test): sweep by hand
                return
            self._timer = loop.call_later(SWEEP_EVERY, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self.sweep(time.monotonic())
        self._schedule()

    def aclose(self) -> None:
        """Stop the sweeps (the router is closing)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def identified(self, session: Session) -> None:
        """*session* said hello (or became a peer link): no deadline any more."""
        self._pending.pop(session, None)

    def closed(self, session: Session) -> None:
        """*session* is gone (closed, or handed to the links room)."""
        self._drop(session)

    def sweep(self, now: float) -> None:
        """Close the pending connections past their deadline (call it every second or so)."""
        late = []
        for session, since in self._pending.items():  # at most `max_pending`
            if session.client_id is not None:
                late.append((session, False))
            elif now - since >= self.hello_deadline:
                late.append((session, True))
        for session, expired in late:
            if expired:
                self.counters["hello_timeout"] += 1
                self._drop(session)
                session.fail("hello-timeout", f"no hello within {self.hello_deadline:g} s")
            else:
                self._pending.pop(session, None)

    def _drop(self, session: Any) -> None:
        self._pending.pop(session, None)
        if session in self._open:
            self._open.discard(session)
            host = session.host
            self._per_address[host] -= 1
            if self._per_address[host] <= 0:
                del self._per_address[host]


class RateLimited(logging.Filter):
    """Lets one record in *interval* seconds through among those whose message holds one of
    *needles* (and every other record); says how many were held back."""

    def __init__(self, needles: tuple[str, ...], interval: float = ACCEPT_LOG_INTERVAL) -> None:
        super().__init__()
        self.needles = needles
        self.interval = interval
        self._last = -interval
        self._held = 0

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:
            return True
        if not any(n in text for n in self.needles):
            return True
        now = time.monotonic()
        if now - self._last < self.interval:
            self._held += 1
            return False
        if self._held:
            record.msg = f"{record.msg} ({self._held} more like it in the last {self.interval:g} s)"
        self._last, self._held = now, 0
        return True


#: Bytes of partly received frames held for all clients together (the frame cap bounds one
#: connection, 16 MiB: twenty sending 15 MiB each and then nothing held 300 MiB). Past it, a
#: connection holding ≥ `PARTIAL_BLAME` bytes of an unfinished frame is closed ("busy").
MAX_PARTIAL_TOTAL: Final = 64 * 1024 * 1024
PARTIAL_BLAME: Final = 1024 * 1024


class PartialFrames:
    """The bytes of unfinished frames each connection holds, and their total."""

    def __init__(self, limit: int = MAX_PARTIAL_TOTAL) -> None:
        self.limit = limit
        self.total = 0
        self._held: dict[object, int] = {}

    def hold(self, owner: object, n: int) -> bool:
        """*owner* now holds *n* bytes; False when it must let go (over the total, holding much)."""
        before = self._held.pop(owner, 0)
        self.total += n - before
        if n:
            self._held[owner] = n
        return not (self.total > self.limit and n >= PARTIAL_BLAME)
