"""The router's side of one worker process: spawning it, its pipe, its shared slot, and
killing it. Everything runs in the router's event loop and never blocks it: the pipe is an
asyncio subprocess transport, the slot a shared page the watchdog reads.

The worker is started bare: `aa.router`'s __init__ would import the whole router (the store's
SQLAlchemy, the HTTP models: a second and 100 MB more), so the package is entered as an
empty one whose modules are found on its folder's path, as the event log's writer does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import mmap
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from .wire import SLOT, SLOT_BYTES, FrameReader, encode
from .zygote import Zygote

__all__ = ["WorkerProcess", "ROUTER_DIR", "ZYGOTE_BOOT"]

log = logging.getLogger("aa.router.patterns.workers")

_BOOT: Final = """\
import importlib.machinery, importlib.util, json, sys
sys.path[:] = json.loads(sys.argv[1])
import aa
_spec = importlib.machinery.ModuleSpec("aa.router", None, is_package=True)
package = importlib.util.module_from_spec(_spec)
package.__path__ = [sys.argv[2]]
sys.modules["aa.router"] = aa.router = package
from aa.router.patterns.workers.child import child_main
try:
    child_main(int(sys.argv[3]))
except MemoryError:
    import os
    os._exit(3)
"""

#: The zygote's boot (`zygote.py`): the same bare package, then the fork loop.
ZYGOTE_BOOT: Final = (
    _BOOT.split("from aa.router.patterns.workers.child")[0]
    + """\
from aa.router.patterns.workers.zygote import zygote_main
zygote_main(int(sys.argv[3]))
"""
)

#: Seconds a forked worker's exit code may come after its pipe closed (from the zygote);
#: past it (the zygote is gone) it counts as a crash of unknown cause.
_EXIT_CODE_WAIT = 0.5

#: The exit status of a worker that ran out of memory outside any pattern's evaluation.
EXIT_MEMORY: Final = 3
ROUTER_DIR = str(Path(__file__).resolve().parents[2])
_CLOCK_TICK = os.sysconf("SC_CLK_TCK")


class _Pipe(asyncio.SubprocessProtocol):
    def __init__(self, owner: WorkerProcess) -> None:
        self.owner = owner

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd == 1:
            self.owner.received(data)

    def process_exited(self) -> None:
        self.owner.exited()


class _ReadPipe(asyncio.Protocol):
    """A forked worker's stdout."""

    def __init__(self, owner: WorkerProcess) -> None:
        self.owner = owner

    def data_received(self, data: bytes) -> None:
        self.owner.received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.forked_end(eof=True)


