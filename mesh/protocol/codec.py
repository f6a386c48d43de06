"""The frame codec (pure: no sockets, no asyncio).

A frame is a 4-byte big-endian length, then that many bytes of one msgpack map with a
`kind` (see `aa.mesh.protocol.messages`). `Connection` turns bytes into messages and messages into
bytes, in the manner of h11: feed `receive_data(data)`, then call `next_message()` until it
returns `NEED_DATA`; `send(message)` returns the bytes to write.

A frame over `STEP_ABOVE` bytes is decoded a piece at a time, as its bytes arrive (they are
never gathered into one buffer: growing that by copies would hold the loop too):
`next_message(stepwise=True)` does one bounded step of it per call and returns `IN_PROGRESS`
until the message is whole (`NEED_DATA` when the bytes so far are decoded), so the caller,
which owns the clock, decides how many steps fit in its turn: one frame however large never
holds a router's event loop for long (decoded in one C call, a frame of many empty lists
would take seconds). Such a frame also holds at most `MAX_FRAME_VALUES` items in all its lists
and maps together: decoding stops as soon as it has more.

A frame longer than the cap, or one that does not decode to a known, well-formed message,
raises a `ProtocolError` subclass. The codec is then broken: the owner answers with an error
frame and closes that one connection, and nothing else is affected.

Datetimes: aware ones travel as msgpack Timestamps (the C packer handles them, no Python
call per value) and decode as UTC; naive ones travel as extension type 1 holding the ISO
text and decode naive, so a naive datetime is never silently given a zone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Sequence
from datetime import datetime
from time import perf_counter as _perf
from typing import Any, Final

import msgpack

from ..errors import (
    ForeignProtocol,
    FrameTooLarge,
    MalformedFrame,
    ProtocolError,
    UnknownMessage,
    UsageError,
)
from ..event import Event
from .messages import MESSAGE_KINDS, Message
from .wire_events import event_from_wire

__all__ = [
    "Connection",
    "NEED_DATA",
    "IN_PROGRESS",
    "MAX_FRAME_BYTES",
    "MAX_FRAME_VALUES",
    "STEP_ABOVE",
    "DELIVER_HEAD",
    "PUBLISH_HEAD",
    "pack",
    "unpack",
    "packed_event",
    "packed_fields",
    "unpacked_event",
    "pack_events",
    "pack_with_meta",
]

#: Largest frame accepted or sent, in bytes (payload, without the 4-byte header). A batch of
#: a few thousand typical events fits in well under 1 MiB; 16 MiB leaves room for bulky
#: values while bounding what one peer can make a router buffer.
MAX_FRAME_BYTES: Final = 16 * 1024 * 1024
#: Frames larger than this (bytes) are decoded in steps. Below it one frame is bounded by its
#: size: the densest msgpack (empty maps or lists) costs ~300 ns per byte to build, check
#: and free, ~2.5 ms here.
STEP_ABOVE: Final = 8 * 1024
#: Bytes of a large frame handed to the decoder in its first step: ~1 ms of the densest
#: msgpack (each empty list built and counted). A step that built fewer than one list, map
#: or item of one per `_SPARSE` bytes doubles the next, up to `STEP_BYTES_MAX` (ordinary events hold
#: about one per 11 bytes and decode at ~20 ns a byte; each piece that ends inside a value
#: costs a failed attempt): the work of one step stays near 8,000 items either way.
STEP_BYTES: Final = 4 * 1024
STEP_BYTES_MAX: Final = 16 * 1024
_SPARSE = 8
#: Without counting (a frame too small to hold too many values) a step doubles while its
#: bytes took under 1/`_STEP_GROWS_BELOW` seconds each: 40 ns a byte, twice what ordinary
#: events cost and a seventh of the densest msgpack (~300 ns), so dense steps stay 4 KiB.
_STEP_GROWS_BELOW = 25_000_000
#: Most items (list elements and map entries, counted together, at every depth) in a frame
#: decoded in steps. Bytes alone do not bound the work: one byte is a whole empty list, and
#: freeing what a refused frame built is one more uninterrupted pass (~4 ms for this many). A
#: publish of 10,000 small events has ~70,000; the client library's frames hold at most
#: `aa.client.config.BATCH_BYTES` bytes, so never more items than that. Larger: `bytes`.
MAX_FRAME_VALUES: Final = 128 * 1024

_HEADER = 4
_EXT_NAIVE_DATETIME = 1


class _NeedData:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


#: Returned by `Connection.next_message()` when no whole frame is buffered yet.
NEED_DATA: Final = _NeedData()


class _InProgress:
    __slots__ = ()

    def __repr__(self) -> str:
        return "IN_PROGRESS"


#: Returned by `Connection.next_message(stepwise=True)` after a step of a large frame that
#: did not finish it: call again (now, or on a later turn of the loop) to go on.
IN_PROGRESS: Final = _InProgress()


def _malformed(exc: Exception, max_items: int | None) -> MalformedFrame:
    """What msgpack's error *exc* means for the sender."""
    if max_items is not None and isinstance(exc, ValueError) and "exceeds max_" in str(exc):
        return MalformedFrame(
            f"frame has a list or map of more than {max_items} items "
            f"(at most {max_items} per frame: send smaller batches)"
        )
    return MalformedFrame(f"frame is not valid msgpack: {exc}")


