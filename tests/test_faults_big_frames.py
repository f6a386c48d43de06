"""One client's frame delays no other client by more than 10 ms (issue 16's figure): the
router's event loop is never held longer than that by one frame, however large the frame
the caps allow (`aa.router.session.MAX_FRAME_ITEMS` events, `MAX_FRAME_BYTES` bytes) and
however dense its msgpack (16 MiB of empty lists once took one decoding call of 8-12 s).

Measured inside the router's own loop, where the delay is made: a heartbeat task that
yields and notes how long the loop took to come back to it, while a thread sends frames
already encoded over a blocking socket (so the sender costs the loop nothing). A bystander's
ping is answered by the same loop, so the longest gap is the longest any other client waited
on this router because of that frame. The gap is counted in the loop thread's own CPU time:
the work that held the loop, not the time other processes of a busy machine took the CPU
(wall time is printed beside it). Work on the other core still slows the loop thread's own
(shared caches and memory bus), so a test keeps the least of up to three runs
(`least_gap`). The collector is set as an `aa router` process sets it.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
import pytest
from support import next_turn

from aa.mesh import Connection, Event
from aa.mesh.protocol import (
    MAX_FRAME_BYTES,
    MAX_FRAME_VALUES,
    STEP_ABOVE,
    Ack,
    Error,
    Hello,
    Publish,
)
from aa.router import Router, RouterConfig
from aa.router.session import MAX_FRAME_ITEMS

#: The issue's figure, in seconds.
MAX_DELAY = 0.010
#: Seconds added for what the loop thread's clock also counts beside the frame's work: the
#: test's own heartbeat and sender bookkeeping, a collection the frame did not cause.
MARGIN = 0.005

pytestmark = pytest.mark.usefixtures("router_collector")


async def longest_gap_while(work: asyncio.Future[Any]) -> float:
    """The longest the loop took to come back to a task that only yields, while *work*
    runs, in the loop thread's CPU seconds (the longest in wall seconds is printed too)."""
    longest = longest_wall = 0.0
    while not work.done():
        t, w = time.thread_time(), time.perf_counter()
        await next_turn()
        longest = max(longest, time.thread_time() - t)
        longest_wall = max(longest_wall, time.perf_counter() - w)
    print(f"(wall: {longest_wall * 1e3:.1f} ms)", end=" ")
    return longest


def send_frames(address: tuple[str, int], frames: list[bytes], last_seq: int) -> list[Any]:
    """In a thread: say hello, send *frames*, and read until the ack of *last_seq*, an error
    or the end of the connection. The router's answers."""
    codec = Connection()
    got: list[Any] = []
    with socket.create_connection(address, timeout=60) as sock:
        sock.sendall(codec.send(Hello(client_id="big")))
        try:
            for frame in frames:
                sock.sendall(frame)
        except BrokenPipeError:
            pass  # refused mid-frame: the router shut its end; its error is there to read
        while not any(type(m) is Ack and m.seq == last_seq or type(m) is Error for m in got):
            data = sock.recv(1 << 20)
            if not data:
                break
            codec.receive_data(data)
            got += codec.next_messages()
    return got


def raw_frame(message: dict[str, Any]) -> bytes:
    """A frame of any msgpack, as a hostile client builds it (no checks of ours)."""
    payload = msgpack.packb(message, use_bin_type=True)
    return len(payload).to_bytes(4, "big") + payload


async def gap_while_sending(
    router: Router, frames: list[bytes], last_seq: int = 1
) -> tuple[float, list[Any]]:
    work = asyncio.ensure_future(asyncio.to_thread(send_frames, router.address, frames, last_seq))
    gap = await longest_gap_while(work)
    return gap, await work


#: Runs of a measurement at most, before its least is judged (`least_gap`).
TRIES = 3


async def least_gap(attempt: Callable[[], Awaitable[float]]) -> float:
    """The least loop gap of up to `TRIES` runs of *attempt* (a fresh router each, the test's
    other assertions inside), stopping at the first within the bound. The loop thread's CPU
    seconds hold only the loop's work, but that work runs slower while the other core is busy
    (they share the caches and the memory bus): other processes make a measurement longer,
    never shorter, so the least is the nearest to the frame's own cost, and a router that
    holds its loop too long exceeds the bound every time."""
    least = float("inf")
    for _ in range(TRIES):
        least = min(least, await attempt())
        if least <= MAX_DELAY + MARGIN:
            break
    return least


