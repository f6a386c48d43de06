"""History on subscribe (Å §4.5): a new subscription that asks for it first receives the stored
events its pattern matches, oldest first, marked historical, then the live stream — with no
gap and no duplicate between the two.

How the seam is closed (the part that is easy to get wrong)::

    subscribe ──► registered in the pattern engine ──► on_subscribe: hold = []   (same
                  (live events match from here on)                               loop turn)
    replay task:  store.iterate(matches)  ─► deliver each, marked historical, ids noted
                  while it runs, dispatch puts this subscriber's live events in `hold`
    end:          hold released in order, skipping ids already sent, then live as usual

The hold starts in the same turn of the event loop as the registration, so no live event
falls between the two. The store's query sees every event put before it started, written or
still queued, and rows committed while it pages through are read too; an event therefore
reaches the subscriber through the history, the hold, or both — and "both" is removed by id.
A live event that is not stored (not persisted) only ever comes through the hold.

Matching uses `PatternEngine.matches_prototype(key, event)`: pure evaluation with the
subscriber's own pattern and params (a script on a copy of its state), so replay changes no
pattern state. A predicate-tier pattern (`aa.router.patterns.index`) is evaluated there by the
predicate tier itself — its compiled checks, no pattern code, no sandbox — and with the params
in force when each stored event is matched (`tests/test_patterns_index_paths.py` holds both). A
script subscriber gets the stored events its script would forward something for, as they were
stored (not what the script derives).

Bounds: the hold keeps at most `MAX_HELD` live events; past that the oldest are dropped and
counted (`history_held_dropped`), as any subscriber queue does when its reader stalls. Replay is
paced by the client's socket: it waits while the transport's buffer is above its high-water mark
instead of letting the router's memory fill. A replay in progress holds a read-ahead chunk, a
frame and the ids it sent (megabytes for a big history), so at most `MAX_REPLAYS_PER_CLIENT` run
at once per connection and `MAX_REPLAYS` in all (clients that never read, each with many
subscribes asking for history, would otherwise hold gigabytes). Others wait their turn, holding
only their `Hold`; a replay whose connection closed, or whose subscription ended, stops at its
next frame or as soon as its turn comes, and frees everything.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Hashable, Mapping
from typing import TYPE_CHECKING, Any, Final, cast

from aa.mesh import META_HISTORICAL, Event, StoreError, UsageError

from ..seams import Dispatch, Subscriber
from .answers import check_since

if TYPE_CHECKING:
    from .service import StoreService

__all__ = ["HistoryReplay", "Hold", "check_history", "MAX_HELD", "REPLAY_CHUNK"]

log = logging.getLogger("aa.router.store")

#: Live events held for one subscriber while its history is replayed; past it the oldest go
#: (and are counted). 100,000 typical events are ~50 MiB: seconds of a busy mesh.
MAX_HELD: Final = 100_000
#: Stored events read per query chunk (one database round trip).
REPLAY_CHUNK: Final = 5_000
#: Historical events per `Deliver` frame: small enough that the client decodes one while
#: the next is on its way, large enough that framing costs vanish.
REPLAY_FRAME: Final = 1_000
#: Replays running at once for one connection (the rest wait their turn, in order).
MAX_REPLAYS_PER_CLIENT: Final = 2
#: Replays running at once in all: each holds up to two chunks of `REPLAY_CHUNK` events.
MAX_REPLAYS: Final = 32
#: Keys a subscriber's history request may hold.
HISTORY_KEYS: Final = frozenset({"since"})


def check_history(history: Mapping[str, Any] | None) -> None:
    """Raise `UsageError` unless *history* is None or ``{"since": aware datetime | None}``."""
    if history is None:
        return
    try:
        if not isinstance(history, Mapping):
            raise UsageError(
                'history must be a map such as {"since": None}, or None for no history'
            )
        unknown = set(history) - HISTORY_KEYS
        if unknown:
            raise UsageError(
                f"history takes only 'since', not {', '.join(sorted(map(str, unknown)))}"
            )
        check_since(history.get("since"))
    except UsageError as exc:
        exc.code = "bad-history"  # type: ignore[attr-defined]  # the code of the refusal frame
        raise


class HistoryReplay:
    """Replays stored events to subscriptions that ask for history."""

    def __init__(
        self,
        storage: StoreService,
        *,
        matches_prototype: Callable[[Hashable, Event], bool],
        dispatch: Dispatch,
        counters: Counter[str],
        select: Callable[[Hashable, list[Event]], Awaitable[list[Event]]] | None = None,
    ) -> None:
        self.storage = storage
        self._matches = matches_prototype
        #: `PatternEngine.select`: a chunk at once, a worker's pattern dry-run in its worker.
        self._select = select
        self._dispatch = dispatch
        self._counters = counters
        self._tasks: set[asyncio.Task[None]] = set()
        self._turns = asyncio.Semaphore(MAX_REPLAYS)
        #: Per connection (or in-process subscriber): its semaphore and how many replays use it.
        self._owners: dict[Any, tuple[asyncio.Semaphore, list[int]]] = {}
        #: Replays running now, and waiting for their turn (for the monitor).
        self.running = 0
        self.waiting = 0

    def on_subscribe(self, key: Hashable, history: Mapping[str, Any] | None) -> None:
        """The router's `on_subscribe` hook: start a replay if history was asked for."""
        if history is None or self.storage.store is None:
            return
        cast(Subscriber, key).held = Hold()  # from now on live events wait
        task = asyncio.get_running_loop().create_task(self._in_turn(key, history.get("since")))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _in_turn(self, key: Any, since: Any) -> None:
        """`_replay` once the connection's and the router's caps give it a turn."""
        owner = getattr(key, "session", key)
        sem, users = self._owners.get(owner) or self._owners.setdefault(
            owner, (asyncio.Semaphore(MAX_REPLAYS_PER_CLIENT), [0])
        )
        users[0] += 1
        self.waiting += 1
        waited = False
        try:
            async with sem, self._turns:
                self.waiting -= 1
                waited = True
                if not key.active:  # closed or unsubscribed while it waited
                    key.held = None
                    self._counters["history_abandoned"] += 1
                    return
                self.running += 1
                try:
                    await self._replay(key, since)
                finally:
                    self.running -= 1
        except asyncio.CancelledError:
            key.held = None
            raise
        finally:
            if not waited:
                self.waiting -= 1
            users[0] -= 1
            if users[0] == 0:
                self._owners.pop(owner, None)

    async def _replay(self, key: Any, since: Any) -> None:
        matches = self._matches
        store = self.storage.store
        sent: set[str | None] = set()  # stored events have ids: None never comes
        n = 0

        # Only what its owner may receive is shown to the pattern (a script is dry-run).
        receives = getattr(key, "receives", None)

        def match(event: Event) -> bool:
            if receives is not None and not receives(event.type):
                return False
            return matches(key, event)  # UsageError once unsubscribed

        trusted = Event.trusted
        deliver = key.deliver_now
        select = self._select
        try:
            assert store is not None
            async for chunk in _read_ahead(
                store.iterate(None if select else match, since=since, chunk=REPLAY_CHUNK)
            ):
                if select is not None:
                    if receives is not None:
                        chunk = [e for e in chunk if receives(e.type)]
                    chunk = await select(key, chunk)
                for start in range(0, len(chunk), REPLAY_FRAME):
                    if not key.active:
                        return
                    for ev in chunk[start : start + REPLAY_FRAME]:
                        sent.add(ev.id)
                        deliver(
                            trusted(ev.values, ev.type, {**ev.meta, META_HISTORICAL: True}, ev.id)
                        )
                    await self._drain(key)
                n += len(chunk)
        except UsageError:
            pass  # unsubscribed (or stopped) during the replay
        except StoreError as exc:
            log.warning("history for %r cut short after %d events: %s", key, n, exc)
        except asyncio.CancelledError:
            key.held = None
            raise
        except Exception:
            log.exception("history replay for %r failed after %d events", key, n)
        finally:
            held, key.held = key.held, None
            if held is not None and key.active:
                for ev in held.events:
                    if ev.id is None or ev.id not in sent:
                        key.deliver_now(ev)
                if held.dropped:
                    self._counters["history_held_dropped"] += held.dropped
            self._dispatch.flush()
        self._counters["history_replayed"] += n

    async def _drain(self, key: Any) -> None:
        """Send what is queued for *key*, then wait while its connection is congested."""
        self._dispatch.flush()
        drained = getattr(key, "drained", None)
        if drained is not None:
            await drained()
        else:
            await asyncio.sleep(0)  # let other work run between chunks


async def _read_ahead(
    chunks: AsyncGenerator[list[Event], None],
) -> AsyncIterator[list[Event]]:
    """*chunks*, read one chunk ahead in a task of its own: the next database read runs
    while the current chunk is sent."""
    queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=1)
    done = object()

    async def pump() -> None:
        try:
            async for chunk in chunks:
                await queue.put(chunk)
            await queue.put(done)
        except BaseException as exc:  # handed to the reader, which raises it
            await queue.put(exc)

    task = asyncio.get_running_loop().create_task(pump())
    try:
        while True:
            item = await queue.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await chunks.aclose()


class Hold:
    """The live events held for one subscriber during its replay, at most `MAX_HELD` (the
    subscriber's `deliver` calls `append`)."""

    __slots__ = ("events", "dropped")

    def __init__(self) -> None:
        self.events: deque[Event] = deque()
        self.dropped = 0

    def append(self, event: Event) -> None:
        if len(self.events) >= MAX_HELD:
            self.events.popleft()
            self.dropped += 1
        self.events.append(event)