def _tally(cap: int) -> tuple[Callable[[Any], Any], Callable[[], int]]:
    """msgpack's hook for every list and map a stepped decode builds, which counts their
    items and stops the decode past *cap* items; and a function that reads the work done so
    far, items and lists and maps together (an empty list is work and holds no item).
    Closures, not an object's `__call__`: the hook runs ~3 times per event, and a method call
    cost twice as much."""
    items = built = 0

    def hook(value: Any) -> Any:
        nonlocal items, built
        items += len(value)
        built += 1
        if items > cap:
            raise MalformedFrame(
                f"frame has more than {cap} values in its lists and maps "
                f"(at most {cap} per frame: send smaller batches)"
            )
        return value

    return hook, lambda: items + built


#: First bytes of an HTTP request or response, which read as a frame length far over the cap.
_HTTP_STARTS = (
    b"HTTP",
    b"GET ",
    b"POST",
    b"PUT ",
    b"HEAD",
    b"DELE",
    b"OPTI",
    b"PATC",
    b"CONN",
    b"TRAC",
)


def _foreign(head: bytes | bytearray) -> ForeignProtocol | None:
    """What the first bytes of an impossible frame say the other end speaks, if it is clear."""
    if head[0] == 0x16 and head[1] == 0x03:  # a TLS record: handshake, version 3.x
        return ForeignProtocol("a TLS handshake, not a frame: this end does not speak TLS")
    if head in _HTTP_STARTS:
        what = "answer" if head == b"HTTP" else "request"
        return ForeignProtocol(
            f"an HTTP {what}, not a frame: that end speaks HTTP, not Aa's protocol "
            "(a router's HTTP port is not its client port)"
        )
    return None


def _default(obj: Any) -> Any:
    if isinstance(obj, datetime):  # only naive ones reach here: aware ones are Timestamps
        return msgpack.ExtType(_EXT_NAIVE_DATETIME, obj.isoformat().encode())
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"cannot encode {type(obj).__name__}")


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _EXT_NAIVE_DATETIME:
        try:
            return datetime.fromisoformat(data.decode())
        except (UnicodeDecodeError, ValueError):
            raise MalformedFrame("bad datetime extension value") from None
    raise MalformedFrame(f"unknown msgpack extension type {code}")


def _packer() -> msgpack.Packer:
    return msgpack.Packer(use_bin_type=True, datetime=True, default=_default)


#: The start of every `Deliver` frame: a map of two, its kind, and the key of its items.
DELIVER_HEAD: Final = (
    _packer().pack_map_header(2)
    + _packer().pack("kind")
    + _packer().pack("deliver")
    + _packer().pack("items")
)
#: The start of every `Publish` frame the codec makes: a map of three, its kind, the seq's key.
PUBLISH_HEAD: Final = (
    _packer().pack_map_header(3)
    + _packer().pack("kind")
    + _packer().pack("publish")
    + _packer().pack("seq")
)
_EVENTS_KEY: Final = _packer().pack("events")