async def test_the_largest_frame_allowed_holds_the_loop_at_most_10_ms() -> None:
    async def attempt() -> float:
        async with Router(RouterConfig(port=0, name="big")) as router:
            per_event = min(MAX_FRAME_BYTES // MAX_FRAME_ITEMS - 64, 1500)
            pad = "x" * per_event
            codec = Connection()
            frames = [
                codec.send(
                    Publish(
                        seq=s,
                        events=tuple(
                            Event(values={"i": i, "pad": pad}) for i in range(MAX_FRAME_ITEMS)
                        ),
                    )
                )
                for s in (1, 2, 3)
            ]
            gap, answers = await gap_while_sending(router, frames, last_seq=3)
            print(
                f"longest loop gap {gap * 1e3:.1f} ms for frames of {MAX_FRAME_ITEMS} events, "
                f"{len(frames[0])} bytes"
            )
            assert [m.seq for m in answers if type(m) is Ack][-1] == 3
            assert router.counters["published"] == 3 * MAX_FRAME_ITEMS
            return gap

    assert await least_gap(attempt) <= MAX_DELAY + MARGIN


async def test_a_client_batch_of_small_events_holds_the_loop_at_most_10_ms() -> None:
    # The client library's own batches: 1,000 events a frame, 16 frames in flight.
    async def attempt() -> float:
        async with Router(RouterConfig(port=0, name="batches")) as router:
            codec = Connection()
            frames = [
                codec.send(
                    Publish(
                        seq=s,
                        events=tuple(
                            Event(
                                type="reading", values={"Sensor": f"s-{i % 50}", "Value": i * 0.5}
                            )
                            for i in range(1000)
                        ),
                    )
                )
                for s in range(1, 17)
            ]
            gap, answers = await gap_while_sending(router, frames, last_seq=16)
            print(f"longest loop gap {gap * 1e3:.1f} ms for 16 frames of 1,000 events")
            assert any(type(m) is Ack and m.seq == 16 for m in answers)
            return gap

    assert await least_gap(attempt) <= MAX_DELAY + MARGIN


@pytest.mark.parametrize("dense", ["empty lists", "small ints", "empty maps"])
async def test_a_frame_of_dense_msgpack_is_refused_without_holding_the_loop(dense: str) -> None:
    # Every byte a value: 16 MiB of them is millions of Python objects. Decoded in one call,
    # the empty lists held the loop 8-12 s; now decoding stops at MAX_FRAME_VALUES items.
    item = {"empty lists": [], "small ints": 0, "empty maps": {}}[dense]
    rows = (MAX_FRAME_BYTES - 1024) // (MAX_FRAME_ITEMS + 3)
    event = [None, "dense", {"v": [[item] * MAX_FRAME_ITEMS] * rows}, {}]
    frame = raw_frame({"kind": "publish", "seq": 1, "events": [event]})

    async def attempt() -> float:
        async with Router(RouterConfig(port=0, name="dense")) as router:
            gap, answers = await gap_while_sending(router, [frame])
            errors = [m for m in answers if type(m) is Error]
            print(f"longest loop gap {gap * 1e3:.1f} ms for {len(frame)} bytes of {dense}")
            assert errors and f"more than {MAX_FRAME_VALUES} values" in errors[0].message
            assert router.counters["published"] == 0
            async with asyncio.timeout(10):  # and the router serves the next client as before
                reader, writer = await asyncio.open_connection(*router.address)
                writer.write(codec_hello := Connection().send(Hello(client_id="next")))
                assert codec_hello and await reader.read(1 << 16)
                writer.close()
            return gap

    assert await least_gap(attempt) <= MAX_DELAY + MARGIN


async def test_a_stream_of_dense_frames_just_small_enough_to_decode_whole_holds_the_loop_at_most_10_ms() -> (  # noqa: E501 (the name alone is 92 characters)
    None
):
    # Below STEP_ABOVE a frame is decoded, checked and freed in one piece: its size must bound
    # that (64 KiB of empty maps took 21 ms), and the turn budget the frames after it.
    rows = (STEP_ABOVE - 200) // 1003
    event: list[Any] = [None, "dense", {"v": [[{}] * 1000] * rows}, {}]
    frames = [raw_frame({"kind": "publish", "seq": s, "events": [event]}) for s in range(1, 101)]
    assert len(frames[0]) <= STEP_ABOVE

    async def attempt() -> float:
        async with Router(RouterConfig(port=0, name="dense-small")) as router:
            gap, answers = await gap_while_sending(router, frames, last_seq=100)
            print(
                f"longest loop gap {gap * 1e3:.1f} ms for 100 frames of {len(frames[0])} bytes "
                "of empty maps"
            )
            assert (
                any(type(m) is Ack and m.seq == 100 for m in answers)
                and router.counters["published"] == 100
            )
            return gap

    assert await least_gap(attempt) <= MAX_DELAY + MARGIN


@pytest.mark.parametrize(
    "shape",
    [
        "one event of nested empty lists",
        "a long string, then empty lists",
        "nested empty lists, then a map with an int key",
        "nested empty lists, then too deep",
        "nested empty lists, and a wrong meta",
    ],
)
async def test_a_dense_frame_under_the_value_cap_holds_the_loop_at_most_10_ms(shape: str) -> None:
    # A frame of at most MAX_FRAME_VALUES bytes is decoded without counting (it cannot hold
    # more values): its steps grow while they are quick, so an attacker who has read this
    # starts sparse (steps of 64 KiB held the loop 16-23 ms when the empty lists came), and
    # one event's nested values were checked in one go (120,000 empty lists: 27 ms); a wrong
    # value at the end of them was then looked for again, whole, to say what was wrong (85-100
    # ms). The wrong ones are refused with the reason, the others taken.
    lists = (
        (MAX_FRAME_VALUES - 70 * 1024) // 1001
        if shape.startswith("a long")
        else (MAX_FRAME_VALUES - 8 * 1024) // 1001
    )
    values: dict[str, Any] = {"s": "a" * 60 * 1024} if shape.startswith("a long") else {}
    values["v"] = [[[]] * 1000] * lists
    wrong = {
        "nested empty lists, then a map with an int key": ({1: 2}, "must be str"),
        "nested empty lists, then too deep": (eval("[" * 40 + "]" * 40), "nested deeper"),
    }.get(shape)
    if wrong is not None:
        values["v"] = values["v"] + [wrong[0]]
    meta: dict[str, Any] = {}
    if shape.endswith("a wrong meta"):  # good values, checked in steps; then a meta that is not
        meta, wrong = {1: "x"}, None
    frame = raw_frame({"kind": "publish", "seq": 1, "events": [[None, "dense", values, meta]]})
    assert STEP_ABOVE < len(frame) - 4 <= MAX_FRAME_VALUES

    async def attempt() -> float:
        async with Router(RouterConfig(port=0, name="dense-under-cap")) as router:
            gap, answers = await gap_while_sending(router, [frame])
            print(f"longest loop gap {gap * 1e3:.1f} ms for {len(frame)} bytes: {shape}")
            # A wrong meta: its values were good and checked in steps, not walked again to
            # refuse the meta.
            if meta:
                assert any(
                    type(m) is Error and "meta" in m.message and "str" in m.message for m in answers
                ), answers
                assert router.counters["published"] == 0
            elif wrong is None:
                assert (
                    any(type(m) is Ack and m.seq == 1 for m in answers)
                    and router.counters["published"] == 1
                )
            else:
                assert any(type(m) is Error and wrong[1] in m.message for m in answers), answers
                assert router.counters["published"] == 0
            return gap

    assert await least_gap(attempt) <= MAX_DELAY + MARGIN


async def test_the_client_library_sends_frames_a_router_takes(router: Router, client: Any) -> None:
    # Events of many values: 1,000 of them in one frame (the library's batch of events) held
    # 2,000,000 values, past what a router decodes from one frame. Batches stop at
    # BATCH_BYTES, and an event that no frame could carry is refused at publish.
    from aa.client.config import BATCH_BYTES
    from aa.mesh import InvalidValue

    got: list[Event] = []
    done = asyncio.get_running_loop().create_future()

    def take(event: Event) -> None:
        got.append(event)
        if len(got) == 1000:
            done.set_result(None)

    await client.subscribe("type == 'series'", take)
    for i in range(1000):
        await client.publish({"i": i, "samples": list(range(2000))}, type="series")
    with pytest.raises(InvalidValue, match="send large arrays as bytes"):
        await client.publish({"samples": [list(range(1000)) for _ in range(200)]}, type="series")
    await client.flush(timeout=30)
    async with asyncio.timeout(30):
        await done
    assert sorted(e.values["i"] for e in got) == list(range(1000))
    assert router.counters["published"] == 1000 and BATCH_BYTES < MAX_FRAME_VALUES


def http_post(address: tuple[str, int], path: str, body: bytes) -> tuple[int, bytes]:
    """In a thread: one POST over a blocking socket; the status and the body."""
    with socket.create_connection(address, timeout=60) as sock:
        sock.sendall(
            b"POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (path.encode(), len(body)) + body
        )
        answer = b""
        while data := sock.recv(1 << 16):
            answer += data
    head, _, payload = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), payload


