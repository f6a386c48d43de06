"""Broadcast discovery between two network namespaces joined by a veth pair: two "machines"
on a private 10.9.0.0/24 link that exists only inside the test (needs root and `unshare`).
Proves what loopback cannot: beacons cross a real link, and a socket bound to the subnet's
broadcast address hears the other machine's."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import textwrap

import pytest

pytestmark = pytest.mark.netns

NODE = textwrap.dedent(
    """
    import asyncio, os, sys
    from aa.mesh.beacon import Beacon
    from aa.mesh.discovery import BroadcastDiscovery

    async def main(me, other, iface):
        found = asyncio.Event()
        def on_found(info):
            if info.router_id == other:
                # One write of under PIPE_BUF bytes: atomic, so the two nodes' lines, sharing
                # one pipe, never interleave (print may split a line into several writes).
                os.write(1, f"found {other} {info.peer}\\n".encode())
                found.set()
        b = Beacon(router_id=me, peer="0.0.0.0:7447")
        async with BroadcastDiscovery(
            port=47474, on_found=on_found, beacon=b, selection=[iface], interval=0.2
        ):
            async with asyncio.timeout(15):
                await found.wait()

    asyncio.run(main(*sys.argv[1:]))
    """
)

SCRIPT = """
set -e
ip link set lo up
ip link add veth0 type veth peer name veth1 netns {pid}
ip addr add 10.9.0.1/24 dev veth0
ip link set veth0 up
nsenter -t {pid} -n \\
  sh -c 'ip link set lo up; ip addr add 10.9.0.2/24 dev veth1; ip link set veth1 up'
nsenter -t {pid} -n {py} -c "$NODE" node-b node-a veth1 &
{py} -c "$NODE" node-a node-b veth0
wait $!
"""


def _can_unshare() -> bool:
    return (
        os.geteuid() == 0
        and shutil.which("unshare") is not None
        and shutil.which("nsenter") is not None
    )


@pytest.mark.skipif(not _can_unshare(), reason="needs root, unshare and nsenter")
async def test_broadcast_discovery_across_a_veth_link() -> None:
    # A process that holds the new network namespace until the test ends (it reads a pipe
    # nobody writes to): the veth pair's other end lives there.
    holder = await asyncio.create_subprocess_exec(
        "unshare", "-n", "cat", stdin=asyncio.subprocess.PIPE
    )
    try:
        probe = await asyncio.create_subprocess_exec("unshare", "-n", "true")
        if await probe.wait() != 0:
            pytest.skip("unshare -n is not permitted here")
        proc = await asyncio.create_subprocess_exec(
            "unshare",
            "-n",
            "sh",
            "-c",
            SCRIPT.format(pid=holder.pid, py=sys.executable),
            env={**os.environ, "NODE": NODE},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(30):
            out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        lines = sorted(out.decode().split("\n"))
        assert "found node-a 10.9.0.1:7447" in lines and "found node-b 10.9.0.2:7447" in lines, (
            out,
            err,
        )
    finally:
        holder.kill()
        await holder.wait()
