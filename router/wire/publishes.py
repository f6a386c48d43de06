"""Reading a client's publish frames in the router: the compiled reader where it is built.

Decoding a client's publish is the router's first stage per event. `_publishes.pyx`, beside
this module, reads the usual publish frame straight from its bytes into the checked events,
in one call.
It is used when it was built from its source as it is now and ``AA_PURE_PYTHON`` is not set
(`aa.mesh.load_pyx`); otherwise, and for any frame it does not read (anything unusual or
wrong, or too large to read in one go), the codec's reference path reads the frame
(`Connection.next_message`, in bounded steps), with its checks and errors.
`tests/test_compiled_publishes.py` holds the two to the same events.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from aa.mesh import MAX_ID_LENGTH, Connection, Event, load_pyx
from aa.mesh.protocol import NEED_DATA, PUBLISH_HEAD, Publish

__all__ = ["COMPILED", "MAX_WORK", "PublishReader"]

_compiled = load_pyx(__package__ or "aa.router.wire", Path(__file__).resolve().parent, "_publishes")
_read: Callable[..., tuple[int, tuple[Event, ...]] | None] | None = getattr(_compiled, "read", None)
_new_cache: Callable[[], list[Any]] = getattr(_compiled, "new_cache", list)

#: Stores `Event.packed` past the frozen guard (the slot's own setter).
_set_packed: Callable[[Event, bytes], None] = vars(Event)["packed"].__set__

#: Whether the compiled reader runs in this process.
COMPILED = _read is not None

#: Most list and map items (events, their four fields, values) the compiled reader builds
#: from one frame in one call, about 2 ms of the densest frame: a frame of more goes to the
#: codec's steps. The client library's frames of 1,000 five-value events hold ~15,000.
MAX_WORK: Final = 32 * 1024


class PublishReader:
    """Reads the publish frames buffered in one connection's codec (`next_publish`)."""

    __slots__ = ("_codec", "_cache")

    def __init__(self, codec: Connection) -> None:
        self._codec = codec
        #: The strs of the last event read (`_publishes.read`).
        self._cache = _new_cache()

    def next_publish(self) -> object:
        """The next frame's message (a `Publish`) when the compiled reader read it (the frame
        is then taken off the codec's buffer); `NEED_DATA` while a publish frame of at most
        the codec's `max_values` bytes is not all buffered yet (read whole when it is, not in
        the codec's steps); None when the codec is to read the next frame (no compiled
        reader, another kind, a larger frame, anything unusual)."""
        if _read is None:
            return None
        codec = self._codec
        payload = codec.whole_frame(PUBLISH_HEAD, codec.max_values)
        if payload is None or payload is NEED_DATA:
            return payload
        assert type(payload) is bytes
        max_items = codec.max_items
        got: Any = _read(
            payload,
            len(PUBLISH_HEAD),
            MAX_WORK if max_items is None else max_items,
            MAX_WORK,
            Event.trusted,
            MAX_ID_LENGTH,
            self._cache,
            _set_packed,
        )
        if got is None:
            return None
        codec.drop_frame()
        return Publish(seq=got[0], events=got[1])
