"""A client that network-namespace tests run inside a namespace (`ip netns exec NS python
netns_agent.py ROUTER`), driven by JSON lines on stdin, answering with JSON lines on stdout.
One process per namespace for a whole test: starting a Python process per question would
take longer than the mesh does.

Requests: {"op": "peers", "n": N, "timeout": S}   until the router has N peers
          {"op": "info"}                           the router's mesh info
          {"op": "subscribe", "pattern": P}        collect matching events from now on
          {"op": "publish", "values": {...}}       publish, wait for the ack
             (optional "type", "meta", and "count": N events, values plus {"k": i}; "ids")
          {"op": "received", "n": N, "timeout": S} until N events were collected
Each answer is {"ok": bool, ...}.
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import datetime
from typing import Any

from waits import wait_until  # this folder: the agent runs as a script

from aa.client import AsyncClient, ClientConfig


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


async def main(endpoint: str) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    config = ClientConfig(routers=(endpoint,), retry_base=0.05, retry_max=0.5, connect_timeout=2.0)
    got: list[dict[str, Any]] = []
    arrived = asyncio.Event()

    def on_event(ev: Any) -> None:
        got.append(_plain(ev.values))
        arrived.set()

    async with AsyncClient(config=config, name="netns-agent") as client:
        print(json.dumps({"ok": True, "ready": endpoint}), flush=True)
        while line := await reader.readline():
            req = json.loads(line)
            op = req["op"]
            answer: dict[str, Any] = {"ok": True}
            try:
                async with asyncio.timeout(req.get("timeout", 10)):
                    if op == "peers":
                        own: dict[str, Any] = {}

                        # asked again and again: the router has no push for this
                        async def linked(
                            own: dict[str, Any] = own, req: dict[str, Any] = req
                        ) -> bool:
                            own.update((await client.mesh_info())["routers"][0])
                            return len(own["peers"]) == req["n"]

                        await wait_until(linked, timeout=req.get("timeout", 10))
                        answer["own"] = _plain(own)
                    elif op == "info":
                        answer["info"] = _plain(await client.mesh_info())
                    elif op == "subscribe":
                        await client.subscribe(req["pattern"], on_event)
                    elif op == "publish":
                        kind, meta = req.get("type"), req.get("meta")
                        if "count" in req:
                            answer["ids"] = [
                                await client.publish(
                                    {**req["values"], "k": i}, type=kind, meta=meta
                                )
                                for i in range(req["count"])
                            ]
                        else:
                            answer["id"] = await client.publish(req["values"], type=kind, meta=meta)
                        await client.flush(timeout=req.get("timeout", 10))
                    elif op == "received":
                        while len(got) < req["n"]:
                            arrived.clear()
                            await arrived.wait()
                        answer["events"] = list(got)
            except TimeoutError:
                answer = {"ok": False, "error": f"{op} timed out", "events": list(got)}
                if op == "peers":
                    answer["info"] = _plain(await client.mesh_info())
            print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
