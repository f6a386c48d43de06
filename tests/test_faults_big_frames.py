"""One client's frame delays no other client by more than 10 ms (issue 16's figure): the
router's event loop is never held longer than that by one frame, however large the frame
the caps allow (`aa.router.session.MAX_FRAME_ITEMS` events, `MAX_FRAME_BYTES` bytes).

Measured inside the router's own loop, where the delay is made: a heartbeat task that
yields and notes how long the loop took to come back to it, while another connection sends
frames already encoded (so the sender costs the loop nothing). A bystander's ping is
answered by the same loop, so the longest gap is the longest any other client waited on
this router because of that frame.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from aa.mesh import Connection, Event
from aa.mesh.protocol import MAX_FRAME_BYTES, Ack, Hello, Publish
from aa.router import Router, RouterConfig
from aa.router.session import MAX_FRAME_ITEMS

#: The issue's figure, in seconds.
MAX_DELAY = 0.010
#: Seconds added for a loaded 2-core machine: the heartbeat itself is preempted by other
#: processes now and then (the scheduler's slices are a few milliseconds).
MARGIN = 0.005


async def longest_gap_while(work: "asyncio.Future[None]") -> float:
    """The longest time the loop took to come back to a task that only yields, while
    *work* runs."""
    longest = 0.0
    while not work.done():
        t = time.perf_counter()
        await asyncio.sleep(0)
        longest = max(longest, time.perf_counter() - t)
    return longest


@pytest.mark.xfail(strict=True, reason="issue 16: a frame of MAX_FRAME_ITEMS events is decoded and validated "
                   "in one piece (one read callback of 40-120 ms) before it is dispatched in slices (helper faults' report)")
async def test_the_largest_frame_allowed_holds_the_loop_at_most_10_ms() -> None:
    async with Router(RouterConfig(port=0, name="big")) as router:
        per_event = min(MAX_FRAME_BYTES // MAX_FRAME_ITEMS - 64, 1500)
        pad = "x" * per_event
        codec = Connection()
        frames = [codec.send(Publish(seq=s, events=tuple(Event(values={"i": i, "pad": pad}) for i in range(MAX_FRAME_ITEMS))))
                  for s in (1, 2, 3)]
        reader, writer = await asyncio.open_connection(*router.address)
        writer.write(codec.send(Hello(client_id="big")))

        async def send_and_wait_acks() -> None:
            for f in frames:
                writer.write(f)
            got: list[object] = []
            async with asyncio.timeout(60):
                while not any(type(m) is Ack and m.seq == 3 for m in got):  # type: ignore[attr-defined]
                    codec.receive_data(await reader.read(1 << 20))
                    got += codec.next_messages()

        work = asyncio.ensure_future(send_and_wait_acks())
        gap = await longest_gap_while(work)
        await work
        writer.close()
        print(f"longest loop gap {gap * 1e3:.1f} ms for frames of {MAX_FRAME_ITEMS} events, {len(frames[0])} bytes")
        assert gap <= MAX_DELAY + MARGIN
