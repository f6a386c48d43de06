"""Reading a router's delivery frames in the client, and handing their events to the
subscriptions: the compiled code where it is built.

A subscriber's CPU goes mostly to reading delivery frames. `client/_deliver.pyx` reads the
usual one straight from its bytes into the events its subscriptions get, and decodes the
meta map the router stamped on a publish's events once, not once per event. It is used when
it was built from its source as it is now and ``AA_PURE_PYTHON`` is not set
(`aa.mesh.load_pyx`); otherwise, and for any frame it does not read (anything unusual or
wrong), the codec's reference path reads the frame (`Connection.next_message`), with its
checks and errors. `tests/test_compiled_deliveries.py` holds the two to the same events.

`hand_over` gives each delivered event to its subscriptions, dropping a second copy of a
live event for a subscription (`delivered_ids`: the pairs delivered lately). Compiled, the
pairs are kept without a tuple per pair (`_deliver.DeliveredIds`), with the same window and
answers as the reference's `SeenIds` of tuples (`tests/test_client_deliveries.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from aa.mesh import MAX_ID_LENGTH, Connection, Event, InvalidValue, SeenIds, check_values, load_pyx
from aa.mesh.protocol import DELIVER_HEAD, NEED_DATA, Deliver, unpack

if TYPE_CHECKING:
    from .subscription import Subscription

__all__ = ["COMPILED", "DeliveryReader", "Delivered", "delivered_ids", "hand_over"]

_compiled = load_pyx(__package__ or "aa.client", Path(__file__).resolve().parent, "_deliver")

_read: Callable[..., tuple[tuple[tuple[int, ...], Event], ...] | None] | None = getattr(
    _compiled, "read", None
)

#: Whether the compiled reader runs in this process.
COMPILED = _read is not None

_hand_over: Callable[..., None] | None = getattr(_compiled, "hand_over", None)
_DeliveredIds: Callable[..., Delivered] | None = getattr(_compiled, "DeliveredIds", None)


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


class Delivered(Protocol):
    """The (sub id, event id) pairs a client delivered lately (`delivered_ids`)."""

    def __len__(self) -> int: ...


def delivered_ids(max_ids: int, max_age: float) -> Delivered:
    """An empty record of delivered pairs for `hand_over`: at most *max_ids* pairs, none kept
    longer than *max_age* seconds (`aa.mesh.SeenIds`'s window). The compiled one where the
    compiled module runs, `SeenIds` of (sub id, event id) tuples where it does not."""
    if _hand_over is not None and _DeliveredIds is not None:
        return _DeliveredIds(max_ids=max_ids, max_age=max_age)
    return SeenIds(max_ids=max_ids, max_age=max_age)


def _hand_over_reference(
    items: Iterable[tuple[Sequence[int], Event]],
    subs: dict[int, Subscription],
    seen: Delivered,
    now: float,
) -> None:
    assert isinstance(seen, SeenIds)  # `delivered_ids` made it so on this path
    fresh = seen.check
    for sub_ids, event in items:
        # A second copy of a live event for a subscription (possible around a fail-over)
        # is dropped; the same event for another subscription is no copy (patterns on
        # two pattern workers, or one in the router and one on a worker, deliver it in
        # two frames). Replayed history is the subscription's own business.
        eid = event.id  # (a script's derived event may have none: never a copy)
        check = eid is not None and not event.meta.get("historical")
        for sid in sub_ids:
            if check and not fresh((sid, eid), now):
                continue
            sub = subs.get(sid)
            if sub is not None:
                sub.deliver(event)


#: Hand a delivery's *items* to the subscriptions in *subs*, each (sub id, event id) pair
#: once as long as *seen* (`delivered_ids`) remembers it, at monotonic time *now*.
hand_over: Callable[
    [Iterable[tuple[Sequence[int], Event]], dict[int, Subscription], Delivered, float], None
] = _hand_over or _hand_over_reference
