"""The mesh across machines, each machine a network namespace (`ip netns`), joined by veth
pairs to bridges in a namespace of their own: UDP broadcast discovery, zeroconf, a gateway
router between two subnets, a link cut and restored. Every router is a real `aa router`
process (`ip netns exec NS aa router --host ADDR ...`); clients run inside the namespaces too
(`netns_agent.py`); the lab is `support.netlab`'s. Needs root and `ip netns`; skipped
elsewhere. Nothing leaves the namespaces: there is no route out of them.

    subnet A 10.77.1.0/24 (bridge sw0)          subnet B 10.77.2.0/24 (bridge sw1)
    a1 .11   a2 .12   g .1  ───── g ─────  g .1   b1 .11
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator, Iterator

import pytest
from support.netlab import Links, NetLab, built

pytestmark = pytest.mark.netns

PORT = 7447
DISCOVERY_PORT = 47474  # the namespaces are private: the default port is safe there
FAST = (
    "--beacon-interval",
    "0.2",
    "--retry-base",
    "0.05",
    "--retry-max",
    "0.5",
    "--keepalive",
    "0.3",
    "--info-interval",
    "0.2",
    "--discovery-port",
    str(DISCOVERY_PORT),
)

HOSTS: dict[str, str | Links] = {
    "a1": "10.77.1.11/24",
    "a2": "10.77.1.12/24",
    "g": [("eth0", "10.77.1.1/24", "sw0"), ("eth1", "10.77.2.1/24", "sw1")],
    "b1": [("eth0", "10.77.2.11/24", "sw1")],
}


@pytest.fixture(scope="module")
def lab() -> Iterator[NetLab]:
    with built(HOSTS, "aa") as lab:
        yield lab


@pytest.fixture
async def net(lab: NetLab) -> AsyncIterator[NetLab]:
    """The lab, with every process a test started stopped at its end (even on failure)."""
    try:
        yield lab
    finally:
        await lab.stop_processes()


async def router(net: NetLab, host: str, address: str, *args: str) -> str:
    return await net.router(host, *FAST, *args, address=address, discovery=True)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


async def test_broadcast_discovery_then_a_link_cut_and_restored(net: NetLab) -> None:
    a1 = await router(net, "a1", "10.77.1.11", "--discovery-interfaces", "eth0")
    a2 = await router(net, "a2", "10.77.1.12", "--discovery-interfaces", "eth0")
    agent1 = await net.agent("a1", a1)
    own = (await agent1.ask("peers", n=1))["own"]
    assert own["peers"][0]["name"] == "a2" and own["peers"][0]["address"] == a2

    # Cut a2's cable: no FIN, no RST; the keep-alives notice (0.9 s here).
    _ip("-n", net.ns("a2"), "link", "set", "eth0", "down")
    own = (await agent1.ask("peers", n=0))["own"]
    # Noticed: the link is gone. (Whether a2 shows as poisoned at this instant or is already
    # being dialled again depends on the short back-off; poisoning is tested in
    # test_links_mesh.py's failing-peer test.)
    assert own["peers"] == []
    _ip("-n", net.ns("a2"), "link", "set", "eth0", "up")
    await agent1.ask("peers", n=1)  # rejoined: the back-off is short here
    agent2 = await net.agent("a2", a2)
    await agent2.ask("subscribe", pattern="After == 1")
    await agent1.ask("publish", values={"After": 1})
    assert (await agent2.ask("received", n=1))["events"] == [{"After": 1}]


async def test_zeroconf_joins_routers_across_machines(net: NetLab) -> None:
    zc = ("--no-broadcast", "--zeroconf", "--discovery-interfaces", "eth0")
    a1 = await router(net, "a1", "10.77.1.11", *zc)
    await router(net, "a2", "10.77.1.12", *zc)
    agent1 = await net.agent("a1", a1)
    own = (await agent1.ask("peers", n=1, timeout=20))["own"]
    assert own["peers"][0]["name"] == "a2"


async def test_a_gateway_relays_between_two_subnets(net: NetLab) -> None:
    # g listens on both of its networks and discovers on both; a1 and b1 cannot reach each
    # other (no route between the subnets), so their events cross by g.
    g = await router(net, "g", "0.0.0.0", "--discovery-interfaces", "eth0,eth1")
    assert g == f"0.0.0.0:{PORT}"  # its beacons say so; each side fills in the address it sees
    a1 = await router(net, "a1", "10.77.1.11", "--discovery-interfaces", "eth0")
    b1 = await router(net, "b1", "10.77.2.11", "--discovery-interfaces", "eth0")
    agent_a, agent_b = await asyncio.gather(net.agent("a1", a1), net.agent("b1", b1))
    await asyncio.gather(agent_a.ask("peers", n=1), agent_b.ask("peers", n=1))
    agent_g = await net.agent("g", "10.77.1.1:7447")
    own_g = (await agent_g.ask("peers", n=2))["own"]
    assert sorted(p["name"] for p in own_g["peers"]) == ["a1", "b1"]
    assert sorted(p["address"] for p in own_g["peers"]) == [a1, b1]

    await agent_b.ask("subscribe", pattern="Side == 'A'")
    await agent_a.ask("subscribe", pattern="Side == 'B'")
    await agent_a.ask("publish", values={"Side": "A", "n": 1})
    await agent_b.ask("publish", values={"Side": "B", "n": 2})
    assert (await agent_b.ask("received", n=1))["events"] == [{"Side": "A", "n": 1}]
    assert (await agent_a.ask("received", n=1))["events"] == [{"Side": "B", "n": 2}]

    info = (await agent_a.ask("info"))["info"]
    by_name = {r["name"]: r for r in info["routers"]}
    assert set(by_name) == {"a1", "g", "b1"}  # a1 knows b1 from g's floods
    assert [p["name"] for p in by_name["a1"]["peers"]] == ["g"]  # but is not linked to it
    for agent in (agent_b, agent_g):  # each router's own counters are current
        assert (await agent.ask("info"))["info"]["routers"][0]["counters"]["dispatched"] == 2
