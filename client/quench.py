"""Quenching for publishers (Å §4.4): hear when someone in the mesh wants your events.

    q = await client.quench({"SnowDepthSensor": True, "SnowDepth": 50}, on_change)
    await q.wait_interested()           # returns once some subscription matches the prototype
    while q.interested:
        await client.publish({"SnowDepthSensor": True, "SnowDepth": measure()})
        ...

`on_change(sub_id, router_id, interested)` is called once per subscription that starts
(True) or stops (False) matching the prototype, anywhere in the mesh; `sub_id` is opaque and
unique within its router. A coroutine function works too (called one change at a time).
Under interest routing (the mesh's default) a subscription on the publisher's own router is
told by id; another router is told as one line with `sub_id` ``"*"`` while its interest
summary says its subscriptions may want such events (it errs toward "someone listens").
`q.interested` is True while any subscription matches; `q.interest` holds them all as
(router id, subscription id).

A registration lasts until `aclose()`, or the client closes. After a fail-over the client
registers it again on its new router; the subscriptions it knew are kept until the mesh
confirms them, and those not confirmed within `STALE_GRACE` seconds are reported gone.

Subscribers help quenching by declaring the value names their pattern needs
(``subscribe("SnowDepth == 80", needs=["SnowDepth"])``): see `aa.mesh.protocol.quench_messages`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Final, TypeVar

from aa.mesh import AaTimeout, ConnectionClosed, RemoteError, check_values
from aa.mesh.protocol import Error, Message, Quenched, QuenchNotice, Unquench
from aa.mesh.protocol import Quench as QuenchRequest

if TYPE_CHECKING:
    from .aio import AsyncClient
    from .config import ClientConfig

__all__ = [
    "AsyncQuench",
    "Quench",
    "QuenchClient",
    "BlockingQuenchClient",
    "QuenchCallback",
    "STALE_GRACE",
]

log = logging.getLogger("aa.client")

T = TypeVar("T")

#: Seconds after a reconnection within which the mesh must confirm a subscription the client
#: knew of before it is reported gone. Every router answers a registration at once, so this
#: only has to cover a slow mesh.
STALE_GRACE: Final = 5.0

#: ``callback(sub_id, router_id, interested)``, plain or a coroutine function.
QuenchCallback = Callable[[str, str, bool], Any] | Callable[[str, str, bool], Awaitable[Any]]


class AsyncQuench:
    """One quench registration of an `AsyncClient`; see the module docstring."""

    def __init__(
        self,
        client: QuenchClient,
        reg: int,
        values: dict[str, Any],
        type: str | None,
        mentioned_only: bool,
        callback: QuenchCallback | None,
    ) -> None:
        self.client = client
        self.id = reg
        self.prototype = values
        self.type = type
        self.mentioned_only = mentioned_only
        self.closed = False
        #: Why the router refused a re-registration, if it did.
        self.failure: RemoteError | None = None
        self._callback = callback
        self._interest: set[tuple[str, str]] = set()
        self._stale: set[tuple[str, str]] = set()
        self._stale_timer: asyncio.TimerHandle | None = None
        self._yes = asyncio.Event()
        self._no = asyncio.Event()
        self._no.set()
        self._queue: asyncio.Queue[tuple[str, str, bool]] | None = None
        self._consumer: asyncio.Task[None] | None = None
        if callback is not None and inspect.iscoroutinefunction(callback):
            self._queue = asyncio.Queue()
            self._consumer = asyncio.get_running_loop().create_task(self._consume(callback))

    # -- the publisher's API ----------------------------------------------------------------

    @property
    def interested(self) -> bool:
        """Whether any subscription in the mesh matches the prototype now."""
        return bool(self._interest)

    @property
    def interest(self) -> frozenset[tuple[str, str]]:
        """The matching subscriptions, as (router id, subscription id)."""
        return frozenset(self._interest)

    async def wait_interested(self, timeout: float | None = None) -> None:
        """Return once someone is interested (at once if someone is). Raises `AaTimeout`
        after *timeout* seconds, `ConnectionClosed` if the registration is closed."""
        await self._wait(self._yes, timeout, "nobody became interested")

    async def wait_uninterested(self, timeout: float | None = None) -> None:
        """Return once nobody is interested (at once if nobody is). Raises `AaTimeout`."""
        await self._wait(self._no, timeout, "interest did not go")

    async def _wait(self, flag: asyncio.Event, timeout: float | None, what: str) -> None:
        if self.closed and not flag.is_set():
            raise ConnectionClosed("quench registration is closed")
        try:
            async with asyncio.timeout(timeout):
                await flag.wait()
        except TimeoutError:
            raise AaTimeout(f"{what} within {timeout} s") from None
        if self.closed and flag is self._yes and not self._interest:
            raise ConnectionClosed("quench registration is closed")

    async def aclose(self) -> None:
        """Unregister, mesh-wide (idempotent)."""
        if not self.closed:
            self.finish()
            await self.client.remove_quench(self)

    async def __aenter__(self) -> AsyncQuench:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<AsyncQuench {self.id} {self.prototype!r} interested={self.interested}>"

    # -- from the client --------------------------------------------------------------------

    def apply(self, changes: tuple[tuple[str, str, bool], ...]) -> None:
        if self.closed:
            return
        for router_id, sub_id, interested in changes:
            key = (router_id, sub_id)
            if interested:
                if key in self._stale:
                    self._stale.discard(key)  # confirmed after a reconnection: no news
                elif key not in self._interest:
                    self._interest.add(key)
                    self._tell(sub_id, router_id, True)
            elif key in self._interest:
                self._interest.discard(key)
                self._stale.discard(key)
                self._tell(sub_id, router_id, False)
        self._flags()

    def reconnected(self, grace: float) -> None:
        """Registered again on a (new) router: what we knew must be confirmed in *grace* s."""
        self._stale = set(self._interest)
        if self._stale_timer is not None:
            self._stale_timer.cancel()
        if self._stale:
            self._stale_timer = asyncio.get_running_loop().call_later(grace, self._drop_stale)

    def _drop_stale(self) -> None:
        self._stale_timer = None
        stale, self._stale = self._stale, set()
        self.apply(tuple((r, s, False) for r, s in sorted(stale)))

    def fail(self, error: RemoteError) -> None:
        self.failure = error
        log.warning("quench registration %d refused by the router: %s", self.id, error)
        self.finish()

    def finish(self) -> None:
        self.closed = True
        if self._stale_timer is not None:
            self._stale_timer.cancel()
            self._stale_timer = None
        self._yes.set()  # wake waiters: they raise ConnectionClosed
        if self._consumer is not None:
            self._consumer.cancel()

    def _flags(self) -> None:
        if self._interest:
            self._yes.set()
            self._no.clear()
        else:
            self._no.set()
            if not self.closed:
                self._yes.clear()

    def _tell(self, sub_id: str, router_id: str, interested: bool) -> None:
        if self._callback is None:
            return
        if self._queue is not None:
            self._queue.put_nowait((sub_id, router_id, interested))
            return
        try:
            self._callback(sub_id, router_id, interested)
        except Exception:
            log.exception("quench %d: callback failed", self.id)

    async def _consume(self, callback: Callable[[str, str, bool], Awaitable[Any]]) -> None:
        assert self._queue is not None
        while True:
            change = await self._queue.get()
            try:
                await callback(*change)
            except Exception:
                log.exception("quench %d: callback failed", self.id)


class QuenchClient:
    """Quenching for `AsyncClient` (a mixin: it uses the client's link and ids)."""

    #: Seconds the mesh has to confirm known interest after a reconnection.
    quench_stale_grace: float = STALE_GRACE

    if TYPE_CHECKING:  # what it uses of AsyncClient
        config: ClientConfig
        _next_sub: int
        _closing: bool

        @property
        def connected(self) -> bool: ...

        async def wait_connected(self, timeout: float | None = None) -> None: ...

        def _send(self, msg: Message) -> None: ...

    def _init_quench(self) -> None:
        self._quenches: dict[int, AsyncQuench] = {}
        self._quench_waiters: dict[int, asyncio.Future[None]] = {}

    async def quench(
        self,
        prototype: Mapping[str, Any],
        callback: QuenchCallback | None = None,
        *,
        type: str | None = None,
        mentioned_only: bool = False,
    ) -> AsyncQuench:
        """Register an event *prototype* (an example of the events you would publish) and hear
        whenever a subscription anywhere in the mesh starts or stops matching it; returns once
        the router has taken it (`AsyncQuench`). With *mentioned_only*, catch-all patterns
        that name none of the prototype's values (``True``) do not count.

        >>> # q = await client.quench({"StockSymbol": "ABB", "Price": 1.0}, type="quote")
        >>> # await q.wait_interested(); ...; await q.aclose()

        Raises `InvalidValue` for a prototype outside the value model, `RemoteError` (code
        ``limit``) when the router refuses more registrations, `AaTimeout` if no router
        answers in `ClientConfig.request_timeout`.
        """
        values = dict(prototype)
        check_values(values, "prototype")
        if self._closing:
            raise ConnectionClosed("client is closed")
        reg = self._next_sub  # shared with sub_ids: an Error's ref names one request only
        self._next_sub += 1
        q = AsyncQuench(self, reg, values, type, mentioned_only, callback)
        self._quenches[reg] = q
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._quench_waiters[reg] = fut
        try:
            await self.wait_connected(self.config.request_timeout)
            self._send(_request(q))  # sent again on each reconnection: the answer may come late
            async with asyncio.timeout(self.config.request_timeout):
                await fut
        except BaseException as exc:
            self._quenches.pop(reg, None)
            q.finish()
            if isinstance(exc, TimeoutError) and not isinstance(exc, AaTimeout):
                raise AaTimeout("router did not answer 'quench' in time") from None
            raise
        finally:
            self._quench_waiters.pop(reg, None)
        return q

    async def remove_quench(self, q: AsyncQuench) -> None:
        if self._quenches.pop(q.id, None) is not None and self.connected:
            self._send(Unquench(reg=q.id))

    def _quench_connected(self) -> None:
        for q in list(self._quenches.values()):
            q.reconnected(self.quench_stale_grace)
            self._send(_request(q))

    def _quench_answer(self, msg: Quenched | QuenchNotice) -> None:
        match msg:
            case Quenched():
                fut = self._quench_waiters.get(msg.reg)
                if fut is not None and not fut.done():
                    fut.set_result(None)
            case QuenchNotice():
                q = self._quenches.get(msg.reg)
                if q is not None:
                    q.apply(msg.changes)

    def _quench_error(self, msg: Error) -> bool:
        """Route a refusal of a quench registration; False if it is not one."""
        if msg.ref is None or msg.ref not in self._quenches:
            return False
        error = RemoteError(msg.message, code=msg.code)
        fut = self._quench_waiters.get(msg.ref)
        if fut is not None and not fut.done():
            fut.set_exception(error)
        else:
            self._quenches.pop(msg.ref).fail(error)
        return True

    def _quench_close(self) -> None:
        for q in self._quenches.values():
            q.finish()
        self._quenches.clear()


def _request(q: AsyncQuench) -> QuenchRequest:
    return QuenchRequest(reg=q.id, values=q.prototype, type=q.type, mentioned_only=q.mentioned_only)


class Quench:
    """A blocking client's quench registration (`Client.quench`). The callback runs in the
    client's thread."""

    def __init__(self, client: BlockingQuenchClient, inner: AsyncQuench) -> None:
        self._client = client
        self._inner = inner
        self.id = inner.id
        self.prototype = inner.prototype

    @property
    def interested(self) -> bool:
        return self._inner.interested

    @property
    def interest(self) -> frozenset[tuple[str, str]]:
        return self._inner.interest

    def wait_interested(self, timeout: float | None = None) -> None:
        """Block until someone is interested. Raises `AaTimeout` after *timeout* seconds."""
        self._client._call(self._inner.wait_interested(timeout))

    def wait_uninterested(self, timeout: float | None = None) -> None:
        self._client._call(self._inner.wait_uninterested(timeout))

    def close(self) -> None:
        self._client._call(self._inner.aclose())

    def __enter__(self) -> Quench:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BlockingQuenchClient:
    """`quench` for the blocking `Client` (a mixin over its `AsyncClient`)."""

    _async: AsyncClient

    if TYPE_CHECKING:  # the blocking client's

        def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T: ...

    def quench(
        self,
        prototype: Mapping[str, Any],
        callback: Callable[[str, str, bool], Any] | None = None,
        *,
        type: str | None = None,
        mentioned_only: bool = False,
    ) -> Quench:
        """Blocking `AsyncClient.quench`; returns a `Quench`."""
        inner = self._call(
            self._async.quench(prototype, callback, type=type, mentioned_only=mentioned_only)
        )
        return Quench(self, inner)
