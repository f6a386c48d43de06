"""The wire fuzzer (issue 16): hypothesis-made frames sent to a real `aa router` process over
a real socket — random bytes; well-formed frames of every message kind with a field
mutated, dropped or added; wrong and huge declared lengths; deep and big maps; client hello
and peer hello variants with fuzzed follow-ups. After every example:

- the router is alive, and a bystander's publish is acknowledged and delivered to its
  subscriber, with every earlier one, in order (nothing lost, nothing twice);
- the fuzzing connection got an answer within a bound — an error frame, its close, or the
  pong to the ping sent after the fuzz when the bytes were valid — unless its bytes ended
  inside an unfinished frame, which the router must wait for; and once the fuzzer closes
  its side, the router closes too, within the bound (no connection left hanging).

At the end the router's resident memory (read from /proc) is back within 20 MB of what it
was after warm-up: nothing a bad frame left behind waits for the garbage collector, which
`aa router` tunes to run rarely. Derandomized in CI (tests/conftest.py's "ci" profile).

Peer addresses in fuzzed frames are loopback port 1 only, and the router runs with
``--allow-peers 127.0.0.0/8``: whatever a fuzzed hello claims, the router dials nothing
beyond this machine.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.routerproc import RouterProcess
from support.wire import Bystander, Wire, frame_bytes

from aa.mesh.protocol import (
    MAX_FRAME_BYTES,
    MESSAGE_KINDS,
    Connection,
    Error,
    Hello,
    PeerHello,
    Ping,
    Pong,
    pack,
)

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="reads a process's RSS from /proc (Linux)"
)

#: Seconds the router has to answer a fuzzed connection or close it (generous: a loaded
#: 2-core CI machine; the router answers in milliseconds).
ANSWER_BOUND = 10.0
#: Bytes of resident memory the router may keep over its warmed-up size (the issue's figure).
RSS_SLACK = 20 * 1024 * 1024
#: A peer address that is loopback and refuses at once: what fuzzed hellos may name.
DEAD_PEER = "127.0.0.1:1"

HELLO = Connection().send(Hello(client_id="fuzzer"))
PEER_HELLO = Connection().send(PeerHello(router_id="fuzz-peer", name="fuzz", peer=DEAD_PEER))

# -- a valid wire map of every message kind, to mutate ----------------------------------------

_EVENT = [None, None, {"a": 1}, {}]
_BY_TYPE: dict[str, Any] = {
    "int": 1,
    "str": "x",
    "bool": False,
    "float": 1.0,
    "Values": {},
    "int | str": 1,
    "str | None": None,
    "int | None": None,
    "float | None": None,
    "Values | None": None,
    "datetime | None": None,
    "float | str | None": None,
    "int | str | None": None,
    "tuple[str, ...]": [],
    "tuple[KnownRouter, ...]": [{"peer": DEAD_PEER, "id": "fz-known"}],
    "tuple[tuple[str, str, bool], ...]": [["a", "x", True]],
    "PatternSpec": {"source": "a > 0"},
    "tuple[Event, ...]": [_EVENT],
    "tuple[FloodGroup, ...]": [[3, ["fuzz-peer"], ["fz-1"], pack([["fz-1", None, {"a": 1}, {}]])]],
    "tuple[tuple[tuple[int, ...], Event], ...]": [[[1], _EVENT]],
}
_OVERRIDES: dict[str, dict[str, Any]] = {
    "subscribe": {"overflow": "notify"},
    "control": {"path": ["fuzz-peer"], "ttl": 3, "topic": "fuzz.topic"},
    "peer-hello": {"peer": DEAD_PEER, "router_id": "fuzz-peer"},
}


def _sample(kind: str) -> dict[str, Any]:
    cls = MESSAGE_KINDS[kind]
    wire = {"kind": kind, **{f.name: _BY_TYPE[str(f.type)] for f in dataclasses.fields(cls)}}  # type: ignore[arg-type]
    return {**wire, **_OVERRIDES.get(kind, {})}


SAMPLES = {kind: _sample(kind) for kind in MESSAGE_KINDS}


def test_every_sample_is_a_valid_message() -> None:
    """The fuzzer mutates valid frames: the samples themselves must decode (else every
    mutation would only test the first check)."""
    for kind, wire in SAMPLES.items():
        codec = Connection()
        codec.receive_data(frame_bytes(msgpack.packb(wire, use_bin_type=True)))
        assert type(codec.next_message()).kind == kind  # type: ignore[union-attr]


# -- strategies ------------------------------------------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=30)
    | st.binary(max_size=30)
    | st.sampled_from(["", DEAD_PEER, "x" * 70, "\x00", "True", "fz-1", -1, 0, 1, 2, 2**31])
    | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=12))
    | st.builds(msgpack.Timestamp, st.integers(-(2**40), 2**40), st.integers(0, 999_999_999))
)
values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=6)
        | st.dictionaries(st.text(max_size=6) | st.integers(-(2**63), 2**64 - 1), inner, max_size=6)
    ),
    max_leaves=25,
)
prefixes = st.sampled_from([b"", HELLO, PEER_HELLO])


def _packed(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


@st.composite
def mutated_frames(draw: st.DrawFn) -> bytes:
    """A valid map of some kind with fields replaced, dropped or added; sometimes inside a
    wrongly declared length."""
    wire = dict(SAMPLES[draw(st.sampled_from(sorted(SAMPLES)))])
    for _ in range(draw(st.integers(1, 3))):
        key = draw((st.sampled_from(sorted(wire)) if wire else st.nothing()) | st.text(max_size=8))
        action = draw(st.sampled_from(["replace", "replace", "drop"]))
        if action == "drop":
            wire.pop(key, None)
        else:
            wire[key] = draw(values)
    payload = _packed(wire)
    declared = draw(st.none() | st.integers(0, len(payload) + 8))
    return draw(prefixes) + frame_bytes(payload, declared)


@st.composite
def hellos(draw: st.DrawFn) -> bytes:
    """A client or peer hello with fuzzed fields, then a fuzzed frame of what may follow."""
    wire = dict(SAMPLES[draw(st.sampled_from(["hello", "peer-hello"]))])
    for key in draw(st.lists(st.sampled_from(sorted(wire)), max_size=3, unique=True)):
        wire[key] = draw(values)
    follow = dict(
        SAMPLES[
            draw(
                st.sampled_from(
                    ["flood", "control", "peer-routers", "publish", "subscribe", "ping"]
                )
            )
        ]
    )
    key = draw(st.sampled_from(sorted(follow)))
    follow[key] = draw(values)
    return frame_bytes(_packed(wire)) + frame_bytes(_packed(follow))


@st.composite
def floods(draw: st.DrawFn) -> bytes:
    """A peer hello, then a flood whose header is sound and whose blob is not: events with
    fuzzed parts, ids that do not match the header's, bytes that are not msgpack."""
    n = draw(st.integers(1, 4))
    ids = [f"fz-{draw(st.integers(0, 10**6))}" for _ in range(n)]
    events: list[Any] = [
        [ids[i], draw(st.none() | st.text(max_size=5)), {"a": i}, {}] for i in range(n)
    ]
    for _ in range(draw(st.integers(0, 3))):
        event = events[draw(st.integers(0, n - 1))]
        event[draw(st.integers(0, 3))] = draw(values)
    if draw(st.booleans()):
        events.append(draw(values))
    blob = draw(st.sampled_from([pack(events), draw(st.binary(max_size=40))]))
    header_ids = draw(st.sampled_from([ids, ids[::-1], ids[:-1], [*ids, "fz-extra"]]))
    group = [draw(st.integers(-2, 300)), ["fuzz-peer"], header_ids, blob]
    return PEER_HELLO + frame_bytes(_packed({"kind": "flood", "groups": [group]}))


