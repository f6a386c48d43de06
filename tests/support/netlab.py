"""Machines as network namespaces on one bridge, for tests that cut cables for real: the
machinery of tests/test_links_netns.py (namespaces joined by veth pairs to a bridge in a
namespace of its own, real `aa router` processes started with ``ip netns exec``), for any set
of hosts on one subnet, plus `cut` and `heal`.

A cut takes a host's cable out of the switch (its veth's far end leaves the bridge): neither
end sees a carrier change, an error or a reset — packets just stop arriving, as when a cable
is pulled two switches away. Only keep-alives can notice. Needs root and ``ip netns``; the
namespaces have no route out, so nothing leaves them.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["NetLab", "LabAgent", "netns_unavailable", "AA", "AGENT"]

AA = str(Path(sys.executable).with_name("aa"))
AGENT = str(Path(__file__).with_name("netns_agent.py"))
#: The router port inside every namespace (each has its own: a fixed port is safe there).
PORT = 7447


def netns_unavailable() -> str | None:
    """Why network-namespace tests cannot run here, or None if they can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None:
        return "needs iproute2's ip"
    probe = f"aaprobe{os.getpid() % 100000}"
    try:
        subprocess.run(["ip", "netns", "add", probe], check=True, capture_output=True)
        subprocess.run(["ip", "netns", "del", probe], check=True, capture_output=True)
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"ip netns does not work here: {exc}"
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


class NetLab:
    """Hosts ``{name: "10.x.y.z/24"}`` on one bridge; the processes started in them."""

    def __init__(self, hosts: dict[str, str], tag: str) -> None:
        self.hosts = hosts
        self.tag = f"{tag}{os.getpid() % 100000}"
        self.namespaces: list[str] = []
        self.procs: list[asyncio.subprocess.Process] = []
        self._outer: dict[str, str] = {}
        self.routers: dict[str, asyncio.subprocess.Process] = {}  # the latest router of each host

    def ns(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def address(self, host: str) -> str:
        return self.hosts[host].split("/")[0]

    def build(self) -> None:
        switch = self.ns("sw")
        self._add_ns(switch)
        _ip("-n", switch, "link", "add", "sw0", "type", "bridge")
        _ip("-n", switch, "link", "set", "sw0", "up")
        for i, (host, cidr) in enumerate(self.hosts.items()):
            ns = self.ns(host)
            self._add_ns(ns)
            inner, outer = f"{self.tag}i{i}", f"{self.tag}o{i}"
            _ip("link", "add", inner, "netns", ns, "type", "veth", "peer", "name", outer, "netns", switch)
            _ip("-n", ns, "link", "set", inner, "name", "eth0")
            _ip("-n", ns, "addr", "add", cidr, "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", switch, "link", "set", outer, "master", "sw0")
            _ip("-n", switch, "link", "set", outer, "up")
            self._outer[host] = outer

    def _add_ns(self, name: str) -> None:
        _ip("netns", "add", name)
        self.namespaces.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def cut(self, host: str) -> None:
        """Pull *host*'s cable out of the switch (no carrier change at either end)."""
        _ip("-n", self.ns("sw"), "link", "set", self._outer[host], "nomaster")

    def heal(self, host: str) -> None:
        _ip("-n", self.ns("sw"), "link", "set", self._outer[host], "master", "sw0")

    def destroy(self) -> None:
        for name in reversed(self.namespaces):  # takes their veths with them
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self.namespaces.clear()

    async def exec(self, host: str, *cmd: str) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            "ip", "netns", "exec", self.ns(host), *cmd,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    async def router(self, host: str, *args: str) -> str:
        """`aa router` on *host*'s address; returns its endpoint once it listens."""
        proc = await self.exec(host, AA, "router", "--host", self.address(host), "--port", str(PORT),
                               "--name", host, "--no-http", "--no-discovery", *args)  # fmt: skip
        self.routers[host] = proc
        assert proc.stdout is not None
        async with asyncio.timeout(60):
            line = (await proc.stdout.readline()).decode()
        m = re.search(r"listening on (\S+)", line)
        assert m, f"router in {host} did not start: {line!r}"
        return m.group(1)

    async def kill(self, host: str) -> None:
        """``kill -9`` the router of *host*."""
        proc = self.routers[host]
        proc.kill()
        await proc.wait()

    def endpoint(self, host: str) -> str:
        return f"{self.address(host)}:{PORT}"

    async def agent(self, host: str) -> "LabAgent":
        """`netns_agent.py` in *host*, a client of the router there."""
        proc = await self.exec(host, sys.executable, AGENT, self.endpoint(host))
        agent = LabAgent(proc)
        assert (await agent.read(60))["ok"]
        return agent

    async def stop_processes(self) -> None:
        procs, self.procs = self.procs, []
        for p in procs:
            if p.returncode is None:
                p.kill()  # `ip netns exec` execs the command: this is the process itself
        for p in procs:
            await p.wait()


class LabAgent:
    """Talks to `netns_agent.py` (JSON lines on its stdin and stdout)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def read(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        async with asyncio.timeout(timeout):
            line = await self.proc.stdout.readline()
        assert line, "the agent exited"
        return json.loads(line)  # type: ignore[no-any-return]

    async def ask(self, op: str, timeout: float = 10.0, **kwargs: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"op": op, "timeout": timeout, **kwargs}) + "\n").encode())
        await self.proc.stdin.drain()
        answer = await self.read(timeout + 10)
        assert answer["ok"], answer
        return answer