@pytest.mark.parametrize(
    "inner, n, status",
    [("{}", 1 << 18, 413), ("0", 1 << 18, 413), ("{}", 4000, 201), ("0", 8000, 201)],
)
async def test_a_dense_http_body_holds_the_loop_at_most_10_ms(
    inner: str, n: int, status: int
) -> None:
    # JSON is parsed and checked in one piece on the router's loop: a megabyte of empty maps
    # held it 360 ms. Bodies of more than MAX_BODY_VALUES values are refused unparsed.
    from aa.http_api import MAX_BODY_VALUES, HttpEndpoint

    body = ('{"type": "dense", "values": {"v": [' + ",".join([inner] * n) + "]}}").encode()

    async def attempt() -> float:
        endpoint = HttpEndpoint(port=0)
        async with Router(RouterConfig(port=0, name="http-dense"), endpoints=[endpoint]):
            work = asyncio.ensure_future(
                asyncio.to_thread(http_post, endpoint.address, "/events", body)
            )
            gap = await longest_gap_while(work)
            code, answer = await work
            print(f"longest loop gap {gap * 1e3:.1f} ms for {len(body)} bytes of {inner!r}: {code}")
            assert code == status
            assert status == 201 or f"more than {MAX_BODY_VALUES} values".encode() in answer
            return gap

    assert await least_gap(attempt) <= MAX_DELAY + MARGIN
