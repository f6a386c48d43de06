"""In-process subscriptions: how a program that embeds a router (or the HTTP endpoint)
subscribes without a socket."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from aa.mesh import ConnectionClosed, Event, EventQueue, PatternError

if TYPE_CHECKING:
    from .seams import SubscriptionHost

__all__ = ["LocalSubscription"]

log = logging.getLogger("aa.router.local")


class LocalSubscription:
    """A subscription held inside the router's process.

    With a callback, the callback is called for each event, in the router's event loop (keep
    it quick). Without one, iterate: ``async for event in sub``. Close with `close()`.
    """

    def __init__(
        self, host: SubscriptionHost, callback: Callable[[Event], Any] | None, *, client_id: str
    ) -> None:
        self._host = host
        self._callback = callback
        self._queue = None if callback else EventQueue()
        self.closed = False
        #: Why the router stopped this subscription's pattern, if it did.
        self.failure: PatternError | None = None
        self.client_id = client_id
        #: Live events held while this subscription's history is replayed
        # (`aa.router.store.HistoryReplay`).
        self.held: Any = None
        #: Runs of the pattern that raised, the latest notice of them, and who to tell
        #: (`aa.router.patterns.ErrorNotice`: error, line, text, count).
        self.errors = 0
        self.last_error: Any = None
        self.on_error: Callable[[Any], Any] | None = None
        #: What its pattern may see, when it acts for a user (`Router.subscribe`'s *scope*):
        #: the type patterns, and the test of them history replay applies; None: everything.
        self.scope: tuple[str, ...] | None = None
        self.receives: Callable[[str | None], bool] | None = None

    # -- called by the router ---------------------------------------------------------------

    @property
    def active(self) -> bool:
        return not self.closed

    def deliver(self, event: Event) -> None:
        if self.held is not None:
            self.held.append(event)
            return
        self.deliver_now(event)

    def deliver_now(self, event: Event) -> None:
        """Deliver past any hold (history replay)."""
        if self._callback is not None:
            try:
                self._callback(event)
            except Exception:  # a subscriber's bug must not stop dispatch for anyone else
                log.exception("local subscription callback failed")
            return
        assert self._queue is not None
        self._queue.put(event)

    def pattern_erred(self, notice: Any) -> None:
        """The pattern raised (`aa.router.patterns.ErrorNotice`): counted in `errors`, the
        latest kept in `last_error`, and given to `on_error` if there is one."""
        self.errors += notice.count
        self.last_error = notice
        if self.on_error is not None:
            try:
                self.on_error(notice)
            except Exception:
                log.exception("local subscription on_error failed")

    def pattern_failed(self, code: str, message: str) -> None:
        self.failure = PatternError(message, code=code)
        self._finish()

    # -- the subscriber's side --------------------------------------------------------------

    def update(self, **params: Any) -> None:
        """Change named parameters of the pattern; takes effect for the next event."""
        if self.closed:
            raise ConnectionClosed("subscription is closed")
        self._host.update_subscription(self, params)

    def close(self) -> None:
        if not self.closed:
            self._host.remove_subscription(self)
            self._finish()

    def _finish(self) -> None:
        self.closed = True
        if self._queue is not None:
            self._queue.close(self.failure)

    @property
    def dropped(self) -> int:
        """Events dropped because the reader fell behind."""
        return self._queue.dropped if self._queue is not None else 0

    async def get(self) -> Event:
        """The next event; raises `ConnectionClosed` (or the `PatternError`) once closed."""
        if self._queue is None:
            raise RuntimeError("this subscription delivers to its callback")
        return await self._queue.get()

    def __aiter__(self) -> AsyncIterator[Event]:
        if self._queue is None:
            raise RuntimeError("this subscription delivers to its callback")
        return self._queue

    def __enter__(self) -> LocalSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
