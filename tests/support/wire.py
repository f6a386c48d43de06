"""Blocking raw-socket clients of a router, speaking frames through `aa.mesh.Connection`:
for black-box tests that drive a real `aa router` process from plain functions (hypothesis
tests cannot await). `Bystander` is the well-behaved pair — a subscriber and a publisher —
whose traffic must go on, untouched, whatever other connections do."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable
from typing import Any, Final

import msgpack

from aa.mesh import Connection, Event, PatternSpec
from aa.mesh.protocol import Ack, Deliver, Error, Hello, Message, Publish, Subscribe, Subscribed

__all__ = ["BAD_EVENTS", "Wire", "Bystander", "frame_bytes"]


#: Events (``[id, quench, values, meta]`` as a frame carries them) that every reader of
#: events refuses, each for its own reason: wrong shapes, ids, keys, extension types and
#: nesting. A reader's tests put them in its own frames.
BAD_EVENTS: Final[list[Any]] = [
    "not a list",
    ["a-1", None, {"x": 1}],
    ["", None, {"x": 1}, {}],
    ["a" * 65, None, {"x": 1}, {}],
    [5, None, {"x": 1}, {}],
    ["a-1", 5, {"x": 1}, {}],
    ["a-1", None, [1], {}],
    ["a-1", None, {"x": 1}, [1]],
    ["a-1", None, {1: 1}, {}],
    ["a-1", None, {"x": 1}, {1: 1}],
    ["a-1", None, {"x": msgpack.ExtType(1, b"not a date")}, {}],
    ["a-1", None, {"x": msgpack.ExtType(9, b"")}, {}],
    ["a-1", None, {"x": 1}, {"t": msgpack.ExtType(9, b"")}],
    ["a-1", None, {"x": {"y": {2: 1}}}, {}],
    [
        "a-1",
        None,
        {"x": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]},
        {},
    ],
]


def frame_bytes(payload: bytes, declared: int | None = None) -> bytes:
    """A frame: the 4-byte big-endian length (*declared*, or the payload's), the payload."""
    return (len(payload) if declared is None else declared).to_bytes(4, "big") + payload


class Wire:
    """One blocking connection to ``host:port`` with its own codec."""

    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.codec = Connection()
        self.got: list[Message] = []
        self.closed = False  # the router closed it (EOF or reset)

    def send(self, *messages: Message) -> None:
        self.sock.sendall(b"".join(self.codec.send(m) for m in messages))

    def read_until(self, done: Callable[[list[Message]], bool], timeout: float) -> bool:
        """Read frames into `got` until ``done(got)``, EOF, or *timeout* seconds; whether
        ``done`` held."""
        deadline = time.monotonic() + timeout
        while not done(self.got):
            left = deadline - time.monotonic()
            if left <= 0 or self.closed:
                return False
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                return False
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            if not data:
                self.closed = True
                continue
            self.codec.receive_data(data)
            self.got += self.codec.next_messages()
        return True

    def close(self) -> None:
        self.sock.close()


class Bystander:
    """A subscriber to this bystander's own events and a publisher of them. `round_trip()`
    publishes the next one, waits for its ack, and checks the subscriber got exactly every
    event published so far, in order (nothing lost, nothing twice)."""

    def __init__(self, host: str, port: int) -> None:
        self.token = uuid.uuid4().hex
        self.sub = Wire(host, port)
        self.sub.send(
            Hello(client_id=f"bystander-sub-{self.token[:8]}"),
            Subscribe(sub_id=1, pattern=PatternSpec(source=f"token == {self.token!r}")),
        )
        assert self.sub.read_until(lambda got: any(type(m) is Subscribed for m in got), 30), (
            self.sub.got
        )
        self.pub = Wire(host, port)
        self.pub.send(Hello(client_id=f"bystander-pub-{self.token[:8]}"))
        self.sent = 0
        self.numbers: list[int] = []  # what the subscriber got, in order

    def received(self) -> list[int]:
        """Every event number the subscriber got so far (frames read are consumed)."""
        for m in self.sub.got:
            if type(m) is Deliver:
                self.numbers += [event.values["n"] for _, event in m.items]  # type: ignore[attr-defined]
        errors = [m for m in self.sub.got if type(m) is Error]
        assert not errors, errors
        self.sub.got.clear()
        return self.numbers

    def round_trip(self, timeout: float = 10.0) -> None:
        self.sent += 1
        n = self.sent
        self.pub.send(Publish(seq=n, events=(Event(values={"token": self.token, "n": n}),)))
        acked = self.pub.read_until(
            lambda got: any(type(m) is Ack and m.seq >= n for m in got), timeout
        )  # type: ignore[attr-defined]
        errors = [m for m in self.pub.got if type(m) is Error]
        assert not errors, errors
        assert acked, f"publish {n} not acknowledged within {timeout} s"
        assert self.sub.read_until(lambda got: len(self.received()) >= n, timeout), self.received()[
            -5:
        ]
        assert self.received() == list(range(1, n + 1))
        self.pub.got.clear()

    def close(self) -> None:
        self.sub.close()
        self.pub.close()