@st.composite
def shapes(draw: st.DrawFn) -> bytes:
    """Huge declared lengths, deep nesting and big maps or lists, at the top of a frame or
    as an event's values."""
    which = draw(st.sampled_from(["huge", "deep", "big", "garbage"]))
    if which == "huge":
        return draw(prefixes) + frame_bytes(
            draw(st.binary(max_size=64)), draw(st.integers(MAX_FRAME_BYTES + 1, 2**32 - 1))
        )
    if which == "garbage":  # sometimes a frame of a broken timestamp (ext -1 of 3 bytes)
        ext = draw(st.sampled_from([b"", frame_bytes(b"\xc7\x03\xff\x01\x02\x03")]))
        return draw(prefixes) + ext + draw(st.binary(min_size=1, max_size=400))
    if which == "deep":
        depth = draw(st.integers(50, 200_000))
        opener = draw(st.sampled_from([b"\x91", b"\x81\xa1k"]))  # [[[...]]] or {"k": {"k": ...}}
        body = opener * depth + b"\xc0"
    else:
        n = draw(st.integers(5_000, 120_000))
        body = (
            b"\xdf"
            + n.to_bytes(4, "big")
            + b"".join(b"\xce" + i.to_bytes(4, "big") + b"\xc0" for i in range(n))
            if draw(st.booleans())
            else b"\xdd" + n.to_bytes(4, "big") + b"\x01" * n
        )
    if draw(st.booleans()):  # the shape as a frame of its own
        return draw(prefixes) + frame_bytes(body)
    head = _packed({"kind": "publish", "seq": 1})[1:]  # the map's items without its header
    event = b"\x94\xc0\xc0" + body + b"\x80"  # [nil, nil, <body>, {}]
    return HELLO + frame_bytes(b"\x83" + head + b"\xa6events\x91" + event)