class WorkerProcess:
    """One worker process. `on_message(worker, message)` gets each message after "ready";
    `on_exit(worker)` is called once when the process is gone (killed or crashed)."""

    def __init__(
        self,
        number: int,
        on_message: Callable[[WorkerProcess, list[Any]], None],
        on_exit: Callable[[WorkerProcess], None],
    ) -> None:
        self.number = number
        self.on_message = on_message
        self.on_exit = on_exit
        self.transport: asyncio.SubprocessTransport | None = None
        self.slot: mmap.mmap | None = None
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.gone = False
        self.killed_for: Any = None  # set by the pool before it kills
        self.returncode: int | None = None
        self._reader = FrameReader()
        self._stdin: Any = None
        self._pid: int | None = None
        self._forked: dict[str, Any] | None = None  # {"eof": bool, "code": int | None}

    async def start(
        self, facts: dict[str, Any], timeout: float, zygote: Zygote | None = None
    ) -> None:
        """Fork the process from *zygote* (or, without a live one, spawn it), say hello,
        and wait for its "ready". Raises OSError or TimeoutError; the process is then
        killed."""
        fd = os.memfd_create("aa-pattern-worker", 0)
        try:
            os.ftruncate(fd, SLOT_BYTES)
            self.slot = mmap.mmap(fd, SLOT_BYTES)
            if zygote is not None and not zygote.gone:
                try:
                    await self._fork(zygote, fd)
                except OSError:
                    zygote = None
            if zygote is None or zygote.gone:
                await self._spawn(fd)
        finally:
            os.close(fd)
        self.send(encode(["hello", facts]))
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self.ready)
        except BaseException:
            self.kill()
            raise

    async def _fork(self, zygote: Zygote, fd: int) -> None:
        loop = asyncio.get_running_loop()
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        try:
            pid = await zygote.fork(stdin_r, stdout_w, fd)
        except BaseException:
            os.close(stdin_w)
            os.close(stdout_r)
            raise
        finally:
            os.close(stdin_r)
            os.close(stdout_w)
        self._pid = pid
        self._forked = {"eof": False, "code": None}
        zygote.on_exit[pid] = lambda code: self.forked_end(code=code)
        self._stdin, _ = await loop.connect_write_pipe(
            asyncio.Protocol, os.fdopen(stdin_w, "wb", buffering=0)
        )
        await loop.connect_read_pipe(
            lambda: _ReadPipe(self), os.fdopen(stdout_r, "rb", buffering=0)
        )

    async def _spawn(self, fd: int) -> None:
        loop = asyncio.get_running_loop()
        self.transport, _ = await loop.subprocess_exec(
            lambda: _Pipe(self),
            sys.executable,
            "-I",
            "-c",
            _BOOT,
            json.dumps(sys.path),
            ROUTER_DIR,
            str(fd),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            pass_fds=(fd,),
        )
        self._stdin = self.transport.get_pipe_transport(0)

    @property
    def pid(self) -> int | None:
        if self._pid is not None:
            return self._pid
        return self.transport.get_pid() if self.transport is not None else None

    def send(self, frame: bytes) -> None:
        if self._stdin is not None and not self.gone:
            self._stdin.write(frame)

    def read_slot(self) -> tuple[int, int, int]:
        """(instance id, started at (monotonic ns) or 0 when idle, limit in ns)."""
        assert self.slot is not None
        return SLOT.unpack_from(self.slot)

    def cpu_seconds(self) -> float | None:
        """CPU time the process has used, or None once it is gone. Read from schedstat
        (nanoseconds) where the kernel has it, else from stat (clock ticks, 10 ms)."""
        try:
            with open(f"/proc/{self.pid}/schedstat", "rb") as f:
                ns = int(f.read().split()[0])
            if ns:  # 0: the kernel keeps no schedstats
                return ns / 1e9
        except (OSError, IndexError, ValueError):
            pass
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / _CLOCK_TICK
        except (OSError, IndexError, ValueError):
            return None

    def blame(self) -> tuple[int, str, str]:
        """Once gone: (the instance it was running or 0, stop code, why), for the stop
        message of the pattern that killed it."""
        reason = self.killed_for
        iid, started, _ = self.read_slot()
        if reason is not None and reason[0] == "timeout":
            return (
                reason[1],
                "pattern-timeout",
                f"exceeded its time budget in one call that ran past {reason[2] / 1e6:g} ms",
            )
        iid = iid if started else 0
        if self.returncode == -signal.SIGXCPU:
            return iid, "pattern-timeout", "its worker used its whole CPU allowance for one batch"
        if self.returncode == EXIT_MEMORY:
            return iid, "pattern-memory", "its worker ran out of memory"
        return iid, "pattern-crash", f"its worker process failed ({self.returncode})"

    def kill(self, reason: Any = None) -> None:
        """Kill the process now (SIGKILL); `on_exit` follows once it is reaped."""
        if reason is not None and self.killed_for is None:
            self.killed_for = reason
        if self._forked is not None:
            # Not our child: signalled by pid, and only until its exit code came (the zygote
            # reaped it then, and the pid may be another process's from then on).
            if self._forked["code"] is None and self._pid is not None:
                try:
                    os.kill(self._pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if self._stdin is not None:
                self._stdin.close()
        if self.transport is not None:
            try:
                self.transport.kill()
            except ProcessLookupError:
                pass
            self.transport.close()

    # -- from the pipe ---------------------------------------------------------------------

    def received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        try:
            while not self.gone:
                msg = reader.next()
                if msg is None:
                    return
                if msg[0] == "ready" and not self.ready.done():
                    self.ready.set_result(None)
                    continue
                self.on_message(self, msg)
        except Exception:  # a worker that breaks the pipe's protocol is broken: replace it
            log.warning(
                "pattern worker %d broke the pipe's protocol: replacing it",
                self.number,
                exc_info=True,
            )
            self.kill("protocol")

    def forked_end(self, *, eof: bool = False, code: int | None = None) -> None:
        """A forked worker's pipe closed (*eof*) or the zygote reaped it (*code*): gone once
        both happened (or `_EXIT_CODE_WAIT` after the pipe closed: the zygote is gone)."""
        state = self._forked
        if state is None:
            return
        if code is not None:
            state["code"] = code
        if eof and not state["eof"]:
            state["eof"] = True
            if state["code"] is None:
                asyncio.get_running_loop().call_later(_EXIT_CODE_WAIT, self.exited)
        if state["eof"] and state["code"] is not None:
            self.exited()

    def exited(self) -> None:
        if self.gone:
            return
        self.gone = True
        if self._forked is not None:
            self.returncode = self._forked["code"]
            if self._stdin is not None:
                self._stdin.close()
        if self.transport is not None:
            self.returncode = self.transport.get_returncode()
            self.transport.close()
        if not self.ready.done():
            self.ready.set_exception(OSError(f"pattern worker exited at start ({self.returncode})"))
            self.ready.exception()  # retrieved: start() reports it
        self.on_exit(self)
