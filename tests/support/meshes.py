"""The one way tests build a mesh of routers: wired in a given shape, on loopback, with short
protocol intervals (`FAST`), discovery kept on a port of the test's own (`lo_discovery`)."""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from aa.mesh import DiscoveryConfig, Event
from aa.router import MeshConfig, Router, RouterConfig

from .waits import wait_for

#: Protocol intervals for tests: fast retries, quick keep-alives, frequent summaries. Exact
#: (no jitter), so back-off can be checked.
FAST = MeshConfig(
    retry_base=0.05,
    retry_max=0.5,
    retry_jitter=0.0,
    keepalive=0.3,
    info_interval=0.2,
    connect_timeout=2.0,
)


def lo_discovery(port: int, **kwargs: Any) -> DiscoveryConfig:
    settings: dict[str, Any] = {
        "enabled": True,
        "port": port,
        "interfaces": ("lo",),
        "broadcast_interval": 0.1,
    }
    return DiscoveryConfig(**{**settings, **kwargs})


def line(n: int) -> list[tuple[int, int]]:
    return [(i, i + 1) for i in range(n - 1)]


def ring(n: int) -> list[tuple[int, int]]:
    return line(n) + [(n - 1, 0)]


def full(n: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(n) for j in range(i + 1, n)]


def random_graph(n: int, extra: int, seed: int) -> list[tuple[int, int]]:
    """A connected graph: a random spanning tree plus *extra* random edges (cycles)."""
    rng = random.Random(seed)
    order = list(range(n))
    rng.shuffle(order)
    edges = {tuple(sorted((order[i], order[rng.randrange(i)]))) for i in range(1, n)}
    while len(edges) < n - 1 + extra:
        a, b = rng.sample(range(n), 2)
        edges.add(tuple(sorted((a, b))))
    return [(a, b) for a, b in sorted(edges)]  # type: ignore[misc]


def neighbours(n: int, edges: Iterable[tuple[int, int]]) -> list[set[int]]:
    out: list[set[int]] = [set() for _ in range(n)]
    for a, b in edges:
        out[a].add(b)
        out[b].add(a)
    return out


def routing_by_interest(routers: Sequence[Router]) -> bool:
    """Every router routes by its trees: settled, caught up, on a complete view of them all."""
    now = time.monotonic()
    for r in routers:
        table = r.mesh.interests.table
        if not (table.settled(now) and table.caught_up(now) and table.view.complete):
            return False
        if len(table.view) != len(routers):
            return False
    return True


async def wait_shape(
    routers: Sequence[Router], edges: Iterable[tuple[int, int]], timeout: float = 10.0
) -> None:
    """Until every router is linked with exactly its neighbours in *edges*."""
    near = neighbours(len(routers), edges)
    want = [{routers[j].id for j in near[i]} for i in range(len(routers))]
    await wait_for(lambda: all(set(r.mesh.links) == w for r, w in zip(routers, want)), timeout)


@asynccontextmanager
async def mesh(
    n: int,
    edges: Iterable[tuple[int, int]] = (),
    *,
    config: MeshConfig = FAST,
    **router_kwargs: Any,
) -> AsyncIterator[list[Router]]:
    """*n* routers on 127.0.0.1; for each edge (a, b), a dials b. Waits for that shape."""
    edges = list(edges)
    routers = [
        Router(RouterConfig(port=0, name=f"r{i}", mesh=config, **router_kwargs)) for i in range(n)
    ]
    started: list[Router] = []
    try:
        for r in routers:
            await r.start()
            started.append(r)
        for a, b in edges:
            routers[a].mesh.add_peer(routers[b].endpoint)
        if edges:
            await wait_shape(routers, edges)
        yield routers
    finally:
        for r in reversed(started):
            await r.aclose()


class Collector:
    """A callback that keeps the ids of the events it is given."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def __call__(self, event: Event) -> None:
        self.ids.append(event.id)  # type: ignore[arg-type]