# -- the harness -----------------------------------------------------------------------------


def ends_inside_a_frame(data: bytes) -> bool:
    """Whether *data* ends in a frame the router must wait for: a declared length within the
    cap and more than the bytes that follow."""
    pos = 0
    while len(data) - pos >= 4:
        size = int.from_bytes(data[pos : pos + 4], "big")
        if size > MAX_FRAME_BYTES:
            return False  # refused at once
        if len(data) - pos - 4 < size:
            return True
        pos += 4 + size
    return len(data) - pos > 0  # a header cut short


class Fuzzing:
    def __init__(self, router: RouterProcess) -> None:
        self.router = router
        self.bystander = Bystander(router.host, router.port)
        self.examples = 0
        self.outcomes: dict[str, int] = {}

    def run(self, data: bytes) -> None:
        """Send *data* on a fresh connection, then a ping; check the answer, the close, the
        router and the bystander."""
        self.examples += 1
        probe = Connection().send(Ping(token=424242))
        wire = Wire(self.router.host, self.router.port)
        try:
            try:
                wire.sock.sendall(data + probe)
            except (BrokenPipeError, ConnectionResetError):
                wire.closed = True  # the router closed before taking it all: an answer too

            def answered(got: list[Any]) -> bool:
                return any(type(m) is Error or (type(m) is Pong and m.token == 424242) for m in got)

            answer = wire.read_until(answered, ANSWER_BOUND) or wire.closed
            waits = ends_inside_a_frame(data + probe)
            assert answer or waits, f"no answer within {ANSWER_BOUND} s to {data[:200]!r}"
            outcome = (
                "error"
                if any(type(m) is Error for m in wire.got)
                else "pong"
                if answer and not wire.closed
                else "closed"
                if wire.closed
                else "waiting"
            )
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
            try:
                wire.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            wire.read_until(lambda got: False, ANSWER_BOUND)
            assert wire.closed, (
                f"the router kept the connection open after the fuzzer closed it: {data[:200]!r}"
            )
        finally:
            wire.close()
        assert self.router.alive(), self.router.stderr_tail()
        self.bystander.round_trip()


@pytest.fixture(scope="module")
def fuzzing() -> Iterator[Fuzzing]:
    with RouterProcess("--no-http", "--allow-peers", "127.0.0.0/8", "--keepalive", "0.5") as router:
        f = Fuzzing(router)
        try:
            yield f
        finally:
            f.bystander.close()


#: Multiplies every fuzzer's number of examples: ``AA_FUZZ_SCALE=20`` for a long hunt.
FUZZ_SCALE = float(os.environ.get("AA_FUZZ_SCALE", "1"))


def fuzz(examples: int) -> settings:
    """Settings of one fuzzer (on top of the loaded profile: derandomized in CI)."""
    return settings(
        max_examples=max(1, round(examples * FUZZ_SCALE)),
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )


def test_fuzzed_frames_harm_nobody_and_leave_no_memory_behind(fuzzing: Fuzzing) -> None:
    # Warm up: every kind once, valid, and some bystander traffic, before the baseline.
    for wire in SAMPLES.values():
        fuzzing.run(HELLO + frame_bytes(_packed(wire)))
        fuzzing.run(PEER_HELLO + frame_bytes(_packed(wire)))
    for _ in range(200):
        fuzzing.bystander.round_trip()
    before = fuzzing.router.rss()

    @fuzz(400)
    @given(mutated_frames())
    def mutated(data: bytes) -> None:
        fuzzing.run(data)

    @fuzz(200)
    @given(hellos())
    def hello_variants(data: bytes) -> None:
        fuzzing.run(data)

    @fuzz(100)
    @given(shapes())
    def odd_shapes(data: bytes) -> None:
        fuzzing.run(data)

    @fuzz(150)
    @given(floods())
    def bad_floods(data: bytes) -> None:
        fuzzing.run(data)

    ran = {}
    for fuzzer in (mutated, hello_variants, odd_shapes, bad_floods):
        start = fuzzing.examples
        fuzzer()
        ran[fuzzer.__name__] = fuzzing.examples - start
    after = fuzzing.router.rss()
    print(
        f"fuzzed {fuzzing.examples} connections {ran} {fuzzing.outcomes}; RSS {before / 2**20:.1f} "
        f"MiB -> {after / 2**20:.1f} MiB"
    )
    assert after - before < RSS_SLACK, (
        f"RSS {before / 2**20:.1f} MiB after warm-up, {after / 2**20:.1f} MiB after fuzzing"
    )
