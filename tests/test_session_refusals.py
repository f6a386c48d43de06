"""A connection that keeps being refused is closed, with one clear error; one refused now and
then is not, and nobody else is touched."""

from __future__ import annotations

import asyncio

from support import next_event

from aa.client import AsyncClient
from aa.mesh import Connection, PatternSpec
from aa.mesh.protocol import Error, Hello, Message, Subscribe, Subscribed
from aa.router import Router, RouterConfig
from aa.router.session import MAX_REFUSALS

CAP = 3  # subscriptions per client, small so that the test reaches it at once


async def _exchange(
    router: Router, messages: list[Message], until: int | None = None
) -> tuple[list[Message], bool]:
    """Send *messages* on one connection; the answers read until *until* of them came or
    the router closed it (then True)."""
    reader, writer = await asyncio.open_connection(*router.address)
    codec = Connection()
    got: list[Message] = []
    closed = False
    try:
        writer.write(b"".join(codec.send(m) for m in messages))
        async with asyncio.timeout(30):
            while until is None or len(got) < until:
                data = await reader.read(1 << 16)
                if not data:
                    closed = True
                    break
                codec.receive_data(data)
                got += codec.next_messages()
    finally:
        writer.close()
    return got, closed


def _subscribes(n: int) -> list[Message]:
    return [Subscribe(sub_id=i, pattern=PatternSpec(source=f"x > {i}")) for i in range(n)]


async def test_a_connection_refused_past_its_budget_is_closed_with_one_error() -> None:
    config = RouterConfig(port=0, name="refusals", max_subscriptions_per_client=CAP)
    async with Router(config) as router, AsyncClient(router.endpoint) as bystander:
        sub = await bystander.subscribe("x > 0")
        flood = [Hello(client_id="eve")] + _subscribes(CAP + 3 * MAX_REFUSALS)
        got, closed = await _exchange(router, flood)
        assert closed
        welcome, *answers = got
        assert sum(isinstance(m, Subscribed) for m in answers) == CAP
        refused = [m for m in answers if isinstance(m, Error) and m.code == "limit"]
        # The budget earns a little back while the frames are read: not much.
        assert MAX_REFUSALS <= len(refused) < MAX_REFUSALS + 20
        last = answers[-1]
        assert isinstance(last, Error) and last.fatal and last.code == "refused-too-often"
        assert f"{MAX_REFUSALS} requests refused in a row" in last.message
        assert "at most 3 subscriptions per client" in last.message
        assert len(answers) == CAP + len(refused) + 1  # nothing after the closing error
        assert router.counters["refused_too_often"] == 1
        # The bystander's subscription goes on.
        await bystander.publish({"x": 5})
        assert (await next_event(sub)).values["x"] == 5


async def test_a_connection_refused_under_its_budget_stays_open() -> None:
    config = RouterConfig(port=0, name="refusals", max_subscriptions_per_client=CAP)
    async with Router(config) as router:
        n = CAP + MAX_REFUSALS // 2
        got, closed = await _exchange(router, [Hello(client_id="eve")] + _subscribes(n), n + 1)
        assert not closed
        assert sum(isinstance(m, Error) and m.code == "limit" for m in got) == n - CAP
        assert not router.counters["refused_too_often"]
