"""One add-in's life in the container: start, supervise, stop, and restart after failures with
an exponential back-off, without ever disturbing another add-in.

States (one `AddInRunner` per loaded add-in)::

    starting ──start() returned──► running ──task raised / start raised──► failed
       ▲                                                                     │
       └──────────────── back-off elapsed (a new instance, a new client) ◄───┘
    any state ──stop()──► stopped

`Backoff` decides the waits: ``base`` seconds after the first failure, doubling with each
failure in a row up to ``maximum``; an add-in that ran for ``stable_after`` seconds before
failing starts again from ``base``. Time is passed in (`now`), so tests move it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .api import AddIn, Context

if TYPE_CHECKING:
    from aa.client import AsyncClient

__all__ = ["AddInRunner", "Backoff", "RunnerSettings"]

log = logging.getLogger("aa.addins")


class Backoff:
    """Waits between restarts; see the module docstring.

    >>> b = Backoff(base=1.0, maximum=8.0, stable_after=30.0)
    >>> [b.failed(now=t) for t in (0, 1, 2, 3, 4, 5)]
    [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    >>> b.started(now=10.0); b.failed(now=50.0)        # ran 40 s: forgiven
    1.0
    """

    def __init__(self, *, base: float, maximum: float, stable_after: float) -> None:
        self.base = base
        self.maximum = maximum
        self.stable_after = stable_after
        self.failures = 0
        self._started: float | None = None

    def started(self, now: float) -> None:
        self._started = now

    def failed(self, now: float) -> float:
        """Seconds to wait before the next start."""
        if self._started is not None and now - self._started >= self.stable_after:
            self.failures = 0
        self._started = None
        self.failures += 1
        return float(min(self.base * 2 ** (self.failures - 1), self.maximum))


@dataclass(frozen=True, slots=True, kw_only=True)
class RunnerSettings:
    """The container's timings, as a runner needs them (see `ContainerConfig`)."""

    backoff_base: float
    backoff_max: float
    stable_after: float
    start_timeout: float
    stop_timeout: float


ClientFactory = Callable[[str], Awaitable["AsyncClient"]]


class StartFailed(Exception):
    """An add-in's `start` raised (or outlived its timeout); the cause is `__cause__`."""


def describe(exc: BaseException) -> str:
    """``Type: message (file.py:line)``: one line naming where in the add-in it happened (the
    traceback itself is logged at debug level)."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ is not None else []
    if frames:
        last = frames[-1]
        text += f" ({last.filename.rsplit('/', 1)[-1]}:{last.lineno})"
    return text


class AddInRunner:
    """Supervises one add-in; see the module docstring."""

    def __init__(
        self,
        name: str,
        factory: Callable[[], AddIn],
        settings: dict[str, Any],
        *,
        data_dir: Path,
        make_client: ClientFactory,
        timing: RunnerSettings,
        origin: str = "",
    ) -> None:
        self.name = name
        self.factory = factory
        self.settings = settings
        self.data_dir = data_dir
        self.origin = origin
        self.state = "stopped"
        self.starts = 0
        self.last_error: str | None = None
        self.backoff = Backoff(
            base=timing.backoff_base, maximum=timing.backoff_max, stable_after=timing.stable_after
        )
        self.instance: AddIn | None = None
        self._timing = timing
        self._make_client = make_client
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._changed = asyncio.Event()

    @property
    def failures(self) -> int:
        """Failures in a row (reset once the add-in ran for `stable_after`)."""
        return self.backoff.failures

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._supervise(), name=f"aa-addin-{self.name}"
            )

    async def stop(self) -> None:
        """Stop the add-in and its supervision (idempotent)."""
        self._stopping.set()
        if self._task is not None:
            if self.state != "running":
                self._task.cancel()  # starting (a client still connecting) or waiting to restart
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self.state = "stopped"

    async def wait_state(self, state: str, timeout: float | None = None) -> None:
        """Return once the add-in is in *state* ("running", "failed", ...)."""
        async with asyncio.timeout(timeout):
            while self.state != state:
                self._changed.clear()
                await self._changed.wait()

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "starts": self.starts,
            "failures": self.failures,
            "last_error": self.last_error,
            "origin": self.origin,
        }

    def _set(self, state: str) -> None:
        self.state = state
        self._changed.set()

    async def _supervise(self) -> None:
        while not self._stopping.is_set():
            try:
                await self._run_once()
            except Exception as exc:
                delay = self.backoff.failed(time.monotonic())
                if isinstance(exc, StartFailed) and exc.__cause__ is not None:
                    cause = exc.__cause__
                    self.last_error = f"failed to start: {describe(cause)}"
                else:
                    cause = exc
                    self.last_error = describe(exc)
                log.warning(
                    "add-in %s %s; restarting in %.2f s",
                    self.name,
                    self.last_error
                    if self.last_error.startswith("failed to start")
                    else f"failed: {self.last_error}",
                    delay,
                )
                log.debug(
                    "add-in %s: the traceback",
                    self.name,
                    exc_info=(type(cause), cause, cause.__traceback__),
                )
                self._set("failed")
                try:
                    async with asyncio.timeout(delay):
                        await self._stopping.wait()
                except TimeoutError:
                    pass
            else:
                return  # asked to stop

    async def _run_once(self) -> None:
        failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def on_failure(exc: BaseException) -> None:
            if not failed.done():
                failed.set_result(exc)

        self._set("starting")
        self.starts += 1
        client = None
        ctx = None
        addin = None
        try:
            client = await self._make_client(self.name)
            addin = self.instance = self.factory()
            self.data_dir.mkdir(parents=True, exist_ok=True)
            ctx = Context(
                name=self.name,
                client=client,
                settings=self.settings,
                data_dir=self.data_dir,
                on_failure=on_failure,
            )
            try:
                async with asyncio.timeout(self._timing.start_timeout):
                    await addin.start(ctx)
            except TimeoutError:
                raise StartFailed() from TimeoutError(
                    f"start() took longer than {self._timing.start_timeout:g} s"
                )
            except Exception as exc:
                raise StartFailed() from exc
            self.backoff.started(time.monotonic())
            self._set("running")
            log.info("add-in %s running", self.name)
            stop_wait: asyncio.Future[Any] = asyncio.ensure_future(self._stopping.wait())
            try:
                await asyncio.wait([failed, stop_wait], return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop_wait.cancel()
            if failed.done():
                error = failed.result()
                raise error if isinstance(error, Exception) else RuntimeError(repr(error))
        finally:
            await self._teardown(addin, ctx, client, started=self.state == "running")

    async def _teardown(
        self,
        addin: AddIn | None,
        ctx: Context | None,
        client: AsyncClient | None,
        started: bool = True,
    ) -> None:
        if addin is not None:
            try:
                async with asyncio.timeout(self._timing.stop_timeout):
                    await addin.stop()
            except Exception as exc:
                # After a failed start, stop() meets what start left half done: that it fails
                # too is no news (the start failure is what gets reported).
                log.log(
                    logging.WARNING if started else logging.DEBUG,
                    "add-in %s failed to stop cleanly: %s",
                    self.name,
                    describe(exc),
                )
        if ctx is not None:
            await ctx.cancel_tasks()
        if client is not None:
            try:
                await client.aclose(timeout=self._timing.stop_timeout)
            except Exception:
                log.exception("add-in %s: closing its client failed", self.name)
        self.instance = None
