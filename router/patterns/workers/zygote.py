"""The zygote: one process, started once per pool, that has imported everything a worker
needs and forks a new worker on request — in milliseconds, where starting a Python process
and importing the sandbox takes half a second (several on a busy machine). A worker killed
for a pattern stuck in C is replaced at once, and so is the spare behind it: when many
hostile patterns fire together, no kill waits for a process to start.

The zygote runs no pattern code: it only forks. Its children are exactly the workers
`child.py` describes (the fork happens before the worker reads its hello, locks itself
down, and compiles anything). The router talks to it over a SOCK_SEQPACKET socket pair::

    router → zygote   b"F" with three descriptors (SCM_RIGHTS): the worker's stdin (read
                      end), its stdout (write end), its shared slot (memfd)
    zygote → router   b"P" + pid (a fork, in request order)
                      b"X" + pid + exit code (a child reaped: negative for a signal)

The zygote reaps its children itself (they are not the router's), so their exit codes come
from it. Should it die, the pool falls back to starting workers as processes of their own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import select
import signal
import socket
import struct
import sys
from collections import deque
from collections.abc import Callable
from typing import Final

__all__ = ["Zygote", "zygote_main"]

log = logging.getLogger("aa.router.patterns.workers")

_PID: Final = struct.Struct("<q")
_EXIT: Final = struct.Struct("<qq")


def zygote_main(sock_fd: int) -> None:
    """The zygote's loop (in its own process): fork a worker per request, reap them all."""
    import gc

    from ..sandbox import XPathProgram
    from .child import child_main

    XPathProgram.load()  # elementpath, for every worker forked from here
    gc.collect()
    gc.freeze()  # start-up's objects: out of every child's collections (and shared pages)
    sock = socket.socket(fileno=sock_fd)
    sock_fd = sock.fileno()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *a: None)
    while True:
        try:
            ready, _, _ = select.select([sock_fd, wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in ready:
            os.read(wake_r, 4096)
        while True:  # reap every child that exited, whatever woke us
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            sock.send(b"X" + _EXIT.pack(pid, os.waitstatus_to_exitcode(status)))
        if sock_fd not in ready:
            continue
        msg, fds, _, _ = socket.recv_fds(sock, 16, 3)
        if not msg:
            os._exit(0)  # the router is gone (its workers see their pipes close)
        pid = os.fork()
        if pid == 0:  # the new worker
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.dup2(fds[0], 0)
            os.dup2(fds[1], 1)
            for fd in (fds[0], fds[1], wake_r, wake_w, sock.detach()):
                os.close(fd)
            code = 0
            try:
                child_main(fds[2])
            except MemoryError:
                code = 3  # process.EXIT_MEMORY
            except BaseException:
                code = 1
            os._exit(code)
        for fd in fds:
            os.close(fd)
        sock.send(b"P" + _PID.pack(pid))


class Zygote:
    """The router's handle on the zygote process. `fork()` gives a new worker's pid and its
    pipe ends; `on_exit[pid]` is called with the worker's exit code once it is reaped."""

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._forks: deque[asyncio.Future[int]] = deque()
        #: pid → callback(exit code), for the workers forked and not yet reaped.
        self.on_exit: dict[int, Callable[[int], None]] = {}
        self.gone = False

    @classmethod
    async def started(cls, boot: str, router_dir: str, timeout: float) -> Zygote | None:
        """A running zygote, or None (logged) if it cannot start."""
        zygote = cls()
        try:
            await zygote.start(boot, router_dir, timeout)
        except (OSError, TimeoutError) as exc:
            log.warning("cannot start the pattern workers' zygote (%s): spawning each worker", exc)
            zygote.close()
            return None
        return zygote

    async def start(self, boot: str, router_dir: str, timeout: float) -> None:
        """Start the zygote; it is ready as soon as it reads its socket."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = await asyncio.wait_for(
                asyncio.create_subprocess_exec(
                    sys.executable,
                    "-I",
                    "-c",
                    boot,
                    json.dumps(sys.path),
                    router_dir,
                    str(theirs.fileno()),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                    pass_fds=(theirs.fileno(),),
                ),
                timeout,
            )
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        asyncio.get_running_loop().add_reader(ours.fileno(), self._read)

    async def fork(self, stdin_r: int, stdout_w: int, slot_fd: int) -> int:
        """A new worker with these descriptors as its stdin, stdout and slot; its pid.
        Raises OSError if the zygote is gone."""
        if self._sock is None or self.gone:
            raise OSError("the zygote is gone")
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._forks.append(future)
        socket.send_fds(self._sock, [b"F"], [stdin_r, stdout_w, slot_fd])
        return await future

    def _read(self) -> None:
        assert self._sock is not None
        while True:
            try:
                msg = self._sock.recv(64)
            except BlockingIOError:
                return
            except OSError:
                msg = b""
            if not msg:
                self._lost()
                return
            if msg[:1] == b"P" and self._forks:
                future = self._forks.popleft()
                if not future.done():
                    future.set_result(_PID.unpack(msg[1:])[0])
            elif msg[:1] == b"X":
                pid, code = _EXIT.unpack(msg[1:])
                callback = self.on_exit.pop(pid, None)
                if callback is not None:
                    callback(code)

    def _lost(self) -> None:
        """The zygote died: pending forks fail; its orphaned workers' exits are unknown."""
        if self.gone:
            return
        self.gone = True
        log.warning("the pattern workers' zygote is gone: workers start as processes of their own")
        self.close()
        while self._forks:
            f = self._forks.popleft()
            if not f.done():
                f.set_exception(OSError("the zygote is gone"))
        for callback in list(self.on_exit.values()):
            callback(-1)
        self.on_exit.clear()

    def close(self) -> None:
        if self._sock is not None:
            try:
                asyncio.get_running_loop().remove_reader(self._sock.fileno())
            except RuntimeError:
                pass
            self._sock.close()
            self._sock = None
        if self._proc is not None and self._proc.returncode is None:
            try:
                self._proc.kill()
            except ProcessLookupError:
                pass
        self.gone = True
