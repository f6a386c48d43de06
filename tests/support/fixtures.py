"""The fixtures every test may use: a router on 127.0.0.1:0 and clients of it."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest

from aa.client import AsyncClient
from aa.router import Router, RouterConfig


@pytest.fixture
async def router() -> AsyncIterator[Router]:
    async with Router(RouterConfig(port=0, name="test")) as r:
        yield r


@pytest.fixture
def router_collector() -> Iterator[None]:
    """The garbage collector as an `aa router` process sets it (`aa.tools.router_cmd`: what
    start-up built frozen, rare older-generation passes), for tests that time the router's
    loop in this process; Python's defaults are restored after."""
    from aa.tools.router_cmd import GC_THRESHOLD

    before = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


@pytest.fixture
async def client(router: Router) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(router.endpoint, name="test-client") as c:
        yield c


@pytest.fixture
async def open_client() -> AsyncIterator[Callable[..., Awaitable[AsyncClient]]]:
    """Open clients on any router: ``await open_client(router, client_id=None, **kwargs)``;
    all are closed at the end of the test."""
    clients: list[AsyncClient] = []

    async def make(router: Router, client_id: str | None = None, **kwargs: object) -> AsyncClient:
        c = AsyncClient(router.endpoint, client_id=client_id, **kwargs)  # type: ignore[arg-type]
        await c.connect()
        clients.append(c)
        return c

    yield make
    for c in clients:
        await c.aclose()


@pytest.fixture
def make_client(
    router: Router, open_client: Callable[..., Awaitable[AsyncClient]]
) -> Callable[..., Awaitable[AsyncClient]]:
    """Open more clients on the test's router (see `open_client`)."""
    return lambda **kwargs: open_client(router, **kwargs)
