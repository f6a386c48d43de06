"""The add-in API (Å §4.7): what a module dropped into a container's folder provides, and what
the container gives it.

An add-in is a Python module (``weather.py``) or package (``quotes/__init__.py``) in the
container's folder, or an object an installed distribution declares under the ``aa.addins``
entry point group. It defines one subclass of `AddIn` (or names its class or factory
``ADDIN``)::

    from aa.addins import AddIn, Context

    SETTINGS = {"city": "Oslo", "every": 60.0}      # defaults; a settings file overrides

    class Weather(AddIn):
        async def start(self, ctx: Context) -> None:
            ctx.every(ctx.settings["every"], lambda: self.publish(ctx))  # supervised: restarted if
            it fails

        async def publish(self, ctx: Context) -> None:
            await ctx.client.publish({"City": ctx.settings["city"], "TemperatureC": 3.5},
            type="weather")

`start(ctx)` sets up and returns promptly (within `ContainerConfig.start_timeout`); long
work goes in tasks made with `ctx.spawn`, work repeated on a period in `ctx.every`. `stop()` undoes
what `start` did; the container then cancels the add-in's tasks and closes its client. An add-in
whose `start` raises, or one of whose tasks ends with an exception, is stopped and started afresh (a
new instance, a new client) after a back-off that doubles with each failure in a row; the others
never notice. A task that simply returns is fine.

What the context holds:

- ``client``: an `AsyncClient`, connected, of the add-in's own (name ``addin:<name>``).
- ``settings``: module-level ``SETTINGS`` updated with the settings file — for a package,
  ``settings.toml`` or ``settings.json`` in it; for a module ``NAME.py``, ``NAME.toml`` or
  ``NAME.json`` beside it (the same beside-file works for entry-point add-ins, in the first
  folder). Read-only.
- ``log`` (also ``logger``): a `logging.Logger` named ``aa.addins.<name>``.
- ``data_dir``: a folder of the add-in's own that survives restarts.

Add-ins run in the container's event loop: code that blocks (``time.sleep``, a slow
synchronous call) stalls every add-in; hand such work to ``asyncio.to_thread``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aa.client import AsyncClient

__all__ = ["AddIn", "Context"]


class AddIn:
    """Base class of add-ins; see the module docstring. Subclasses override `start` (and
    `stop` if `start` acquired anything that the container would not release: files,
    threads, subprocesses)."""

    async def start(self, ctx: Context) -> None:
        """Set up, spawn long-running work with `ctx.spawn`, and return."""

    async def stop(self) -> None:
        """Release what `start` acquired. Called once, after a failure too."""


class Context:
    """What an add-in is given; see the module docstring."""

    def __init__(
        self,
        *,
        name: str,
        client: AsyncClient,
        settings: Mapping[str, Any],
        data_dir: Path,
        on_failure: Callable[[BaseException], None],
    ) -> None:
        self.name = name
        self.client = client
        self.settings: Mapping[str, Any] = MappingProxyType(dict(settings))
        self.log = logging.getLogger(f"aa.addins.{name}")
        self.data_dir = data_dir
        self.tasks: set[asyncio.Task[Any]] = set()
        self._on_failure = on_failure

    @property
    def logger(self) -> logging.Logger:
        """The same as `log`."""
        return self.log

    def spawn(
        self, coro: Coroutine[Any, Any, Any], *, name: str | None = None
    ) -> asyncio.Task[Any]:
        """Run *coro* as a task of this add-in. If it raises, the add-in is restarted; if it
        returns, nothing happens. Cancelled when the add-in stops."""
        task = asyncio.get_running_loop().create_task(coro, name=name or f"aa-addin-{self.name}")
        self.tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def every(
        self, seconds: float, work: Callable[[], Awaitable[Any]], *, name: str | None = None
    ) -> asyncio.Task[Any]:
        """Await *work()* now and then every *seconds* (from the start of one run to the start
        of the next; a run that overruns is followed at once, never overlapped), as a task of
        this add-in (`spawn`): if *work* raises, the add-in is restarted."""

        async def repeat() -> None:
            loop = asyncio.get_running_loop()
            due = loop.time()
            while True:
                await work()
                due = max(due + seconds, loop.time())
                await asyncio.sleep(due - loop.time())

        return self.spawn(repeat(), name=name)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self._on_failure(exc)

    async def cancel_tasks(self) -> None:
        tasks = list(self.tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
