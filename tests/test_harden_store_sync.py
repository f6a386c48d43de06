"""Store sync from a hostile peer (issue 16, attack a3/a4): a plain TCP connection that says
peer-hello and sends store-sync messages by hand. It may store what the flood would let it
flood (an open mesh), but never make a publisher's real, acknowledged events vanish, never
speak for another router, and never get more than its share of store scans."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from support import FAST, wait_for, wait_until

from aa.client import AsyncClient
from aa.mesh import Connection, Control, Event, PeerHello
from aa.mesh.protocol import Ping, Pong, event_to_wire
from aa.router import Router, RouterConfig, StoreConfig

PERSIST = {"persist": True}


class Impostor:
    """A peer by hand over a real socket: says peer-hello, answers pings, sends controls."""

    def __init__(self) -> None:
        self.id = os.urandom(8).hex()
        self.codec = Connection()
        self.remote_id: str | None = None
        self.n = 0

    async def connect(self, host: str, port: int) -> Impostor:
        self.reader, self.writer = await asyncio.open_connection(host, port)
        self.writer.write(self.codec.send(PeerHello(router_id=self.id, name="impostor")))
        self.task = asyncio.get_running_loop().create_task(self._read())
        await wait_for(lambda: self.remote_id is not None, timeout=10)
        return self

    async def _read(self) -> None:
        while data := await self.reader.read(1 << 20):
            self.codec.receive_data(data)
            for m in self.codec.next_messages():
                if isinstance(m, PeerHello):
                    self.remote_id = m.router_id
                elif isinstance(m, Ping):
                    self.writer.write(self.codec.send(Pong(token=m.token)))

    def sync(self, body: dict[str, Any], *, origin: str | None = None) -> None:
        self.n += 1
        self.writer.write(
            self.codec.send(
                Control(
                    id=f"{self.id}-{self.n:x}",
                    ttl=0,
                    path=(origin or self.id,),
                    topic="store-sync",
                    body=body,
                    to=self.remote_id,
                )
            )
        )

    async def aclose(self) -> None:
        self.writer.close()
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


def forged(ids: list[str]) -> list[Any]:
    return [
        event_to_wire(
            Event(
                values={"forged": True},
                type="reading",
                id=i,
                meta={"persist": True, "user": "alice", "client": "victim"},
            )
        )
        for i in ids
    ]


async def test_a_copy_sent_ahead_under_predicted_ids_never_displaces_the_real_events(
    tmp_path: Path,
) -> None:
    """The victim's next ids, predicted from one it published, are sent ahead by store sync;
    the victim's real persisted publishes are then acknowledged AND in the store: each
    real event replaced its forged copy."""
    n = 30
    async with Router(RouterConfig(port=0, mesh=FAST, data_dir=tmp_path / "r")) as router:
        host, port = router.address
        victim = await AsyncClient(router.endpoint, name="victim").connect()
        imp = await Impostor().connect(host, port)
        try:
            await victim.publish({"v": 0}, type="reading", meta=PERSIST)
            await victim.flush(timeout=10)
            [first] = await router.history('type == "reading"', include_cache=False)
            prefix, counter = first.id.rsplit("-", 1)  # type: ignore[union-attr]
            nxt = [f"{prefix}-{int(counter, 16) + k:x}" for k in range(1, n + 1)]
            imp.sync({"op": "events", "events": forged(nxt)})
            store = router.storage.store
            assert store is not None
            await wait_for(lambda: router.storage.sync.counters["events_repaired"] == n, timeout=10)
            await store.flush()
            for k in range(1, n + 1):
                await victim.publish({"v": k}, type="reading", meta=PERSIST)
            await victim.flush(timeout=10)

            async def real_kept() -> bool:
                got = await router.history('type == "reading"', include_cache=False)
                return sorted(e.values.get("v", -1) for e in got) == list(range(n + 1))

            await wait_until(real_kept, timeout=10)
            got = await router.history('type == "reading"', include_cache=False)
            assert not [e for e in got if e.values.get("forged")]
            assert {e.id for e in got} >= set(nxt)  # the real events hold the predicted ids
        finally:
            await victim.aclose()
            await imp.aclose()


async def test_a_sync_message_claiming_another_router_is_refused(tmp_path: Path) -> None:
    """Sync is between neighbours: a message whose origin is not the link's own peer (a
    linked router's id, or a made-up one) stores nothing."""
    async with Router(RouterConfig(port=0, mesh=FAST, data_dir=tmp_path / "r")) as router:
        host, port = router.address
        other = await Impostor().connect(host, port)
        imp = await Impostor().connect(host, port)
        try:
            imp.sync(
                {"op": "events", "events": forged(["x-1"])}, origin=other.id
            )  # a linked router's id
            imp.sync({"op": "events", "events": forged(["x-2"])}, origin="made-up")
            imp.sync({"op": "events", "events": forged(["x-3"])})  # its own: stored (an open mesh)
            await wait_for(lambda: router.storage.sync.counters["events_repaired"] == 1, timeout=10)
            await router.storage.flush()
            got = await router.history("True", include_cache=False)
            assert [e.id for e in got] == ["x-3"]
            assert router.mesh.relay.counters["controls_refused"] == 2
        finally:
            await imp.aclose()
            await other.aclose()


async def test_digests_from_one_link_get_one_scan_at_a_time(tmp_path: Path) -> None:
    """Twenty digest requests at once from one link (each claiming a different origin, as
    attack a4 did): at most one exchange runs for the link, the forged origins are refused."""
    async with Router(
        RouterConfig(port=0, mesh=FAST, data_dir=tmp_path / "r", store=StoreConfig(sync_interval=0))
    ) as router:
        host, port = router.address
        imp = await Impostor().connect(host, port)
        try:
            bucket = [["t", 1, 5, "00000000000000ff"]]
            for k in range(20):
                imp.sync({"op": "digest", "buckets": bucket}, origin=f"claimed-{k}")
            for _ in range(20):
                imp.sync({"op": "digest", "buckets": bucket})
            counters = router.storage.sync.counters
            await wait_for(lambda: counters["received_digest"] == 20, timeout=10)
            assert router.mesh.relay.counters["controls_refused"] == 20
            assert (
                counters["dropped_busy"] >= 10
            )  # one runs at a time (a few, if earlier ones ended)
        finally:
            await imp.aclose()
