"""A real `aa router` process for black-box tests: started on 127.0.0.1:0, its endpoint read
from the line it prints once it listens, its resident memory read from /proc, killed or
stopped at the end. Blocking on purpose (subprocess, not asyncio): hypothesis tests and
fixtures drive it from plain functions."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["AA", "RouterProcess", "rss_of"]

#: The `aa` command of the interpreter running the tests.
AA = str(Path(sys.executable).with_name("aa"))
#: Seconds a router has to print that it listens (a loaded 2-core machine imports slowly).
START_TIMEOUT = 60.0


def rss_of(pid: int) -> int:
    """Resident memory of process *pid*, in bytes (VmRSS of /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


class RouterProcess:
    """``with RouterProcess("--no-http") as r: r.host, r.port, r.rss()``. Always adds
    ``--port 0 --no-discovery`` (nothing to find, nothing announced); pass more options."""

    def __init__(self, *args: str, name: str = "fuzzed") -> None:
        cmd = [AA, "router", "--port", "0", "--no-discovery", "--name", name, *args]
        # stderr to a file, not a pipe: a router logging every bad frame would fill a pipe
        # nobody reads and block.
        self._err = tempfile.TemporaryFile()  # noqa: SIM115 (kept open: closed in __exit__)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._err)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT)
        line = self.proc.stdout.readline().decode() if ready else ""
        m = re.search(r"listening on (127\.0\.0\.1):(\d+)", line)
        if not m:
            self.kill()
            raise RuntimeError(f"aa router did not start: {line!r} {self.stderr_tail()}")
        self.host, self.port = m.group(1), int(m.group(2))
        self.endpoint = f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss(self) -> int:
        return rss_of(self.proc.pid)

    def stderr_tail(self) -> str:
        """The end of what the router wrote on stderr so far."""
        self._err.seek(0)
        return self._err.read().decode(errors="replace")[-4000:]

    def kill(self) -> None:
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def __enter__(self) -> RouterProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._err.close()
