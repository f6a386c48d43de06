"""Machines as network namespaces, for tests that run the mesh across machines and cut
cables for real: each host's interfaces are veth pairs whose far ends sit on bridges (the
switches) in a namespace of their own; real `aa router` processes and client agents
(`netns_agent.py`) start in them with ``ip netns exec``; `cut` and `heal` pull a cable.

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
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

__all__ = ["NetLab", "LabAgent", "Links", "built", "netns_unavailable", "AA", "AGENT"]

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


@contextmanager
def built(hosts: Mapping[str, str | Links], tag: str) -> Iterator[NetLab]:
    """A lab of *hosts*, built, and destroyed after (a module fixture's body); the test is
    skipped where network namespaces cannot be made."""
    why = netns_unavailable()
    if why:
        pytest.skip(why)
    lab = NetLab(hosts, tag)
    try:
        lab.build()
        yield lab
    finally:
        lab.destroy()


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


#: A host's interfaces: (name in the host, address/prefix, bridge).
Links = list[tuple[str, str, str]]


class NetLab:
    """Hosts and the processes started in them. A host is ``"10.x.y.z/24"`` (one interface,
    eth0, on the bridge sw0) or its `Links` (a gateway on two subnets)."""

    def __init__(self, hosts: Mapping[str, str | Links], tag: str) -> None:
        self.hosts: dict[str, Links] = {
            h: [("eth0", v, "sw0")] if isinstance(v, str) else v for h, v in hosts.items()
        }
        self.tag = f"{tag}{os.getpid() % 100000}"
        self.namespaces: list[str] = []
        self.procs: list[asyncio.subprocess.Process] = []
        self._outer: dict[str, tuple[str, str]] = {}  # host → its first cable's far end, bridge
        self.routers: dict[str, asyncio.subprocess.Process] = {}  # the latest router of each host

    def ns(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def address(self, host: str) -> str:
        """*host*'s first address."""
        return self.hosts[host][0][1].split("/")[0]

    def build(self) -> None:
        switch = self.ns("sw")
        self._add_ns(switch)
        for bridge in dict.fromkeys(br for links in self.hosts.values() for _, _, br in links):
            _ip("-n", switch, "link", "add", bridge, "type", "bridge")
            _ip("-n", switch, "link", "set", bridge, "up")
        veths = 0
        for host, links in self.hosts.items():
            ns = self.ns(host)
            self._add_ns(ns)
            for ifname, cidr, bridge in links:
                veths += 1
                inner, outer = f"{self.tag}i{veths}", f"{self.tag}o{veths}"
                _ip(
                    "link",
                    "add",
                    inner,
                    "netns",
                    ns,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    outer,
                    "netns",
                    switch,
                )
                _ip("-n", ns, "link", "set", inner, "name", ifname)
                _ip("-n", ns, "addr", "add", cidr, "dev", ifname)
                _ip("-n", ns, "link", "set", ifname, "up")
                _ip("-n", switch, "link", "set", outer, "master", bridge)
                _ip("-n", switch, "link", "set", outer, "up")
                self._outer.setdefault(host, (outer, bridge))

    def _add_ns(self, name: str) -> None:
        _ip("netns", "add", name)
        self.namespaces.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def cut(self, host: str) -> None:
        """Pull *host*'s (first) cable out of the switch (no carrier change at either end)."""
        _ip("-n", self.ns("sw"), "link", "set", self._outer[host][0], "nomaster")

    def heal(self, host: str) -> None:
        outer, bridge = self._outer[host]
        _ip("-n", self.ns("sw"), "link", "set", outer, "master", bridge)

    def destroy(self) -> None:
        for name in reversed(self.namespaces):  # takes their veths with them
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self.namespaces.clear()

    async def exec(self, host: str, *cmd: str) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            "ip",
            "netns",
            "exec",
            self.ns(host),
            *cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.procs.append(proc)
        return proc

    async def router(
        self, host: str, *args: str, address: str | None = None, discovery: bool = False
    ) -> str:
        """`aa router` on *address* (*host*'s first one unless given), without HTTP, and
        without discovery unless asked; returns its endpoint once it listens."""
        quiet = () if discovery else ("--no-discovery",)
        proc = await self.exec(
            host,
            AA,
            "router",
            "--host",
            address or self.address(host),
            "--port",
            str(PORT),
            "--name",
            host,
            "--no-http",
            *quiet,
            *args,
        )
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

    async def agent(self, host: str, endpoint: str | None = None) -> LabAgent:
        """`netns_agent.py` in *host*, a client of the router at *endpoint* (*host*'s own
        unless given)."""
        proc = await self.exec(host, sys.executable, AGENT, endpoint or self.endpoint(host))
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
        self.proc.stdin.write(
            (json.dumps({"op": op, "timeout": timeout, **kwargs}) + "\n").encode()
        )
        await self.proc.stdin.drain()
        answer = await self.read(timeout + 10)
        assert answer["ok"], answer
        return answer
