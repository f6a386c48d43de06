"""Reading a router's delivery frames in the client: the compiled reader where it is built.

A subscriber's CPU goes mostly to reading delivery frames. `client/_deliver.pyx` reads the
usual one straight from its bytes into the events its subscriptions get, and decodes the
meta map the router stamped on a publish's events once, not once per event. It is used when
it was built from its source as it is now and ``AA_PURE_PYTHON`` is not set
(`aa.mesh.load_pyx`); otherwise, and for any frame it does not read (anything unusual or
wrong), the codec's reference path reads the frame (`Connection.next_message`), with its
checks and errors. `tests/test_compiled_deliveries.py` holds the two to the same events.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from aa.mesh import MAX_ID_LENGTH, Connection, Event, InvalidValue, check_values, load_pyx
from aa.mesh.protocol import DELIVER_HEAD, NEED_DATA, Deliver, unpack

__all__ = ["COMPILED", "DeliveryReader"]

_read: Callable[..., tuple[tuple[tuple[int, ...], Event], ...] | None] | None = getattr(
    load_pyx(__package__ or "aa.client", Path(__file__).resolve().parent, "_deliver"),
    "read",
    None,
)

#: Whether the compiled reader runs in this process.
COMPILED = _read is not None


def _in_model(values: dict[str, Any], depth: int) -> bool:
    """Whether *values* (a map of a frame, at nesting *depth* 0) is in the value model."""
    try:
        check_values(values)
    except InvalidValue:
        return False
    return True


class DeliveryReader:
    """Reads the delivery frames buffered in one connection's codec (`next_deliver`)."""

    __slots__ = ("_codec", "_cache")

    def __init__(self, codec: Connection) -> None:
        self._codec = codec
        #: The last meta map read, as [its bytes, a copy of it] (`_deliver.read`).
        self._cache: list[Any] = [None, None]

    def next_deliver(self) -> object:
        """The next frame's message (a `Deliver`) when it is a delivery the compiled reader
        read (the frame is then taken off the codec's buffer); `NEED_DATA` while a delivery
        frame is not all buffered yet (read whole when it is, not in the codec's steps);
        None when the codec is to read the next frame (no compiled reader, another kind,
        anything unusual)."""
        if _read is None:
            return None
        codec = self._codec
        payload = codec.whole_frame(DELIVER_HEAD)
        if payload is None or payload is NEED_DATA:
            return payload
        assert type(payload) is bytes
        items = _read(
            payload,
            len(DELIVER_HEAD),
            codec.max_values,
            self._cache,
            Event.trusted,
            _in_model,
            unpack,
            MAX_ID_LENGTH,
        )
        if items is None:
            return None
        codec.drop_frame()
        return Deliver(items=items)
