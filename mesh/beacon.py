"""Discovery beacons and what discovery reports (pure: no I/O).

A router announces itself on each selected network with a small datagram, the beacon: its id,
its name, its mesh (peer) endpoint, its client endpoint and the protocol version. On the wire::

    b"AaMB" | format (1 byte) | msgpack map {"i": id, "n": name, "p": peer, "c": client, "v":
    protocol}

The magic and the format byte let a receiver recognise, cheaply and for sure, datagrams that
are not beacons (another program on the same port, a scanner) and beacons of a future format;
both are ignored, with a log line, by the caller of `decode_beacon`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

import msgpack

from .endpoints import check_endpoint, format_endpoint, is_unspecified, parse_endpoint
from .errors import InvalidValue, MalformedFrame
from .event import MAX_ID_LENGTH
from .peers import Source
from .protocol import PROTOCOL_VERSION

__all__ = [
    "Beacon",
    "RouterInfo",
    "encode_beacon",
    "decode_beacon",
    "BEACON_MAGIC",
    "BEACON_FORMAT",
    "MAX_BEACON_BYTES",
]

#: First bytes of every beacon ("Aa Mesh Beacon").
BEACON_MAGIC: Final = b"AaMB"
#: Layout version of the bytes after the magic.
BEACON_FORMAT: Final = 1
#: Largest beacon, in bytes: fits one unfragmented datagram on any Ethernet (MTU 1500 less
#: IP and UDP headers is 1472), so a beacon is never lost to fragment reassembly.
MAX_BEACON_BYTES: Final = 1024
#: Longest router name carried, in characters; longer names are cut (names are for people).
_MAX_NAME: Final = 128

Via = Literal["broadcast", "zeroconf", "configured"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Beacon:
    """What a router says about itself on the network.

    >>> b = Beacon(router_id="r1", name="lab", peer="0.0.0.0:7447", client="0.0.0.0:7447")
    >>> decode_beacon(encode_beacon(b)) == b
    True
    """

    router_id: str
    name: str = ""
    #: Where routers dial it, "host:port". An unspecified host (0.0.0.0) means "the address
    #: this beacon came from": the receiver fills it in.
    peer: str
    #: Where clients connect, "host:port" (same convention), or None if nowhere.
    client: str | None = None
    protocol: int = PROTOCOL_VERSION

    def __post_init__(self) -> None:
        if type(self.router_id) is not str or not 0 < len(self.router_id) <= MAX_ID_LENGTH:
            raise InvalidValue(f"router_id must be a str of 1 to {MAX_ID_LENGTH} characters")
        if type(self.name) is not str:
            raise InvalidValue("name must be a str")
        if len(self.name) > _MAX_NAME:
            object.__setattr__(self, "name", self.name[:_MAX_NAME])
        check_endpoint(self.peer, "peer")
        if self.client is not None:
            check_endpoint(self.client, "client")
        if type(self.protocol) is not int or not 0 <= self.protocol < 2**16:
            raise InvalidValue("protocol must be an int from 0 to 65535")


def encode_beacon(beacon: Beacon) -> bytes:
    """The datagram for *beacon*. Raises `InvalidValue` if it would exceed `MAX_BEACON_BYTES`."""
    body = msgpack.packb(
        {
            "i": beacon.router_id,
            "n": beacon.name,
            "p": beacon.peer,
            "c": beacon.client,
            "v": beacon.protocol,
        },
        use_bin_type=True,
    )
    data = BEACON_MAGIC + bytes([BEACON_FORMAT]) + body
    if len(data) > MAX_BEACON_BYTES:
        raise InvalidValue(f"beacon of {len(data)} bytes is over {MAX_BEACON_BYTES}")
    return data


def decode_beacon(data: bytes) -> Beacon:
    """The beacon in datagram *data*; `MalformedFrame` (with the reason) if it is not one."""
    if len(data) > MAX_BEACON_BYTES:
        raise MalformedFrame(f"datagram of {len(data)} bytes is too long for a beacon")
    if not data.startswith(BEACON_MAGIC) or len(data) < len(BEACON_MAGIC) + 1:
        raise MalformedFrame("not a beacon (no magic)")
    fmt = data[len(BEACON_MAGIC)]
    if fmt != BEACON_FORMAT:
        raise MalformedFrame(f"beacon format {fmt} is not understood (we read {BEACON_FORMAT})")
    try:
        body: Any = msgpack.unpackb(data[len(BEACON_MAGIC) + 1 :], raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise MalformedFrame(f"beacon body is not msgpack: {exc}") from None
    if type(body) is not dict:
        raise MalformedFrame("beacon body is not a map")
    router_id: Any = body.get("i")  # wire values, checked by Beacon
    peer: Any = body.get("p")
    try:
        return Beacon(
            router_id=router_id,
            name=body.get("n", ""),
            peer=peer,
            client=body.get("c"),
            protocol=body.get("v", 0),
        )
    except InvalidValue as exc:
        raise MalformedFrame(f"bad beacon: {exc}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class RouterInfo:
    """A router that discovery found: what `Discovery` hands to its `on_found` callback."""

    #: Its mesh endpoint, "host:port", ready to dial (an unspecified host already replaced).
    peer: str
    #: Its id; None for a configured well-known endpoint (learnt from its hello).
    router_id: str | None = None
    name: str | None = None
    #: Its client endpoint, "host:port", if known.
    client: str | None = None
    #: Its protocol version, if known. The router decides what to do with other versions.
    protocol: int | None = None
    #: How it was found.
    via: Via

    @property
    def source(self) -> Source:
        """The `PeerTable` source for this finding."""
        return Source.CONFIGURED if self.via == "configured" else Source.DISCOVERED

    @classmethod
    def from_beacon(cls, beacon: Beacon, *, sender_host: str, via: Via) -> RouterInfo:
        """The info in *beacon*, with unspecified hosts replaced by *sender_host*."""
        return cls(
            peer=_fill(beacon.peer, sender_host),
            router_id=beacon.router_id,
            name=beacon.name or None,
            client=_fill(beacon.client, sender_host) if beacon.client is not None else None,
            protocol=beacon.protocol,
            via=via,
        )


def _fill(endpoint: str, sender_host: str) -> str:
    host, port = parse_endpoint(endpoint)
    return format_endpoint(sender_host, port) if is_unspecified(host) else endpoint
