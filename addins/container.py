"""The container service (Å §4.7): hosts the add-ins found in folders and among installed
entry points, each with its own client, restarts the ones that fail, and picks up add-ins
copied into a folder — or changed there — without being restarted itself.

    config = ContainerConfig(folders=(Path("addins/bundled"),), routers=("127.0.0.1:7447",))
    async with Container(config) as container:
        print(container.status())            # name → state, starts, failures, last error
        await asyncio.Event().wait()

Runs on the console and as a system service (`aa container DIR`, `aa service install
container`), or inside a router's process (`aa router --container DIR`). Folder rules and
reloading are in `aa.addins.loader`, the add-in API in `aa.addins.api`, supervision and
back-off in `aa.addins.runner`.

Watching: every `ContainerConfig.poll_interval` seconds the folders are scanned and each
add-in's file signature compared with the one it was loaded from; a new add-in is loaded and
started, a changed one stopped, reloaded and started again, a removed one stopped. An
add-in that does not load (a syntax error, no `AddIn` in it) is logged and tried again once
its files change. Polling (not inotify) works on every platform and network share, and
costs a few `stat` calls per add-in per interval.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from aa.mesh import UsageError

from .loader import (
    AddInLoadError,
    AddInSource,
    installed_entry_points,
    load_source,
    scan_folder,
    unload,
)
from .runner import AddInRunner, RunnerSettings

if TYPE_CHECKING:
    from aa.client import AsyncClient

__all__ = ["Container", "ContainerConfig", "default_data_dir", "DEFAULT_POLL_INTERVAL"]

log = logging.getLogger("aa.addins")

#: Seconds between two scans of the folders: an add-in copied in runs within this.
DEFAULT_POLL_INTERVAL: Final = 2.0


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/aa/addins`` (``~/.local/share/aa/addins``)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "aa" / "addins"


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerConfig:
    """How a container runs.

    >>> ContainerConfig(folders=("addins",)).folders
    (PosixPath('addins'),)
    """

    #: Folders whose add-ins to host (the first one that has a name wins).
    folders: tuple[Path, ...] = ()
    #: Router endpoints the add-ins' clients connect to (and fail over between).
    routers: tuple[str, ...] = ("127.0.0.1:7447",)
    #: Also host add-ins declared under the ``aa.addins`` entry point group.
    entry_points: bool = True
    #: Parent of the add-ins' own data folders (``<data_dir>/<name>``); None for
    #: `default_data_dir()`.
    data_dir: Path | None = None
    #: Seconds between two scans of the folders.
    poll_interval: float = DEFAULT_POLL_INTERVAL
    #: Seconds to wait before the first restart of a failed add-in; doubles per failure.
    backoff_base: float = 1.0
    #: Longest wait before a restart, seconds.
    backoff_max: float = 60.0
    #: Seconds an add-in must run before its past failures are forgiven.
    stable_after: float = 30.0
    #: Seconds an add-in's `start` may take (connecting its client included).
    start_timeout: float = 30.0
    #: Seconds an add-in's `stop` (and its client's goodbye) may take.
    stop_timeout: float = 5.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "folders", tuple(Path(f) for f in self.folders))
        routers = (self.routers,) if isinstance(self.routers, str) else tuple(self.routers)
        object.__setattr__(self, "routers", routers)
        if self.data_dir is not None:
            object.__setattr__(self, "data_dir", Path(self.data_dir))
        for name in (
            "poll_interval",
            "backoff_base",
            "backoff_max",
            "stable_after",
            "start_timeout",
            "stop_timeout",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise UsageError(f"{name} must be a positive number of seconds")
        if self.backoff_base > self.backoff_max:
            raise UsageError("backoff_base must not exceed backoff_max")
        if not self.routers:
            raise UsageError("the add-ins need at least one router endpoint")


class Container:
    """Hosts add-ins; see the module docstring.

    *make_client* (for tests and embedding) returns a connected client for an add-in's name;
    *entry_points* replaces the installed entry points.
    """

    def __init__(
        self,
        config: ContainerConfig,
        *,
        make_client: Callable[[str], Any] | None = None,
        entry_points: Callable[[], Iterable[EntryPoint]] | None = None,
    ) -> None:
        self.config = config
        self.runners: dict[str, AddInRunner] = {}
        #: Add-ins that did not load, by name: the reason.
        self.broken: dict[str, str] = {}
        self._sources: dict[str, AddInSource] = {}
        self._modules: dict[str, str | None] = {}
        self._make_client = make_client or self._connect
        self._entry_points = entry_points or installed_entry_points
        self._task: asyncio.Task[None] | None = None
        self._scan_lock = asyncio.Lock()
        self._timing = RunnerSettings(
            backoff_base=config.backoff_base,
            backoff_max=config.backoff_max,
            stable_after=config.stable_after,
            start_timeout=config.start_timeout,
            stop_timeout=config.stop_timeout,
        )

    async def start(self) -> None:
        """Load and start every add-in found, then watch the folders. Add-ins connect and
        start in the background: this returns before they run (see `status`)."""
        await self.rescan()
        self._task = asyncio.get_running_loop().create_task(
            self._watch(), name="aa-container-watch"
        )

    async def aclose(self) -> None:
        """Stop every add-in (each `stop` is called) and stop watching. Idempotent."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        async with self._scan_lock:
            await asyncio.gather(*(self._remove(name) for name in list(self.runners)))

    async def __aenter__(self) -> Container:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def status(self) -> dict[str, dict[str, Any]]:
        """Every add-in by name: state (starting, running, failed, stopped, broken), starts,
        failures in a row, last error, and where it came from."""
        out = {name: r.status() for name, r in self.runners.items()}
        for name, reason in self.broken.items():
            out[name] = {
                "name": name,
                "state": "broken",
                "starts": 0,
                "failures": 0,
                "last_error": reason,
                "origin": str(self._sources[name].path) if name in self._sources else "",
            }
        return out

    # -- watching ---------------------------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.config.poll_interval)
            try:
                await self.rescan()
            except Exception:
                log.exception("scanning the add-in folders failed")

    def found(self) -> dict[str, AddInSource]:
        """Every add-in the folders and entry points offer now, by name."""
        found: dict[str, AddInSource] = {}
        for folder in self.config.folders:
            for name, src in scan_folder(folder).items():
                if name in found:
                    log.warning(
                        "add-in %s in %s hidden by the one in %s", name, folder, found[name].path
                    )
                    continue
                found[name] = src
        if self.config.entry_points:
            settings_dir = self.config.folders[0] if self.config.folders else None
            for ep in self._entry_points():
                if ep.name in found:
                    continue
                found[ep.name] = AddInSource(
                    name=ep.name,
                    entry_point=ep,
                    settings_dir=settings_dir,
                    signature=(("entry-point:" + ep.value, 0, 0),),
                )
        return found

    async def rescan(self) -> None:
        """Compare the folders with what runs, now (the watcher does it every interval)."""
        async with self._scan_lock:
            found = self.found()
            for name in [n for n in self._sources if n not in found]:
                log.info("add-in %s removed", name)
                await self._remove(name)
            for name, src in found.items():
                old = self._sources.get(name)
                if old is not None and old.signature == src.signature:
                    continue
                if old is not None:
                    log.info("add-in %s changed: reloading", name)
                    await self._remove(name)
                self._add(src)

    def _add(self, src: AddInSource) -> None:
        self._sources[src.name] = src
        try:
            factory, settings, modname = load_source(src)
        except AddInLoadError as exc:
            log.error("%s", exc)
            self.broken[src.name] = str(exc)
            return
        self.broken.pop(src.name, None)
        self._modules[src.name] = modname
        data_dir = (self.config.data_dir or default_data_dir()) / src.name
        runner = AddInRunner(
            src.name,
            factory,
            settings,
            data_dir=data_dir,
            make_client=self._make_client,
            timing=self._timing,
            origin=str(src.path or src.entry_point),
        )
        self.runners[src.name] = runner
        runner.start()

    async def _remove(self, name: str) -> None:
        self._sources.pop(name, None)
        self.broken.pop(name, None)
        runner = self.runners.pop(name, None)
        if runner is not None:
            await runner.stop()
        unload(self._modules.pop(name, None))

    async def _connect(self, name: str) -> AsyncClient:
        from aa.client import AsyncClient

        client = AsyncClient(list(self.config.routers), name=f"addin:{name}")
        try:
            await client.connect()
        except BaseException:
            await client.aclose()
            raise
        return client
