"""A client's subscription: the pattern, its parameters, and where its events go."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aa.mesh import ConnectionClosed, Event, EventQueue, PatternError, PatternSpec
from aa.mesh.protocol import MissedAway, PatternRaised, Subscribe

if TYPE_CHECKING:
    from .aio import AsyncClient

__all__ = ["Subscription"]

log = logging.getLogger("aa.client")


class Subscription:
    """One subscription of an `AsyncClient`.

    Events go to the callback given to `subscribe`, or, without one, to whoever iterates::

        async for event in await client.subscribe("Temperature > 100"):
            ...

    `update(**params)` changes the pattern's parameters in place (parametric subscriptions);
    `aclose()` unsubscribes. If the router stops the pattern, iteration raises `PatternError`
    and `failure` holds it.
    """

    def __init__(
        self,
        client: AsyncClient,
        sub_id: int,
        spec: PatternSpec,
        params: dict[str, Any],
        callback: Callable[[Event], Any] | None,
        history: dict[str, Any] | None,
        *,
        overflow: str = "notify",
        on_missed: Callable[[int], None] | None = None,
        on_error: Callable[[PatternRaised], None] | None = None,
        on_missed_away: Callable[[MissedAway], None] | None = None,
    ) -> None:
        self.client = client
        #: "notify" (the router drops what this client cannot take, and says how many) or
        #: "disconnect" (it closes the connection instead; the client reconnects).
        self.overflow = overflow
        #: Events the router dropped for this subscription because the client read too slowly.
        self.missed = 0
        #: Where the router runs the pattern ("predicate", "worker", "sandbox"), and why it
        #: may never match (a name no event has had), as the router said at subscribe.
        self.tier: str | None = None
        self.warnings: tuple[str, ...] = ()
        self._on_missed = on_missed
        #: Runs of the pattern that raised (it goes on: for that event it did not match),
        #: as the router told, and its latest notice (`PatternRaised`: error, line, text,
        #: count since the notice before).
        self.errors = 0
        self.last_error: PatternRaised | None = None
        self._on_error = on_error
        #: Stored events its pattern matched while the client was away from the mesh (after
        #: a lost router), as the next router counted them (`MissedAway`): not delivered;
        #: a subscription with history gets them.
        self.missed_away = 0
        self._on_missed_away = on_missed_away
        self.id = sub_id
        self.pattern = spec
        self.params = params
        self.history = history
        self.failure: PatternError | None = None
        self.closed = False
        self._callback = callback
        self._async_callback = callback is not None and inspect.iscoroutinefunction(callback)
        self._queue: EventQueue | None = None
        if callback is None or self._async_callback:
            self._queue = EventQueue()
        self._consumer: asyncio.Task[None] | None = None
        #: Called once, in the loop's thread, when the subscription ends (the router stopped
        #: the pattern, the client unsubscribed or closed): how the blocking `Client`'s
        #: iterator, which queues events in its own thread, learns that no more will come.
        self.on_finish: Callable[[], None] | None = None
        if callback is not None and self._async_callback:
            self._consumer = asyncio.get_running_loop().create_task(self._consume(callback))

    # -- from the connection ----------------------------------------------------------------

    def deliver(self, event: Event) -> None:
        if self.closed:
            return
        if self._queue is None:
            callback = self._callback
            assert callback is not None  # without a queue, a plain callback takes each event
            try:
                callback(event)
            except Exception:
                log.exception("subscription %d: callback failed", self.id)
            return
        self._queue.put(event)

    def subscribe_message(
        self, *, with_history: bool = True, away: float | None = None
    ) -> Subscribe:
        """The frame that registers this subscription (again, after a fail-over: without
        its history, and *away*: seconds since the lost router was last heard from)."""
        return Subscribe(
            sub_id=self.id,
            pattern=self.pattern,
            params=self.params,
            history=self.history if with_history else None,
            overflow=self.overflow,
            away=away,
        )

    def missed_while_away(self, notice: MissedAway) -> None:
        """The router says how many stored events this pattern matched while the client was
        away. Counted in `missed_away`; `on_missed_away(notice)` is called, or a warning
        logged when there were any."""
        self.missed_away += notice.count
        if self._on_missed_away is not None:
            try:
                self._on_missed_away(notice)
            except Exception:
                log.exception("subscription %d: on_missed_away failed", self.id)
        elif notice.count:
            log.warning(
                "subscription %d: %s%d stored events matched while this client was away; "
                "subscribe with history to get them",
                self.id,
                "at least " if notice.more else "",
                notice.count,
            )

    def missed_events(self, count: int) -> None:
        """The router dropped *count* events of this subscription: the client read too
        slowly. Counted in `missed`; `on_missed(count)` is called, or a warning logged."""
        self.missed += count
        if self._on_missed is not None:
            try:
                self._on_missed(count)
            except Exception:
                log.exception("subscription %d: on_missed failed", self.id)
        else:
            log.warning(
                "subscription %d: the router dropped %d events this client did not read in time "
                "(%d in all)",
                self.id,
                count,
                self.missed,
            )

    def pattern_raised(self, notice: PatternRaised) -> None:
        """The router says the pattern raised (at most once a second, counting the rest).
        Counted in `errors`; `on_error(notice)` is called, or a warning logged."""
        self.errors += notice.count
        self.last_error = notice
        if self._on_error is not None:
            try:
                self._on_error(notice)
            except Exception:
                log.exception("subscription %d: on_error failed", self.id)
        else:
            log.warning("subscription %d: the pattern raised: %s", self.id, notice)

    def fail(self, error: PatternError) -> None:
        self.failure = error
        if (
            self._callback is not None and self.on_finish is None
        ):  # a callback's: nobody iterates to be told
            log.warning("subscription %d stopped by the router: %s", self.id, error)
        self.finish()

    def finish(self) -> None:
        self.closed = True
        if self._queue is not None:
            self._queue.close(self.failure)
        done, self.on_finish = self.on_finish, None
        if done is not None:
            done()

    @property
    def dropped(self) -> int:
        """Events dropped because the reader fell behind."""
        return self._queue.dropped if self._queue is not None else 0

    async def _consume(self, callback: Callable[[Event], Awaitable[Any]]) -> None:
        while True:
            try:
                event = await self.get()
            except (ConnectionClosed, PatternError):
                return
            try:
                await callback(event)
            except Exception:
                log.exception("subscription %d: callback failed", self.id)

    # -- the subscriber's API ---------------------------------------------------------------

    async def update(self, **params: Any) -> None:
        """Change named parameters of the pattern without re-subscribing; returns once the
        router applied them. No event is missed or delivered twice across the change."""
        await self.client.update_subscription(self, params)

    async def aclose(self) -> None:
        """Unsubscribe (idempotent)."""
        if not self.closed:
            self.finish()
            await self.client.remove_subscription(self)

    async def get(self) -> Event:
        """The next event. Raises `PatternError` if the router stopped the pattern,
        `ConnectionClosed` once unsubscribed or the client closed."""
        if self._queue is None:
            raise RuntimeError("this subscription delivers to its callback")
        return await self._queue.get()

    def __aiter__(self) -> AsyncIterator[Event]:
        if self._queue is None:
            raise RuntimeError("this subscription delivers to its callback")
        return self._queue

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<Subscription {self.id} {self.pattern.source!r}>"


Callback = Callable[[Event], Any] | Callable[[Event], Awaitable[Any]]