def pack(obj: Any) -> bytes:
    """msgpack bytes of *obj* with Aa's conventions (for files and stores, not frames)."""
    return _packer().pack(obj)


_local = threading.local()
#: Stores `Event.packed` past the frozen guard (the slot's own setter: no attribute lookup).
_set_packed: Callable[[Event, bytes], None] = vars(Event)["packed"].__set__


def _thread_packer() -> msgpack.Packer:
    packer = getattr(_local, "packer", None)
    if packer is None:
        packer = _local.packer = _packer()
    return packer


def packed_event(event: Event) -> bytes:
    """*event* as msgpack ``[id, type, values, meta]`` (the array every frame, cache and log
    carries), made once per event object and kept on it (`Event.packed`): a router delivers,
    caches, floods and logs the same bytes. Raises `UsageError` outside the value model."""
    data = event.packed
    if data is None:
        data = packed_fields(event.id, event.type, event.values, event.meta)
        _set_packed(event, data)
    return data


def packed_fields(id: str | None, type: str | None, values: Any, meta: Any) -> bytes:
    """The bytes `packed_event` makes of an event of these fields, without the event: for a
    publisher that keeps only the bytes. Raises `UsageError` outside the value model."""
    try:
        return _thread_packer().pack([id, type, values, meta])
    except (TypeError, ValueError, OverflowError) as exc:
        _local.packer = _packer()  # a failed pack may leave it dirty
        raise UsageError(f"cannot encode event {id}: {exc}") from None


def pack_with_meta(events: Sequence[Event], meta: bytes, sources: Sequence[Event] = ()) -> None:
    """Give each of *events* its `packed_event` bytes, made from its id, type and values and
    *meta*, the bytes `pack` made of the meta map every one of them carries (a router stamps
    a batch alike): the same bytes, without packing the same map again per event (its time
    alone costs more than five plain values). An event outside the value model is left
    unpacked, for `packed_event` to say why when it is asked.

    *sources*: the events *events* were made from, in the same order (a router's stamping
    gives each stamped event its source's values map, and may leave sources out). Where a
    source has the same id, type and values map and no meta, and already has its bytes (the
    router's compiled reader keeps a publish's), those bytes up to its empty meta are the
    event's too: the values are not packed again."""
    packer = _thread_packer()
    later = iter(sources)
    source = next(later, None)
    for event in events:
        if event.packed is not None:
            continue
        values = event.values
        while source is not None and source.values is not values:
            source = next(later, None)
        if source is not None:
            data = source.packed
            if (
                data is not None
                and data[-1] == 0x80
                and not source.meta
                and source.id == event.id
                and source.type == event.type
            ):
                _set_packed(event, data[:-1] + meta)
                continue
        try:
            head = packer.pack((event.id, event.type, values))
        except (TypeError, ValueError, OverflowError):
            packer = _local.packer = _packer()  # a failed pack may leave it dirty
            continue
        # ``head`` is a 3-element array: its one-byte header becomes a 4-element one's.
        _set_packed(event, b"\x94" + head[1:] + meta)


def unpacked_event(data: bytes) -> Event:
    """The event *data* (bytes of `packed_event`) holds, checked as a peer's, and keeping
    *data* as its bytes. Raises `MalformedFrame`."""
    event = event_from_wire(unpack(data))
    _set_packed(event, data)
    return event


def pack_events(events: Sequence[Event]) -> bytes:
    """*events* as one msgpack array of ``[id, type, values, meta]`` — the bytes `pack`
    makes of that list, from each event's `packed_event`. Raises `UsageError`."""
    return _thread_packer().pack_array_header(len(events)) + b"".join(map(packed_event, events))


def unpack(data: bytes) -> Any:
    """The inverse of `pack`."""
    return msgpack.unpackb(data, raw=False, timestamp=3, ext_hook=_ext_hook, strict_map_key=False)


