"""The pipe between the router and a worker (pure: no I/O). A frame is a 4-byte big-endian
length, then one msgpack array packed by `aa.mesh.protocol.pack` (Aa's value conventions, so
an int stays an int and a naive datetime stays naive). Messages are arrays whose first
item names them::

    router → worker                          worker → router
    ["hello", facts]                         ["ready"]
    ["sub", wkey, iid, kernel, format,       ["refused", wkey, code, message]
            source, params, client, kind, state]
    ["update", wkey, params]                 ["stop", [wkey...], code, message]
    ["unsub", wkey]
    ["batch", seq, peer_count, events]       ["errors", [[[wkey...], error, count,
                                                          line, text], ...]]
                                             ["done", seq, deliveries, derived, stops,
                                                     cpu]
    ["probe", seq, wkey, needs, events]      ["probed", seq, results, stops]
    ["export", seq, [wkey...]]               ["exported", seq, [[wkey, state], ...]]
    ["precompile", kernel, format, source]
    ["uncache"]

`events` and `derived` are one msgpack bin each: the array of the events' wire arrays
(`event_to_wire`), so a batch is packed once in C. `deliveries` is a flat array
[wkey, ref, wkey, ref, ...], in delivery order: ref >= 0 is the index of a batch event
(delivered as the router's own object), ref < 0 is derived event -1 - ref. A `state` is a script's
state carried off probation (`carry.py`), empty bytes for none, None in an answer where it cannot be
carried. `cpu` is flat too, [iid, ns, iid, ns, ...]: the CPU each instance took in the batch.

The shared slot: the worker also writes, into a 24-byte shared page, which pattern it is
running (the instance id while compiling; minus the wkey of a subscriber of the bucket it
evaluates, so a kill stops only the subscribers with those params), since when and for how
long at most (`SLOT`), so the router's watchdog knows whom to blame when it kills a worker
stuck in one long call into C.
"""

from __future__ import annotations

import struct
from typing import Any, Final

from aa.mesh.protocol import pack, unpack

__all__ = ["FrameReader", "encode", "SLOT", "SLOT_BYTES", "MAX_FRAME"]

#: (instance id or -wkey, started at in monotonic ns or 0 when idle, limit in ns).
SLOT: Final = struct.Struct("<qqq")
SLOT_BYTES: Final = 4096
#: Largest frame either side accepts, in bytes.
MAX_FRAME: Final = 128 * 1024 * 1024
_HEADER = struct.Struct(">I")


def encode(message: list[Any]) -> bytes:
    """The frame of *message*."""
    body = pack(message)
    return _HEADER.pack(len(body)) + body


class FrameReader:
    """Bytes in, messages out. `feed(data)`, then `next()` until it returns None."""

    __slots__ = ("_buf", "_pos")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next(self) -> list[Any] | None:
        buf, pos = self._buf, self._pos
        if len(buf) - pos < 4:
            return None
        (size,) = _HEADER.unpack_from(buf, pos)
        if size > MAX_FRAME:
            raise ValueError(f"worker frame of {size:,} bytes")
        end = pos + 4 + size
        if len(buf) < end:
            return None
        message = unpack(bytes(buf[pos + 4 : end]))
        if end == len(buf):
            self._buf, self._pos = bytearray(), 0
        elif end > 1 << 20:
            del buf[:end]
            self._pos = 0
        else:
            self._pos = end
        if type(message) is not list or not message:
            raise ValueError("a worker frame must hold a non-empty array")
        return message
