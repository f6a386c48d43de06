"""Ids nobody else can claim (issue 16): de-duplication drops an event only as a copy of an
event from the same publisher."""

from __future__ import annotations

import asyncio

from support import mesh, wait_for

from aa.client import AsyncClient
from aa.mesh import Connection, Event, id_scope
from aa.mesh.protocol import Ack, Hello, Message, Publish, Welcome
from aa.router import Router


async def raw_client(router: Router, client_id: str, secret: str | None = None):
    reader, writer = await asyncio.open_connection(*router.address)
    codec = Connection()
    writer.write(codec.send(Hello(client_id=client_id, secret=secret)))
    return reader, writer, codec


async def read_until(reader, codec, kind) -> list[Message]:
    got: list[Message] = []
    async with asyncio.timeout(10):
        while not any(type(m) is kind for m in got):
            codec.receive_data(await reader.read(65536))
            got += codec.next_messages()
    return got


async def test_a_client_publishing_another_publishers_next_ids_takes_nothing_from_it(
    router: Router,
) -> None:
    got: list[Event] = []
    router.subscribe("True", got.append)
    async with AsyncClient(router.endpoint) as victim:
        first = await victim.publish({"n": 0})
        await victim.flush()
        prefix, counter = first.rsplit("-", 1)
        # The attacker has read the victim's event and publishes its next 500 ids first.
        reader, writer, codec = await raw_client(
            router, client_id=victim.client_id
        )  # even its client id
        stolen = tuple(
            Event(values={"evil": i}, id=f"{prefix}-{int(counter, 16) + i:x}")
            for i in range(1, 501)
        )
        writer.write(codec.send(Publish(seq=1, events=stolen)))
        await read_until(reader, codec, Ack)
        for n in range(1, 501):
            await victim.publish({"n": n})
        await victim.flush()
        writer.close()
    await wait_for(lambda: sum(1 for e in got if "n" in e.values) == 501)
    assert sorted(e.values["n"] for e in got if "n" in e.values) == list(range(501))
    assert sum(1 for e in got if "evil" in e.values) == 500  # delivered, but under its own ids
    victims = {e.id for e in got if "n" in e.values}
    assert not victims & {e.id for e in got if "evil" in e.values}


async def test_a_retry_under_the_same_secret_is_still_a_duplicate_on_another_router() -> None:
    secret = "s" * 32
    own = id_scope(secret) + "-"
    async with mesh(2, [(1, 0)]) as (a, b):
        got: list[Event] = []
        b.subscribe("True", got.append)
        for router in (a, b):  # the same event sent through one router, then the other
            reader, writer, codec = await raw_client(router, "phone", secret=secret)
            welcome = [m for m in await read_until(reader, codec, Welcome) if type(m) is Welcome][0]
            assert welcome.id_scope + "-" == own  # type: ignore[attr-defined]
            writer.write(codec.send(Publish(seq=1, events=(Event(values={"x": 1}, id=own + "1"),))))
            await read_until(reader, codec, Ack)
            writer.close()
            await wait_for(lambda: len(got) >= 1)  # flooded to b before the retry
        assert [e.id for e in got] == [own + "1"]
        assert b.counters["duplicates"] == 1
