"""`Client`: the blocking twin of `AsyncClient`, for programs without asyncio.

    from aa.client import Client
    c = Client("127.0.0.1:7447")
    c.publish({"Temperature": 101}, type="reading")

An event loop runs the `AsyncClient` in a background thread. Callbacks are called in that
thread, in order; keep them quick or hand work to your own threads.

A client that is never closed still sends what it was given: when the program exits, each
open client waits (up to its *exit_timeout*, `EXIT_TIMEOUT` seconds by default) until a
router acknowledged its events, then closes; what it could not send is reported on stderr.
The thread is a daemon, so nothing else keeps the program alive.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import functools
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Final, TypeVar

from aa.mesh import AaTimeout, ConnectionClosed, Event, PatternError, PatternSpec, RemoteError
from aa.mesh.protocol import MissedAway, PatternRaised

from .aio import AsyncClient
from .caching import BlockingCacheClient
from .config import ClientConfig
from .outbox import packed_publish
from .quench import BlockingQuenchClient
from .subscription import Subscription as AsyncSubscription

__all__ = ["Client", "Subscription", "EXIT_TIMEOUT"]

T = TypeVar("T")

log = logging.getLogger("aa.client")

#: Seconds a program's exit waits, per client, for a router to acknowledge what the client
#: was given: long enough for a reconnection (the first retry comes after a second), short
#: enough that a program without a router still ends promptly.
EXIT_TIMEOUT: Final = 5.0

#: Seconds `close()` waits beyond its own timeout for the client's thread to finish closing
#: before it leaves the thread (a daemon) behind: closing never hangs the program.
CLOSE_GRACE: Final = 2.0

#: Clients not closed yet; the exit handler flushes and closes them (strong references: an
#: open client's thread lives anyway, and `Client(...).publish(...)` keeps no reference).
_open: set[Client] = set()
_open_lock = threading.Lock()


def _at_exit() -> None:
    with _open_lock:
        clients = list(_open)
    try:
        for client in clients:
            client.exit_now()
    except KeyboardInterrupt:  # Ctrl-C while the exit waits: the user chose not to wait
        pass


atexit.register(_at_exit)


class Subscription:
    """A blocking client's subscription: iterate it, `update(**params)`, `close()`."""

    def __init__(
        self,
        client: Client,
        inner: AsyncSubscription,
        q: queue.SimpleQueue[Event | None] | None,
    ) -> None:
        self._client = client
        self._inner = inner
        self._queue = q
        self.id = inner.id
        self.pattern = inner.pattern

    @property
    def params(self) -> dict[str, Any]:
        return dict(self._inner.params)

    @property
    def failure(self) -> PatternError | None:
        return self._inner.failure

    @property
    def tier(self) -> str | None:
        """Where the router runs the pattern: "predicate", "worker" or "sandbox"."""
        return self._inner.tier

    @property
    def warnings(self) -> tuple[str, ...]:
        """Why the pattern may never match, as the router said at subscribe."""
        return self._inner.warnings

    @property
    def errors(self) -> int:
        """Runs of the pattern that raised, as the router told (it goes on running)."""
        return self._inner.errors

    @property
    def last_error(self) -> PatternRaised | None:
        """The router's latest notice of the pattern raising, or None."""
        return self._inner.last_error

    @property
    def missed_away(self) -> int:
        """Stored events the pattern matched while the client was away, as routers told."""
        return self._inner.missed_away

    def update(self, **params: Any) -> None:
        """Change the pattern's parameters; returns once the router applied them."""
        self._client._call(self._inner.update(**params))

    def close(self) -> None:
        self._client._call(self._inner.aclose())
        if self._queue is not None:
            self._queue.put(None)

    def get(self, timeout: float | None = None) -> Event:
        """The next event. Raises `AaTimeout` after *timeout* s, `PatternError` if the router
        stopped the pattern, `ConnectionClosed` once closed."""
        if self._queue is None:
            raise RuntimeError("this subscription delivers to its callback")
        try:
            event = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise AaTimeout(f"no event within {timeout} s") from None
        if event is None:
            self._queue.put(None)
            raise self._inner.failure or ConnectionClosed("subscription is closed")
        return event

    def __iter__(self) -> Iterator[Event]:
        while True:
            try:
                yield self.get()
            except ConnectionClosed:
                return

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Client(BlockingQuenchClient, BlockingCacheClient):
    """A blocking client of the mesh; see the module docstring. Connects on construction
    (raises `AaTimeout` if no router answers). Cache requests (`cached`, `cache_register`,
    `cache_fetch`, ...) block like the rest (`aa.client.caching`)."""

    def __init__(
        self,
        routers: str | Sequence[str] | None = None,
        *,
        config: ClientConfig | None = None,
        client_id: str | None = None,
        name: str | None = None,
        timeout: float | None = None,
        exit_timeout: float = EXIT_TIMEOUT,
        on_error: Callable[[RemoteError], None] | None = None,
        on_disconnect: Callable[[str], None] | None = None,
        on_reconnect: Callable[[str], None] | None = None,
    ) -> None:
        """*exit_timeout*: seconds the program's exit waits for a router to acknowledge what
        this client was given, if it was not closed (0: do not wait; see the module docstring).
        *on_error*: called (in the client's thread) with what a router says went wrong outside
        any request, such as a persisted event it did not keep; without it, logged.
        *on_disconnect*, *on_reconnect*: called (in the client's thread) with the router's
        endpoint when the connection is lost, and when it is back (subscriptions registered
        again); without them, logged."""
        self.exit_timeout = exit_timeout
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="aa-client", daemon=True
        )
        self._thread.start()
        self._pending: collections.deque[bytes] = collections.deque()
        self._wakeup = False
        self._closed = False

        async def make() -> AsyncClient:
            return AsyncClient(
                routers,
                config=config,
                client_id=client_id,
                name=name,
                on_error=on_error,
                on_disconnect=on_disconnect,
                on_reconnect=on_reconnect,
            )

        self._async = self._call(make())
        try:
            self._call(self._async.connect(timeout))
        except BaseException:
            try:  # end the connecting task before the loop: no "Task was destroyed" at exit
                self._call(self._async.aclose(0), timeout=5)
            except Exception:
                pass
            self._stop_loop()
            raise
        with _open_lock:
            _open.add(self)

    @property
    def client_id(self) -> str:
        return self._async.client_id

    @property
    def connected(self) -> bool:
        return self._async.connected

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if self._closed:
            coro.close()
            raise ConnectionClosed("client is closed")
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except TimeoutError:
            fut.cancel()  # given up: the loop cancels it when it gets to it
            raise

    def publish(
        self,
        values: Mapping[str, Any],
        *,
        type: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> str:
        """Queue an event for publishing and return its id at once. Raises `InvalidValue`
        for values outside the model. `flush()` waits for the routers' acknowledgement."""
        if self._closed:
            raise ConnectionClosed("client is closed")
        eid = self._async._ids()
        # Checked and packed here, in the caller's thread: the outbox keeps the bytes.
        self._pending.append(packed_publish(values, type, meta, eid))
        # Hand over through a deque and wake the loop only when it is idle: one wake-up
        # per burst instead of one self-pipe write per event.
        if not self._wakeup:
            self._wakeup = True
            self._loop.call_soon_threadsafe(self._drain)
        return eid

    def _drain(self) -> None:
        self._wakeup = False
        pending = self._pending
        try:
            self._async._publish_packed(pending)  # as many as the outbox has room for
        except ConnectionClosed:
            pass
        if pending:
            self._loop.call_later(0.01, self._drain)  # outbox full: try again shortly
            self._wakeup = True

    def flush(self, timeout: float | None = None) -> None:
        """Wait until a router acknowledged every event published so far."""

        async def go() -> None:
            while True:
                self._drain()
                if not self._pending:
                    break
                await self._async.wait_for_room()  # outbox full: wait for an acknowledgement
            await self._async.flush(timeout)

        try:  # bounded here too: the client's thread may be stuck in a callback
            self._call(go(), None if timeout is None else timeout + CLOSE_GRACE)
        except TimeoutError:
            raise AaTimeout(f"events not acknowledged within {timeout} s") from None

    def subscribe(
        self,
        pattern: str | PatternSpec,
        callback: Callable[[Event], Any] | None = None,
        *,
        params: Mapping[str, Any] | None = None,
        format: str = "expr",
        kernel: str = "python",
        history: Mapping[str, Any] | None = None,
        needs: Sequence[str] = (),
        on_error: Callable[[PatternRaised], None] | None = None,
        on_missed_away: Callable[[MissedAway], None] | None = None,
    ) -> Subscription:
        """Register a pattern. With *callback*, it is called (in the client's thread) for each
        event; without, iterate the returned subscription. *on_error*: called (in the client's
        thread) with a `PatternRaised` when the pattern raises while running, at most once a
        second (`Subscription.errors` counts them). *on_missed_away*: called (in the client's
        thread) with a `MissedAway` after a lost router: the stored events the pattern
        matched while away (`AsyncClient.subscribe`). Raises `PatternError`."""
        q: queue.SimpleQueue[Event | None] | None = None
        cb = callback
        if cb is None:
            # SimpleQueue, not Queue: a KeyboardInterrupt in the reader's `get` can leave a
            # Queue's Python-level lock held, and the client's thread, putting the end into
            # it at close, would wait on it; a SimpleQueue has no such lock.
            q = queue.SimpleQueue()
            cb = q.put

        async def go() -> AsyncSubscription:
            inner = await self._async.subscribe(
                pattern,
                cb,
                params=params,
                format=format,
                kernel=kernel,
                history=history,
                needs=needs,
                on_error=on_error,
                on_missed_away=on_missed_away,
            )
            if q is not None:  # its end (the router stopping the pattern too) ends the iteration
                inner.on_finish = functools.partial(q.put, None)
                if inner.closed:
                    q.put(None)
            return inner

        return Subscription(self, self._call(go()), q)

    def mesh_info(self, timeout: float | None = None) -> dict[str, Any]:
        """The mesh as the connected router knows it (see `AsyncClient.mesh_info`)."""
        return self._call(self._async.mesh_info(timeout))

    def forget_router(self, router: str, timeout: float | None = None) -> dict[str, Any]:
        """Make the connected router forget *router* (see `AsyncClient.forget_router`)."""
        return self._call(self._async.forget_router(router, timeout))

    def unsubscribe(self, sub: Subscription) -> None:
        sub.close()

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued (waiting up to *timeout* s), then close. Idempotent."""
        if self._closed:
            return
        try:
            self.flush(timeout)
        except Exception:
            pass
        try:
            self._call(self._async.aclose(timeout), timeout=timeout + CLOSE_GRACE)
        except TimeoutError:  # the client's thread is stuck (a callback that blocks): leave it
            log.warning(
                "client %s: not closed within %.1f s; leaving its thread",
                self.client_id,
                timeout + CLOSE_GRACE,
            )
        finally:
            self._stop_loop()

    def exit_now(self) -> None:
        """At the program's exit: send what is queued (up to `exit_timeout`), say on stderr
        what could not be sent, close."""
        if self._closed:
            return
        unsent = 0
        connected = self._async.connected
        started = time.monotonic()
        try:
            self.flush(self.exit_timeout)
        except Exception:
            unsent = len(self._pending) + self._async.pending
        left = max(0.0, self.exit_timeout - (time.monotonic() - started))
        quiet = logging.getLogger("aa.client")
        was = quiet.disabled
        quiet.disabled = bool(unsent)  # its "closing with N unacknowledged" would say it twice
        try:
            self.close(timeout=0.0 if unsent else min(left, 1.0))
        except Exception:
            self._stop_loop()
        finally:
            quiet.disabled = was
        if unsent:
            where = ", ".join(self._async.config.routers) or "a discovered address"
            why = (
                f"the router at {where} did not acknowledge them"
                if connected
                else f"is a router running at {where}?"
            )
            print(
                f"aa.client: {unsent} event(s) not acknowledged by a router within "
                f"{self.exit_timeout:g} s "
                f"of the program's exit; they are lost ({why})",
                file=sys.stderr,
                flush=True,
            )

    def _stop_loop(self) -> None:
        self._closed = True
        with _open_lock:
            _open.discard(self)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=CLOSE_GRACE)
        if not self._loop.is_running():
            self._loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