class Connection:
    """One end of a framed msgpack stream.

    >>> a, b = Connection(), Connection()
    >>> from aa.mesh.protocol.messages import Ping
    >>> b.receive_data(a.send(Ping(token=7)))
    >>> b.next_message()
    Ping(token=7)
    >>> b.next_message()
    NEED_DATA
    """

    __slots__ = (
        "max_frame",
        "max_items",
        "max_values",
        "_buf",
        "_pos",
        "_packer",
        "_broken",
        "_stepping",
        "_fed",
    )

    def __init__(
        self,
        *,
        max_frame: int = MAX_FRAME_BYTES,
        max_items: int | None = None,
        max_values: int = MAX_FRAME_VALUES,
    ) -> None:
        if max_frame <= 0:
            raise UsageError("max_frame must be positive")
        if max_items is not None and max_items <= 0:
            raise UsageError("max_items must be positive or None")
        self.max_frame = max_frame
        #: Most items in one list or map of a received frame (None: only the frame cap). A
        #: frame is decoded in one C call that holds the event loop; this bounds what one
        #: frame costs to decode and dispatch (a router's client sessions set it).
        self.max_items = max_items
        #: Most items in all lists and maps of a frame decoded in steps (`MAX_FRAME_VALUES`).
        self.max_values = max_values
        self._buf = bytearray()
        self._pos = 0
        self._packer = _packer()
        self._broken: ProtocolError | None = None
        self._stepping: Generator[_NeedData | None, None, Message] | None = (
            None  # a large frame, part decoded
        )
        self._fed = 0  # bytes of that frame handed to its decoder

    # -- receiving ---------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Buffer bytes read from the peer (dropped once the stream is broken)."""
        if self._broken is not None:
            return
        if self._pos and self._pos >= len(self._buf) // 2:
            del self._buf[: self._pos]  # compact now and then, not per frame
            self._pos = 0
        self._buf += data

    def next_message(self, stepwise: bool = False) -> Message | _NeedData | _InProgress:
        """The next whole message, or `NEED_DATA`; *stepwise*, one step of a large frame per
        call, `IN_PROGRESS` until it is whole. Raises `ProtocolError` on a bad frame, and the
        same error again on every later call: the stream cannot be resynchronised."""
        if self._broken is not None:
            raise self._fresh_error()
        if self._stepping is not None:
            return self._step(stepwise)
        buf, pos = self._buf, self._pos
        if len(buf) - pos < _HEADER:
            return NEED_DATA
        size = int.from_bytes(buf[pos : pos + _HEADER], "big")
        if size > self.max_frame:
            self._break(
                _foreign(buf[pos : pos + _HEADER])
                or FrameTooLarge(f"frame of {size} bytes is over the cap of {self.max_frame}")
            )
            raise self._fresh_error()
        if size > STEP_ABOVE:
            self._pos += _HEADER
            self._stepping = self._steps(size)
            return self._step(stepwise)
        end = pos + _HEADER + size
        if len(buf) < end:
            return NEED_DATA
        payload = bytes(memoryview(buf)[pos + _HEADER : end])
        self._pos = end
        try:
            return self._decode(payload, self.max_items)
        except (MalformedFrame, UnknownMessage) as exc:
            self._break(exc)
            raise self._fresh_error() from None

    def whole_frame(self, head: bytes, most: int | None = None) -> bytes | _NeedData | None:
        """For a reader of its own of the frames that start with *head*: the payload of the
        next frame when it is all buffered and starts with *head*; `NEED_DATA` while it may
        be such a frame and is not all here (fewer bytes of it than *head*, or its start is
        *head*), so that the reader waits for the rest rather than the frame being decoded in
        steps; else None (another kind, a frame over the cap or of more than *most* bytes, a
        frame part decoded already: `next_message()` decodes it, with its checks and errors).
        The frame stays buffered: `drop_frame()` takes it off once read."""
        if self._broken is not None or self._stepping is not None:
            return None
        buf, pos = self._buf, self._pos
        if len(buf) - pos < _HEADER:
            return NEED_DATA
        size = int.from_bytes(buf[pos : pos + _HEADER], "big")
        if size > self.max_frame or size < len(head) or most is not None and size > most:
            return None
        start = pos + _HEADER
        here = buf[start : start + len(head)]
        if here != head[: len(here)]:
            return None
        if len(here) < len(head) or len(buf) < start + size:
            return NEED_DATA
        return bytes(memoryview(buf)[start : start + size])

    def drop_frame(self) -> None:
        """Take off the frame `whole_frame` returned."""
        size = int.from_bytes(self._buf[self._pos : self._pos + _HEADER], "big")
        self._pos += _HEADER + size

    def _step(self, stepwise: bool) -> Message | _NeedData | _InProgress:
        stepping = self._stepping
        assert stepping is not None
        try:
            while True:
                if next(stepping) is NEED_DATA:
                    return NEED_DATA
                if stepwise:
                    return IN_PROGRESS
        except StopIteration as done:
            self._stepping = None
            self._fed = 0
            message: Message = done.value
            return message
        except (MalformedFrame, UnknownMessage) as exc:
            self._break(exc)
            raise self._fresh_error() from None

    def _steps(self, size: int) -> Generator[_NeedData | None, None, Message]:
        """Decode the frame of *size* bytes whose header was just read, a `STEP_BYTES` piece
        of what has arrived per step (msgpack's decoder resumes where the last piece ended;
        `NEED_DATA` when nothing more has), then build its message (in steps too where the
        kind can, `from_wire_steps`). Bytes handed to the decoder leave the buffer; they
        stay counted as `buffered` until the message is done."""
        limits: dict[str, Any] = (
            {}
            if self.max_items is None
            else {"max_array_len": self.max_items, "max_map_len": self.max_items}
        )
        # Every value takes a byte at least, so a frame of at most `max_values` bytes (every
        # frame the client library sends) cannot hold too many: it is decoded without a hook
        # per list and map (a Python call each), its steps grown by their time instead.
        work: Callable[[], float]
        if size > self.max_values:  # a step that built under one value per 8 bytes grows
            tally, work = _tally(self.max_values)
            limits.update(list_hook=tally, object_hook=tally)
            per_byte = _SPARSE
        else:  # a step that took under 40 ns a byte grows
            work, per_byte = _perf, _STEP_GROWS_BELOW
        decoder = msgpack.Unpacker(
            raw=False,
            timestamp=3,
            ext_hook=_ext_hook,
            strict_map_key=False,
            max_buffer_size=size,
            **limits,
        )
        step = STEP_BYTES
        while True:
            piece = min(step, size - self._fed, len(self._buf) - self._pos)
            if not piece:
                yield NEED_DATA
                continue
            before = work()
            decoder.feed(self._buf[self._pos : self._pos + piece])
            self._pos += piece
            self._fed += piece
            try:
                data = decoder.unpack()
                break
            except msgpack.OutOfData:
                if self._fed >= size:
                    raise MalformedFrame(
                        "frame is not valid msgpack: it ends inside a value"
                    ) from None
            except MalformedFrame:
                raise
            except Exception as exc:  # msgpack raises several unrelated types for bad input
                raise _malformed(exc, self.max_items) from None
            if step < STEP_BYTES_MAX and (work() - before) * per_byte < piece:
                step *= 2
            yield None
        if decoder.tell() != size:
            raise MalformedFrame("frame is not valid msgpack: extra data after the message")
        cls = self._kind(data)
        steps: Callable[[Any], Generator[None, None, Message]] | None = getattr(
            cls, "from_wire_steps", None
        )
        if steps is None:
            return cls.from_wire(data)
        return (yield from steps(data))

    @property
    def buffered(self) -> int:
        """Bytes received and not yet handed out as messages (a partial frame, mostly)."""
        return len(self._buf) - self._pos + self._fed

    def _break(self, exc: ProtocolError) -> None:
        # Keep what the error says, not the error: its traceback (and its __context__'s)
        # would hold this codec's frames, and through them its buffer and whoever owns it,
        # in a reference cycle that only a full garbage collection frees. The buffer goes
        # at once.
        self._broken = type(exc)(*exc.args)
        self._buf = bytearray()
        self._pos = 0
        self._stepping = None
        self._fed = 0

    def _fresh_error(self) -> ProtocolError:
        broken = self._broken
        assert broken is not None
        err = type(broken)(*broken.args)
        code = getattr(broken, "code", None)
        if code is not None:
            try:
                err.code = code
            except AttributeError:
                pass
        return err

    def next_messages(self) -> list[Message]:
        """Every whole message buffered now (possibly none)."""
        out: list[Message] = []
        while True:
            msg = self.next_message()  # a large frame is decoded whole
            if not isinstance(msg, Message):
                return out
            out.append(msg)

    @staticmethod
    def _decode(payload: bytes, max_items: int | None = None) -> Message:
        limits = {} if max_items is None else {"max_array_len": max_items, "max_map_len": max_items}
        try:
            data = msgpack.unpackb(
                payload, raw=False, timestamp=3, ext_hook=_ext_hook, strict_map_key=False, **limits
            )
        except MalformedFrame:
            raise
        except Exception as exc:  # msgpack raises several unrelated types for bad input
            raise _malformed(exc, max_items) from None
        return Connection._kind(data).from_wire(data)

    @staticmethod
    def _kind(data: Any) -> type[Message]:
        if type(data) is not dict:
            raise MalformedFrame("frame must be a msgpack map")
        kind = data.get("kind")
        cls = MESSAGE_KINDS.get(kind) if type(kind) is str else None
        if cls is None:
            raise UnknownMessage(f"unknown message kind {kind!r}")
        return cls

    # -- sending ----------------------------------------------------------------------------

    def send_deliver(self, items: Sequence[Sequence[Any]]) -> bytes:
        """The `Deliver` frame of *items* (``[sub_ids, event]`` each), built from each event's
        `packed_event` rather than packed again: what `send(Deliver(items=...))` makes.
        Raises `UsageError` if it would exceed the cap."""
        packer = self._packer
        parts = [DELIVER_HEAD, packer.pack_array_header(len(items))]
        append = parts.append
        last: Any = None  # the sub_ids packed last: consecutive items mostly share them
        head = b""
        try:
            for sub_ids, event in items:
                if sub_ids is not last and sub_ids != last:
                    head = b"\x92" + packer.pack(sub_ids)  # a 2-element array: [sub_ids, event]
                    last = sub_ids
                append(head)
                data = event.packed
                append(packed_event(event) if data is None else data)
        except (TypeError, ValueError, OverflowError) as exc:
            self._packer = _packer()
            raise UsageError(f"cannot encode 'deliver' message: {exc}") from None
        payload = b"".join(parts)
        if len(payload) > self.max_frame:
            raise UsageError(
                f"'deliver' frame of {len(payload)} bytes is over the cap of {self.max_frame}"
            )
        return len(payload).to_bytes(_HEADER, "big") + payload

    def send_publish(self, seq: int, packed: Sequence[bytes]) -> bytes:
        """The `Publish` frame of events given as their `packed_event` bytes: what
        `send(Publish(seq=seq, events=...))` makes, without packing them again (a publisher's
        outbox keeps its events as bytes). Raises `UsageError` if it would exceed the cap."""
        packer = self._packer
        try:
            head = packer.pack(seq) + _EVENTS_KEY + packer.pack_array_header(len(packed))
        except (TypeError, ValueError, OverflowError) as exc:
            self._packer = _packer()
            raise UsageError(f"cannot encode 'publish' message: {exc}") from None
        payload = b"".join((PUBLISH_HEAD, head, *packed))
        if len(payload) > self.max_frame:
            raise UsageError(
                f"'publish' frame of {len(payload)} bytes is over the cap of {self.max_frame}"
            )
        return len(payload).to_bytes(_HEADER, "big") + payload

    def send(self, message: Message) -> bytes:
        """The frame for *message*. Raises `UsageError` if it would exceed the cap."""
        try:
            payload = self._packer.pack(message.to_wire())
        except (TypeError, ValueError, OverflowError) as exc:
            self._packer = _packer()  # a failed pack may leave the buffer dirty
            raise UsageError(f"cannot encode {message.kind!r} message: {exc}") from None
        if len(payload) > self.max_frame:
            raise UsageError(
                f"{message.kind!r} frame of {len(payload)} bytes is over the cap of "
                f"{self.max_frame}"
            )
        return len(payload).to_bytes(_HEADER, "big") + payload
